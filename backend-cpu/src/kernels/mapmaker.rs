//! build_noise_weighted: accumulate noise-weighted data into the map `zmap`.
//!
//! Deterministic parallel accumulation, as TOAST's CPU path does it: the
//! sub-pixel axis of the map is split into one range per thread; every task
//! walks all detectors, intervals and samples in order and accumulates only
//! the samples whose sub-pixel falls in its range. Each `zmap` element is
//! therefore updated by one task, in detector → interval → sample order, and
//! the sums are bit-identical to a sequential run for any thread count.

use super::{locate, SubmapDiv};
use crate::arrays::{self, Arg};
use crate::par::{first_fault, SampleFault, SharedMut, TaskResult};
use rayon::prelude::*;
use toast_accel::abi::BuildNoiseWeightedArgs;
use toast_accel::check::BuildNoiseWeighted;
use toast_accel::plugin_support::PluginError;

const K: &str = "build_noise_weighted";

/// # Safety
/// `a` has passed `check_build_noise_weighted` (giving `v`) and its arrays
/// are host memory of the stated lengths.
pub(crate) unsafe fn run(
    v: &BuildNoiseWeighted<'_>,
    a: &BuildNoiseWeightedArgs,
) -> Result<(), PluginError> {
    arrays::check_disjoint(
        K,
        &[Arg::new::<f64>("zmap", a.zmap)],
        &[
            Arg::new::<i64>("global2local", a.global2local),
            Arg::new::<i64>("pixels", a.pixels),
            Arg::new::<f64>("weights", a.weights),
            Arg::new::<f64>("det_data", a.det_data),
            Arg::new::<u8>("det_flags", a.det_flags),
            Arg::new::<u8>("shared_flags", a.shared_flags),
        ],
    )?;
    // SAFETY: host arrays of the validated lengths; `zmap` overlaps nothing.
    let (g2l, pixels, weights, det_data, det_flags, shared_flags, zmap) = unsafe {
        (
            arrays::input::<i64>(K, "global2local", a.global2local)?,
            arrays::input::<i64>(K, "pixels", a.pixels)?,
            arrays::input::<f64>(K, "weights", a.weights)?,
            arrays::input::<f64>(K, "det_data", a.det_data)?,
            arrays::input::<u8>(K, "det_flags", a.det_flags)?,
            arrays::input::<u8>(K, "shared_flags", a.shared_flags)?,
            arrays::output::<f64>(K, "zmap", a.zmap)?,
        )
    };
    // Every pixel the accumulation reads first: a fault leaves zmap
    // untouched.
    let (det_mask, shared_mask) = (a.det_flag_mask, a.shared_flag_mask);
    let flags = super::FlagRule {
        n_samp: v.n_samp,
        det: v
            .use_det_flags
            .then_some((det_flags, v.flag_index, det_mask)),
        shared: v.use_shared_flags.then_some((shared_flags, shared_mask)),
    };
    let div = super::check_pixels(
        K,
        v.n_samp,
        v.intervals,
        v.pixel_index,
        pixels,
        g2l,
        v.n_local_submap as u64,
        v.n_pix_submap,
        &flags,
    )?;
    let job = Job {
        v,
        g2l,
        pixels,
        weights,
        det_data,
        det_flags,
        shared_flags,
        det_mask: a.det_flag_mask,
        shared_mask: a.shared_flag_mask,
        zmap: SharedMut::new(zmap),
        div,
    };
    let nps = v.n_pix_submap as usize;
    let parts = rayon::current_num_threads().clamp(1, nps.max(1));
    let r = (0..parts)
        .into_par_iter()
        .map(|t| {
            let lo = t * nps / parts;
            let hi = (t + 1) * nps / parts;
            match v.nnz {
                1 => job.part::<1>(lo, hi, 1),
                3 => job.part::<3>(lo, hi, 3),
                n => job.part::<0>(lo, hi, n),
            }
        })
        .reduce(|| Ok(()), first_fault);
    r.map_err(|f| super::fault_error(K, f))
}

struct Job<'a> {
    v: &'a BuildNoiseWeighted<'a>,
    g2l: &'a [i64],
    pixels: &'a [i64],
    weights: &'a [f64],
    det_data: &'a [f64],
    det_flags: &'a [u8],
    shared_flags: &'a [u8],
    det_mask: u8,
    shared_mask: u8,
    zmap: SharedMut<f64>,
    div: SubmapDiv,
}

impl Job<'_> {
    /// Accumulate the samples whose sub-pixel lies in `[lo, hi)`. The
    /// pixels were checked before (`check_pixels`), so no task faults.
    #[inline(always)]
    fn part<const N: usize>(&self, lo: usize, hi: usize, nnz: usize) -> TaskResult {
        let nnz = if N > 0 { N } else { nnz };
        let v = self.v;
        let n_samp = v.n_samp;
        let nps = v.n_pix_submap as usize;
        for det in 0..v.n_det {
            let prow = v.pixel_index[det] as usize * n_samp;
            let wrow = v.weight_index[det] as usize * n_samp;
            let drow = v.data_index[det] as usize * n_samp;
            let frow = if v.use_det_flags {
                Some(v.flag_index[det] as usize * n_samp)
            } else {
                None
            };
            let scale = v.det_scale[det];
            for (view, iv) in v.intervals.iter().enumerate() {
                let (first, last) = (iv.first as usize, iv.last as usize);
                let pix = &self.pixels[prow + first..prow + last];
                let data = &self.det_data[drow + first..drow + last];
                let wts = &self.weights[nnz * (wrow + first)..nnz * (wrow + last)];
                let dflags = frow.map(|f| &self.det_flags[f + first..f + last]);
                let sflags = v.use_shared_flags.then(|| &self.shared_flags[first..last]);
                for (k, ((&p, &d), w)) in
                    pix.iter().zip(data).zip(wts.chunks_exact(nnz)).enumerate()
                {
                    if let Some(df) = dflags {
                        if df[k] & self.det_mask != 0 {
                            continue;
                        }
                    }
                    if let Some(sf) = sflags {
                        if sf[k] & self.shared_mask != 0 {
                            continue;
                        }
                    }
                    if p < 0 {
                        continue;
                    }
                    let (l, sub) = locate(&self.div, self.g2l, p)
                        .map_err(|m| SampleFault::new(det, view, first + k, m))?;
                    if sub < lo || sub >= hi {
                        continue;
                    }
                    let zoff = nnz * (l * nps + sub);
                    // SAFETY: slice_mut checks the bounds; only the task owning
                    // sub-pixels [lo, hi) touches these elements.
                    let z = unsafe { self.zmap.slice_mut(zoff, nnz) };
                    let scaled = d * scale;
                    for i in 0..nnz {
                        z[i] += scaled * w[i];
                    }
                }
            }
        }
        Ok(())
    }
}
