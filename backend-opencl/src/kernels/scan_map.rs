//! scan_map: `det_data (+= | -= | *=) data_scale * sum_k weights[k] * map[pixel, k]`,
//! one device kernel per map dtype.

use super::{check_key_range, conflicts, len, pixel_fault, KArg::*, KernelLaunch};
use crate::context::OpenClContext;
use toast_accel::abi::{self, ScanMapArgs};
use toast_accel::check::{self, ScanMap};
use toast_accel::device_source::scan_map_kernel;
use toast_accel::plugin_support::PluginError;

const K: &str = "scan_map";

/// The host copy of `global2local`, checked.
pub(crate) fn global2local(
    call: &KernelLaunch<'_>,
    kernel: &'static str,
    mem: opencl3::types::cl_mem,
    n: usize,
    n_local_submap: usize,
) -> Result<Vec<i64>, PluginError> {
    let mut bytes = vec![0u8; 8 * n];
    if n > 0 {
        call.read(mem, 0, &mut bytes)?;
    }
    let g2l: Vec<i64> = bytes
        .chunks_exact(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    check::global2local(kernel, &g2l, n_local_submap as u64)?;
    Ok(g2l)
}

/// The pixel at (row, sample) of a pixels buffer.
pub(crate) fn pixel_at(
    call: &KernelLaunch<'_>,
    mem: opencl3::types::cl_mem,
    index: usize,
) -> Result<i64, PluginError> {
    let mut b = [0u8; 8];
    call.read(mem, 8 * index, &mut b)?;
    Ok(i64::from_ne_bytes(b))
}

pub(crate) fn run(c: &OpenClContext, v: &ScanMap<'_>, a: &ScanMapArgs) -> Result<(), PluginError> {
    check_key_range(K, v.n_det, v.n_samp)?;
    let name = scan_map_kernel(a.map_dtype)
        .ok_or_else(|| PluginError::invalid(format!("{K}: unknown map dtype {}", a.map_dtype)))?;
    let mut call = KernelLaunch::new(c, K);
    let data = call.array::<f64>("det_data", a.det_data, true)?;
    let g2l_mem = call.array::<i64>("global2local", a.global2local, false)?;
    let map = match a.map_dtype {
        abi::DTYPE_F64 | abi::DTYPE_I64 => call.array::<u64>("mapdata", a.mapdata, false)?,
        _ => call.array::<u32>("mapdata", a.mapdata, false)?,
    };
    let pixels = call.array::<i64>("pixels", a.pixels, false)?;
    let weights = call.array::<f64>("weights", a.weights, false)?;
    call.check_disjoint()?;
    let g2l = global2local(&call, K, g2l_mem, v.n_global_submap, v.n_local_submap)?;
    let ivs = call.intervals(v.intervals)?;
    let pi = call.small("pixel_index", v.pixel_index)?;
    let wi = call.small("weight_index", v.weight_index)?;
    let di = call.small("data_index", v.data_index)?;
    let err = call.error_buffer()?;
    let mode = if a.should_subtract != 0 {
        1
    } else if a.should_scale != 0 {
        2
    } else {
        0
    };
    let args = [
        I64(v.n_samp as i64),
        Mem(ivs),
        I64(v.nnz as i64),
        Mem(pi),
        Mem(wi),
        Mem(di),
        Mem(g2l_mem),
        I64(v.n_global_submap as i64),
        I64(v.n_pix_submap),
        Mem(map),
        Mem(pixels),
        Mem(weights),
        Mem(data),
        F64(a.data_scale),
        I32(a.should_zero as i32),
        I32(mode),
        Mem(err),
    ];
    let serial = conflicts(v.data_index, v.intervals);
    call.samples(name, v.n_det, v.intervals, serial, &args, len)?;
    if let Some((det, s)) = call.finish()? {
        let pix = pixel_at(&call, pixels, v.pixel_index[det] as usize * v.n_samp + s)?;
        return Err(call.fault(v.intervals, det, s, &pixel_fault(pix, &g2l, v.n_pix_submap)));
    }
    Ok(())
}
