//! build_noise_weighted: accumulate noise-weighted data into the map `zmap`.
//!
//! Every (detector, interval, sample) thread adds its contribution to the
//! `zmap` elements of its pixel with an atomic add (a compare-and-swap loop
//! on OpenCL), so the summation order of each element, and so the last bits
//! of the sums, depend on scheduling: results agree with the CPU backend's
//! detector -> interval -> sample order to rounding, not bit for bit.

use super::scan_map::{global2local, pixel_at};
use super::{check_key_range, len, pixel_fault, KArg::*, KernelLaunch};
use crate::context::OpenClContext;
use toast_accel::abi::BuildNoiseWeightedArgs;
use toast_accel::check::BuildNoiseWeighted;
use toast_accel::plugin_support::PluginError;

const K: &str = "build_noise_weighted";

pub(crate) fn run(
    c: &OpenClContext,
    v: &BuildNoiseWeighted<'_>,
    a: &BuildNoiseWeightedArgs,
) -> Result<(), PluginError> {
    check_key_range(K, v.n_det, v.n_samp)?;
    let mut call = KernelLaunch::new(c, K);
    let zmap = call.array::<f64>("zmap", a.zmap, true)?;
    let g2l_mem = call.array::<i64>("global2local", a.global2local, false)?;
    let pixels = call.array::<i64>("pixels", a.pixels, false)?;
    let weights = call.array::<f64>("weights", a.weights, false)?;
    let data = call.array::<f64>("det_data", a.det_data, false)?;
    let det_flags = call.array::<u8>("det_flags", a.det_flags, false)?;
    let shared_flags = call.array::<u8>("shared_flags", a.shared_flags, false)?;
    call.check_disjoint()?;
    let g2l = global2local(&call, K, g2l_mem, v.n_global_submap, v.n_local_submap)?;
    let ivs = call.intervals(v.intervals)?;
    let pi = call.small("pixel_index", v.pixel_index)?;
    let wi = call.small("weight_index", v.weight_index)?;
    let di = call.small("data_index", v.data_index)?;
    let fi = call.small("flag_index", v.flag_index)?;
    let scale = call.small("det_scale", v.det_scale)?;
    let err = call.error_buffer()?;
    let args = [
        I64(v.n_samp as i64),
        Mem(ivs),
        I64(v.nnz as i64),
        Mem(pi),
        Mem(wi),
        Mem(di),
        Mem(fi),
        Mem(scale),
        Mem(g2l_mem),
        I64(v.n_global_submap as i64),
        I64(v.n_pix_submap),
        Mem(pixels),
        Mem(weights),
        Mem(data),
        Mem(det_flags),
        I32(v.use_det_flags as i32),
        I32(a.det_flag_mask as i32),
        Mem(shared_flags),
        I32(v.use_shared_flags as i32),
        I32(a.shared_flag_mask as i32),
        Mem(zmap),
        Mem(err),
    ];
    // Atomic accumulation: no two grid points conflict, one launch.
    call.samples(
        "toast_build_noise_weighted",
        v.n_det,
        v.intervals,
        false,
        &args,
        len,
    )?;
    if let Some((det, s)) = call.finish()? {
        let pix = pixel_at(&call, pixels, v.pixel_index[det] as usize * v.n_samp + s)?;
        return Err(call.fault(v.intervals, det, s, &pixel_fault(pix, &g2l, v.n_pix_submap)));
    }
    Ok(())
}
