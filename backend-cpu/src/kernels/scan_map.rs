//! scan_map: `det_data (+= | -= | *=) data_scale * sum_k weights[k] * map[pixel, k]`.

use super::mapmaker_utils::prefetch;
use super::{locate, SubmapDiv};
use crate::arrays::{self, Arg};
use crate::par::{for_each_chunk, SampleFault, SharedMut, TaskResult};
use toast_accel::abi::{self, ScanMapArgs};
use toast_accel::check::ScanMap;
use toast_accel::plugin_support::PluginError;

const K: &str = "scan_map";

/// How many samples ahead the scan asks for a map value's cache line.
const MAP_PREFETCH_AHEAD: usize = 16;

/// A map element type, widened to f64 as C's usual conversions do.
trait MapValue: Copy + Send + Sync {
    fn f64(self) -> f64;
}
impl MapValue for f64 {
    #[inline(always)]
    fn f64(self) -> f64 {
        self
    }
}
impl MapValue for f32 {
    #[inline(always)]
    fn f64(self) -> f64 {
        self as f64
    }
}
impl MapValue for i64 {
    #[inline(always)]
    fn f64(self) -> f64 {
        self as f64
    }
}
impl MapValue for i32 {
    #[inline(always)]
    fn f64(self) -> f64 {
        self as f64
    }
}

#[derive(Clone, Copy)]
enum Mode {
    Add,
    Subtract,
    Scale,
}

/// # Safety
/// `a` has passed `check_scan_map` (giving `v`) and its arrays are host
/// memory of the stated lengths.
pub(crate) unsafe fn run(v: &ScanMap<'_>, a: &ScanMapArgs) -> Result<(), PluginError> {
    match a.map_dtype {
        // SAFETY: forwarded contract; the dtype selects the element type.
        abi::DTYPE_F64 => unsafe { run_t::<f64>(v, a) },
        // SAFETY: forwarded contract; map_dtype is DTYPE_F32, so the map holds f32s.
        abi::DTYPE_F32 => unsafe { run_t::<f32>(v, a) },
        // SAFETY: forwarded contract; map_dtype is DTYPE_I64, so the map holds i64s.
        abi::DTYPE_I64 => unsafe { run_t::<i64>(v, a) },
        // SAFETY: forwarded contract; map_dtype is DTYPE_I32, so the map holds i32s.
        abi::DTYPE_I32 => unsafe { run_t::<i32>(v, a) },
        d => Err(PluginError::invalid(format!("{K}: unknown map dtype {d}"))),
    }
}

/// # Safety
/// As [`run`], with `T` the map's element type.
unsafe fn run_t<T: MapValue>(v: &ScanMap<'_>, a: &ScanMapArgs) -> Result<(), PluginError> {
    arrays::check_disjoint(
        K,
        &[Arg::new::<f64>("det_data", a.det_data)],
        &[
            Arg::new::<i64>("global2local", a.global2local),
            Arg::new::<T>("mapdata", a.mapdata),
            Arg::new::<i64>("pixels", a.pixels),
            Arg::new::<f64>("weights", a.weights),
        ],
    )?;
    // SAFETY: host arrays of the validated lengths; `det_data` overlaps nothing.
    let (g2l, map, pixels, weights, det_data) = unsafe {
        (
            arrays::input::<i64>(K, "global2local", a.global2local)?,
            arrays::input::<T>(K, "mapdata", a.mapdata)?,
            arrays::input::<i64>(K, "pixels", a.pixels)?,
            arrays::input::<f64>(K, "weights", a.weights)?,
            arrays::output::<f64>(K, "det_data", a.det_data)?,
        )
    };
    // Every pixel first: a fault leaves det_data untouched.
    let none = super::FlagRule::NONE;
    let div = super::check_pixels(
        K,
        v.n_samp,
        v.intervals,
        v.pixel_index,
        pixels,
        g2l,
        v.n_local_submap as u64,
        v.n_pix_submap,
        &none,
    )?;
    let det_data = SharedMut::new(det_data);
    let mode = if a.should_subtract != 0 {
        Mode::Subtract
    } else if a.should_scale != 0 {
        Mode::Scale
    } else {
        Mode::Add
    };
    let job = Job {
        v,
        g2l,
        map,
        pixels,
        weights,
        det_data,
        div,
        scale: a.data_scale,
        zero: a.should_zero != 0,
        mode,
    };
    let r = match v.nnz {
        1 => for_each_chunk(v.n_samp, v.intervals, |segs| job.chunk::<1>(segs, 1)),
        3 => for_each_chunk(v.n_samp, v.intervals, |segs| job.chunk::<3>(segs, 3)),
        n => for_each_chunk(v.n_samp, v.intervals, |segs| job.chunk::<0>(segs, n)),
    };
    r.map_err(|f| super::fault_error(K, f))
}

struct Job<'a, T> {
    v: &'a ScanMap<'a>,
    g2l: &'a [i64],
    map: &'a [T],
    pixels: &'a [i64],
    weights: &'a [f64],
    det_data: SharedMut<f64>,
    div: SubmapDiv,
    scale: f64,
    zero: bool,
    mode: Mode,
}

impl<T: MapValue> Job<'_, T> {
    /// One task. `N` is `nnz` when known at compile time (1 or 3), else 0
    /// and `nnz` is used.
    #[inline(always)]
    fn chunk<const N: usize>(&self, segs: &[crate::par::Seg], nnz: usize) -> TaskResult {
        let nnz = if N > 0 { N } else { nnz };
        let v = self.v;
        let n_samp = v.n_samp;
        let nps = v.n_pix_submap as usize;
        for det in 0..v.n_det {
            let prow = v.pixel_index[det] as usize;
            let wrow = v.weight_index[det] as usize;
            let drow = v.data_index[det] as usize;
            for seg in segs {
                let pix = &self.pixels[prow * n_samp + seg.first..prow * n_samp + seg.last];
                let wts = &self.weights
                    [nnz * (wrow * n_samp + seg.first)..nnz * (wrow * n_samp + seg.last)];
                // SAFETY: this task owns samples [seg.first, seg.last) of every row.
                let data = unsafe {
                    self.det_data
                        .slice_mut(drow * n_samp + seg.first, seg.len())
                };
                for (k, ((d, &p), w)) in data
                    .iter_mut()
                    .zip(pix)
                    .zip(wts.chunks_exact(nnz))
                    .enumerate()
                {
                    // The map value a few samples ahead, asked for now (the
                    // gather's latency; a prefetch changes no result).
                    if let Some(&pa) = pix.get(k + MAP_PREFETCH_AHEAD) {
                        if pa >= 0 {
                            let (g, sub) = self.div.split(pa);
                            if let Some(&l) = self.g2l.get(g as usize) {
                                let off = nnz * (l as usize * nps + sub as usize);
                                prefetch(self.map.as_ptr().wrapping_add(off));
                            }
                        }
                    }
                    if self.zero {
                        *d = 0.0;
                    }
                    if p < 0 {
                        continue;
                    }
                    let (l, sub) = locate(&self.div, self.g2l, p)
                        .map_err(|m| SampleFault::new(det, seg.view, seg.first + k, m))?;
                    let off = nnz * (l * nps + sub);
                    let m = &self.map[off..off + nnz];
                    let mut val = 0.0;
                    for i in 0..nnz {
                        val += w[i] * m[i].f64();
                    }
                    val *= self.scale;
                    match self.mode {
                        Mode::Subtract => *d -= val,
                        Mode::Scale => *d *= val,
                        Mode::Add => *d += val,
                    }
                }
            }
        }
        Ok(())
    }
}
