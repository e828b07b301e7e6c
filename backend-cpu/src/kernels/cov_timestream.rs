//! cov_accum_timestream: the hit map and the packed inverse covariance
//! accumulated from the timestream's pointing (TOAST's `BuildHitMap` and
//! `BuildInverseCovariance`; toast-rs's own kernel, ABI minor 5).
//!
//! For every detector, interval and sample, in that order, that its
//! detector and shared flags keep and whose pixel is `>= 0`: one hit, and
//! `w[k] * (w[j] * det_scale)` added to the packed element `(j, k)`, `j <= k`
//! row by row (the operations of TOAST's `cov_accum_diag_invnpp`). A pixel
//! outside the local submaps is a fault naming the sample.
//!
//! Deterministic parallel accumulation, as `build_noise_weighted`
//! (`mapmaker.rs`): the sub-pixel axis is split into one range per thread;
//! every task walks all detectors, intervals and samples in order and
//! accumulates only the samples whose sub-pixel lies in its range. Each map
//! element is updated by one task in detector → interval → sample order,
//! so the sums are those of one sequential pass for any thread count (the
//! bits of the host loops the map-maker had before this kernel).

use super::mapmaker_utils::upper_products;
use super::{locate, SubmapDiv};
use crate::arrays::{self, Arg};
use crate::par::{first_fault, SampleFault, SharedMut, TaskResult};
use rayon::prelude::*;
use toast_accel::abi::CovAccumTimestreamArgs;
use toast_accel::check::CovAccumTimestream;
use toast_accel::plugin_support::PluginError;

const K: &str = "cov_accum_timestream";

/// # Safety
/// `a` has passed `check_cov_accum_timestream` (giving `v`) and its arrays
/// are host memory of the stated lengths.
pub(crate) unsafe fn run(
    v: &CovAccumTimestream<'_>,
    a: &CovAccumTimestreamArgs,
) -> Result<(), PluginError> {
    arrays::check_disjoint(
        K,
        &[
            Arg::new::<i64>("hits", a.hits),
            Arg::new::<f64>("invnpp", a.invnpp),
        ],
        &[
            Arg::new::<i64>("global2local", a.global2local),
            Arg::new::<i64>("pixels", a.pixels),
            Arg::new::<f64>("weights", a.weights),
            Arg::new::<u8>("det_flags", a.det_flags),
            Arg::new::<u8>("shared_flags", a.shared_flags),
        ],
    )?;
    // SAFETY: host arrays of the validated lengths; the outputs overlap
    // nothing (checked above).
    let (g2l, pixels, weights, det_flags, shared_flags, hits, invnpp) = unsafe {
        (
            arrays::input::<i64>(K, "global2local", a.global2local)?,
            arrays::input::<i64>(K, "pixels", a.pixels)?,
            arrays::input::<f64>(K, "weights", a.weights)?,
            arrays::input::<u8>(K, "det_flags", a.det_flags)?,
            arrays::input::<u8>(K, "shared_flags", a.shared_flags)?,
            arrays::output::<i64>(K, "hits", a.hits)?,
            arrays::output::<f64>(K, "invnpp", a.invnpp)?,
        )
    };
    // Every pixel the accumulation reads first: a fault leaves hits and
    // invnpp untouched.
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
        det_flags,
        shared_flags,
        det_mask,
        shared_mask,
        hits: SharedMut::new(hits),
        invnpp: SharedMut::new(invnpp),
        div,
    };
    let nps = v.n_pix_submap as usize;
    let parts = rayon::current_num_threads().clamp(1, nps.max(1));
    let r = (0..parts)
        .into_par_iter()
        .map(|t| {
            let lo = t * nps / parts;
            let hi = (t + 1) * nps / parts;
            match (v.use_invnpp, v.nnz) {
                (false, _) => job.part::<0, 0>(lo, hi),
                (true, 1) => job.part::<1, 1>(lo, hi),
                (true, 3) => job.part::<3, 6>(lo, hi),
                (true, _) => job.part::<0, 0>(lo, hi),
            }
        })
        .reduce(|| Ok(()), first_fault);
    r.map_err(|f| super::fault_error(K, f))
}

struct Job<'a> {
    v: &'a CovAccumTimestream<'a>,
    g2l: &'a [i64],
    pixels: &'a [i64],
    weights: &'a [f64],
    det_flags: &'a [u8],
    shared_flags: &'a [u8],
    det_mask: u8,
    shared_mask: u8,
    hits: SharedMut<i64>,
    invnpp: SharedMut<f64>,
    div: SubmapDiv,
}

impl Job<'_> {
    /// Accumulate the samples whose sub-pixel lies in `[lo, hi)`, with
    /// `NNZ` and `BLOCK` the weights per sample and the packed block when
    /// known at compile time (0: the call's). The pixels were checked
    /// before (`check_pixels`), so no task faults.
    #[inline(always)]
    fn part<const NNZ: usize, const BLOCK: usize>(&self, lo: usize, hi: usize) -> TaskResult {
        let v = self.v;
        let nnz = if NNZ > 0 { NNZ } else { v.nnz };
        let block = if BLOCK > 0 { BLOCK } else { v.block };
        let n_samp = v.n_samp;
        let nps = v.n_pix_submap as usize;
        for det in 0..v.n_det {
            let prow = v.pixel_index[det] as usize * n_samp;
            let frow = v.use_det_flags.then(|| v.flag_index[det] as usize * n_samp);
            let (wrow, scale) = if v.use_invnpp {
                (v.weight_index[det] as usize * n_samp, v.det_scale[det])
            } else {
                (0, 0.0)
            };
            for (view, iv) in v.intervals.iter().enumerate() {
                let (first, last) = (iv.first as usize, iv.last as usize);
                let pix = &self.pixels[prow + first..prow + last];
                let dflags = frow.map(|f| &self.det_flags[f + first..f + last]);
                let sflags = v.use_shared_flags.then(|| &self.shared_flags[first..last]);
                for (k, &p) in pix.iter().enumerate() {
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
                    let px = l * nps + sub;
                    if v.use_hits {
                        // SAFETY: slice_mut checks the bounds; only the task
                        // owning sub-pixels [lo, hi) touches this element.
                        unsafe { self.hits.slice_mut(px, 1)[0] += 1 };
                    }
                    if v.use_invnpp {
                        let s = wrow + first + k;
                        let w = &self.weights[s * nnz..(s + 1) * nnz];
                        // SAFETY: as above, for the pixel's packed block.
                        let cov = unsafe { self.invnpp.slice_mut(px * block, block) };
                        upper_products(w, scale, cov);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_arrays::{arr, arr_mut};
    use toast_accel::abi::{Array, SampleRange, SampleRanges};

    /// The arguments, sent into a test pool's closure.
    struct Sent(CovAccumTimestreamArgs);
    // SAFETY: the pointers are the test's locals, which outlive the pool
    // call that uses them (`install` blocks until it returns).
    unsafe impl Send for Sent {}

    /// Validate and run `a` on `pool`.
    fn run_on(pool: &rayon::ThreadPool, a: CovAccumTimestreamArgs) {
        let sent = Sent(a);
        pool.install(move || {
            let a = sent;
            // SAFETY: every array is a live local of the caller of the stated length.
            unsafe {
                let v = toast_accel::check::check_cov_accum_timestream(&a.0).unwrap();
                run(&v, &a.0).unwrap();
            }
        });
    }

    /// The host loops this kernel replaced: detector by detector, sample by
    /// sample, `(scale * w[j]) * w[k]`.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        pixels: &[i64],
        weights: &[f64],
        cut: &[bool],
        scale: &[f64],
        g2l: &[i64],
        nps: usize,
        n_samp: usize,
        hits: &mut [i64],
        inv: &mut [f64],
    ) {
        for (d, &sc) in scale.iter().enumerate() {
            for s in 0..n_samp {
                let p = pixels[d * n_samp + s];
                if p < 0 || cut[d * n_samp + s] {
                    continue;
                }
                let l = g2l[p as usize / nps] as usize;
                let px = l * nps + p as usize % nps;
                hits[px] += 1;
                let w = &weights[(d * n_samp + s) * 3..][..3];
                let mut off = 0;
                for j in 0..3 {
                    for k in j..3 {
                        inv[px * 6 + off] += sc * w[j] * w[k];
                        off += 1;
                    }
                }
            }
        }
    }

    #[test]
    fn matches_the_sequential_host_loops_bit_for_bit() {
        let (n_det, n_samp, nps) = (3usize, 4000usize, 16usize);
        let g2l = [1i64, -1, 0, 2];
        let mut seed = 12345u64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let pixels: Vec<i64> = (0..n_det * n_samp)
            .map(|_| {
                if rnd() % 8 == 0 {
                    -1
                } else {
                    // Submaps 0, 2 and 3 are local (submap 1 is not).
                    [0i64, 2, 3][(rnd() % 3) as usize] * 16 + (rnd() % 16) as i64
                }
            })
            .collect();
        let weights: Vec<f64> = (0..n_det * n_samp * 3)
            .map(|_| (rnd() % 10_000) as f64 / 3333.0 - 1.1)
            .collect();
        let det_flags: Vec<u8> = (0..n_det * n_samp)
            .map(|_| (rnd() % 7 == 0) as u8 * 3)
            .collect();
        let shared: Vec<u8> = (0..n_samp).map(|_| (rnd() % 11 == 0) as u8 * 2).collect();
        let scale = [0.5, 1.75, 3.1];
        let cut: Vec<bool> = (0..n_det * n_samp)
            .map(|i| det_flags[i] & 1 != 0 || shared[i % n_samp] & 2 != 0)
            .collect();
        let mut want_h = vec![0i64; 3 * nps];
        let mut want_i = vec![0f64; 3 * nps * 6];
        let mut g = want_i.clone();
        g.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = i as f64 * 0.25);
        want_i.copy_from_slice(&g);
        reference(
            &pixels,
            &weights,
            &cut,
            &scale,
            &g2l,
            nps,
            n_samp,
            &mut want_h,
            &mut want_i,
        );
        let idx = [0i32, 1, 2];
        let iv = [SampleRange {
            first: 0,
            last: n_samp as i64,
        }];
        for threads in [1, 2, 3] {
            let mut hits = vec![0i64; 3 * nps];
            let mut inv = g.clone();
            let a = CovAccumTimestreamArgs {
                n_det: 3,
                n_samp: n_samp as u64,
                nnz: 3,
                pixel_index: idx.as_ptr(),
                weight_index: idx.as_ptr(),
                flag_index: idx.as_ptr(),
                det_scale: scale.as_ptr(),
                intervals: SampleRanges {
                    ptr: iv.as_ptr(),
                    len: 1,
                },
                global2local: arr(&g2l),
                n_pix_submap: nps as i64,
                pixels: arr(&pixels),
                weights: arr(&weights),
                det_flags: arr(&det_flags),
                shared_flags: arr(&shared),
                hits: arr_mut(&mut hits),
                invnpp: arr_mut(&mut inv),
                det_flag_mask: 1,
                shared_flag_mask: 2,
                reserved: [0; 6],
            };
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            run_on(&pool, a);
            assert_eq!(hits, want_h, "{threads} threads");
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&inv), bits(&want_i), "{threads} threads");
            // Hits alone: the same hits, no weights read.
            let mut hits2 = vec![0i64; 3 * nps];
            let b = CovAccumTimestreamArgs {
                nnz: 1,
                weights: Array::ABSENT,
                invnpp: Array::ABSENT,
                hits: arr_mut(&mut hits2),
                weight_index: std::ptr::null(),
                det_scale: std::ptr::null(),
                ..a
            };
            run_on(&pool, b);
            assert_eq!(hits2, want_h);
        }
    }

    #[test]
    fn a_pixel_outside_the_local_submaps_is_a_fault_naming_the_sample() {
        let g2l = [0i64, -1];
        let pixels = [0i64, 1, 5, 2];
        let mut hits = vec![0i64; 4];
        let idx = [0i32];
        let iv = [SampleRange { first: 0, last: 4 }];
        let a = CovAccumTimestreamArgs {
            n_det: 1,
            n_samp: 4,
            nnz: 1,
            pixel_index: idx.as_ptr(),
            weight_index: std::ptr::null(),
            flag_index: std::ptr::null(),
            det_scale: std::ptr::null(),
            intervals: SampleRanges {
                ptr: iv.as_ptr(),
                len: 1,
            },
            global2local: arr(&g2l),
            n_pix_submap: 4,
            pixels: arr(&pixels),
            weights: Array::ABSENT,
            det_flags: Array::ABSENT,
            shared_flags: Array::ABSENT,
            hits: arr_mut(&mut hits),
            invnpp: Array::ABSENT,
            det_flag_mask: 0,
            shared_flag_mask: 0,
            reserved: [0; 6],
        };
        // SAFETY: every array is a live local of the stated length.
        let e = unsafe {
            let v = toast_accel::check::check_cov_accum_timestream(&a).unwrap();
            run(&v, &a).unwrap_err()
        };
        let msg = format!("{e:?}");
        assert!(
            msg.contains("sample 2") && msg.contains("not local"),
            "{msg}"
        );
        // Samples 0 and 1 are not counted: a fault leaves the hits as
        // they were.
        assert_eq!(hits, vec![0i64; 4]);
    }
}
