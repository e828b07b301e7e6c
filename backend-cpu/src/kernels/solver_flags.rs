//! solver_flags: the destriping solver's sample flags (TOAST's
//! `SolveAmplitudes` solver flags and `ScanMask`; toast-rs's own kernel,
//! ABI minor 6), OR-ed into a u8 field, with the view's cut and total
//! samples counted.
//!
//! Outside every interval (the validator's `gaps`) a sample gets `cut_bit`;
//! inside each interval it gets `cut_bit` where its detector or shared
//! flags have a bit of their mask, and `mask_bit` where its pixel lies in a
//! local submap and is set in the pixel mask. Integer work, parallel over
//! detectors (each owns its output row, distinct by validation): the same
//! bytes for any thread count. A byte is written only when it changes, so
//! the pages of a fresh all-zero field that nothing flags are never
//! touched (the host loops this kernel replaces did the same).

use super::SubmapDiv;
use crate::arrays::{self, Arg};
use crate::par::{SampleFault, SharedMut};
use rayon::prelude::*;
use toast_accel::abi::SolverFlagsArgs;
use toast_accel::check::{self, SolverFlags};
use toast_accel::plugin_support::PluginError;

const K: &str = "solver_flags";

/// # Safety
/// `a` has passed `check_solver_flags` (giving `v`) and its arrays are host
/// memory of the stated lengths.
pub(crate) unsafe fn run(v: &SolverFlags<'_>, a: &SolverFlagsArgs) -> Result<(), PluginError> {
    arrays::check_disjoint(
        K,
        &[
            Arg::new::<u8>("flags", a.flags),
            Arg::new::<i64>("counts", a.counts),
        ],
        &[
            Arg::new::<i64>("global2local", a.global2local),
            Arg::new::<u8>("det_flags", a.det_flags),
            Arg::new::<u8>("shared_flags", a.shared_flags),
            Arg::new::<i64>("pixels", a.pixels),
            Arg::new::<u8>("pixel_mask", a.pixel_mask),
        ],
    )?;
    // SAFETY: host arrays of the validated lengths; the outputs overlap
    // nothing (checked above).
    let (g2l, det_flags, shared_flags, pixels, mask, flags, counts) = unsafe {
        (
            arrays::input::<i64>(K, "global2local", a.global2local)?,
            arrays::input::<u8>(K, "det_flags", a.det_flags)?,
            arrays::input::<u8>(K, "shared_flags", a.shared_flags)?,
            arrays::input::<i64>(K, "pixels", a.pixels)?,
            arrays::input::<u8>(K, "pixel_mask", a.pixel_mask)?,
            arrays::output::<u8>(K, "flags", a.flags)?,
            arrays::output::<i64>(K, "counts", a.counts)?,
        )
    };
    if v.use_mask {
        check::global2local(K, g2l, v.n_local_submap as u64)?;
    }
    let n_samp = v.n_samp;
    let nps = v.n_pix_submap;
    let div = (v.use_mask && nps > 0).then(|| SubmapDiv::new(nps));
    let out = SharedMut::new(flags);
    let (cut_bit, mask_bit) = (a.cut_bit, a.mask_bit);
    let (det_mask, shared_mask) = (a.det_flag_mask, a.shared_flag_mask);
    let per_det = |det: usize| -> Result<(i64, i64), SampleFault> {
        let orow = v.out_index[det] as usize * n_samp;
        // SAFETY: each detector owns its row (out_index distinct, checked
        // by the validator), within the validated length.
        let row = unsafe { out.slice_mut(orow, n_samp) };
        let set = |f: &mut u8, bits: u8| {
            if *f | bits != *f {
                *f |= bits;
            }
        };
        if cut_bit != 0 {
            for g in &v.gaps {
                for f in &mut row[g.first as usize..g.last as usize] {
                    set(f, cut_bit);
                }
            }
        }
        let frow = v.use_det_flags.then(|| v.flag_index[det] as usize * n_samp);
        let prow = v.use_mask.then(|| v.pixel_index[det] as usize * n_samp);
        let (mut cut, mut total) = (0i64, 0i64);
        for (view, iv) in v.intervals.iter().enumerate() {
            for s in iv.first as usize..iv.last as usize {
                let mut bits = 0u8;
                let det_cut = frow.is_some_and(|f| det_flags[f + s] & det_mask != 0);
                let shared_cut = v.use_shared_flags && shared_flags[s] & shared_mask != 0;
                if det_cut || shared_cut {
                    bits |= cut_bit;
                }
                if let (Some(p0), Some(div)) = (prow, div.as_ref()) {
                    let p = pixels[p0 + s];
                    if p >= 0 {
                        let (sm, sub) = div.split(p);
                        match g2l.get(sm as usize) {
                            None => {
                                return Err(SampleFault::new(
                                    det,
                                    view,
                                    s,
                                    format!(
                                        "pixel {p} is beyond the map ({} submaps x {nps} pixels)",
                                        g2l.len()
                                    ),
                                ))
                            }
                            Some(&l) if l >= 0 => {
                                if mask[l as usize * nps as usize + sub as usize] != 0 {
                                    bits |= mask_bit;
                                }
                            }
                            Some(_) => {}
                        }
                    }
                }
                set(&mut row[s], bits);
                cut += i64::from(row[s] != 0);
                total += 1;
            }
        }
        Ok((cut, total))
    };
    let r = (0..v.n_det).into_par_iter().map(per_det).reduce(
        || Ok((0, 0)),
        |x, y| match (x, y) {
            (Ok(a), Ok(b)) => Ok((a.0 + b.0, a.1 + b.1)),
            (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
            (Err(e), Err(f)) => Err(if (f.det, f.view, f.samp) < (e.det, e.view, e.samp) {
                f
            } else {
                e
            }),
        },
    );
    let (cut, total) = r.map_err(|f| super::fault_error(K, f))?;
    counts[0] += cut;
    counts[1] += total;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_arrays::{arr, arr_mut};
    use toast_accel::abi::{Array, SampleRange, SampleRanges};

    /// The arguments, sent into a test pool's closure.
    struct Sent(SolverFlagsArgs);
    // SAFETY: the pointers are the test's locals, which outlive the pool
    // call that uses them (`install` blocks until it returns).
    unsafe impl Send for Sent {}

    /// Validate and run `a` on `pool`.
    fn run_on(pool: &rayon::ThreadPool, a: SolverFlagsArgs) -> Result<(), String> {
        let sent = Sent(a);
        pool.install(move || {
            let a = sent;
            // SAFETY: every array is a live local of the caller of the stated length.
            unsafe {
                let v = check::check_solver_flags(&a.0).map_err(|e| format!("{e:?}"))?;
                run(&v, &a.0).map_err(|e| format!("{e:?}"))
            }
        })
    }

    /// A small deterministic generator (64-bit LCG, high bits).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }

    /// The semantics of the header, sample by sample (the host loops of the
    /// map-maker's steps 5a and 5c in one), on a detector and shared
    /// selection together with a pixel mask (no shipped case has both).
    #[test]
    fn matches_the_sample_loop_for_any_thread_count() {
        let (n_det, n_samp, nps) = (3usize, 97usize, 5i64);
        let mut rng = Lcg(7);
        let n_global = 6usize;
        let g2l: Vec<i64> = vec![2, -1, 0, 3, -1, 1];
        let n_local = 4usize;
        let mask: Vec<u8> = (0..n_local * nps as usize)
            .map(|_| u8::from(rng.next(3) == 0))
            .collect();
        let rows = n_det + 1;
        let pixels: Vec<i64> = (0..rows * n_samp)
            .map(|_| rng.next(n_global as u64 * nps as u64 + 3) as i64 - 3)
            .map(|p| p.max(-1))
            .collect();
        let det_flags: Vec<u8> = (0..rows * n_samp).map(|_| rng.next(16) as u8).collect();
        let shared: Vec<u8> = (0..n_samp).map(|_| rng.next(8) as u8).collect();
        let flags_in: Vec<u8> = (0..rows * n_samp)
            .map(|_| if rng.next(10) == 0 { 16 } else { 0 })
            .collect();
        let flag_index = [3i32, 0, 2];
        let pixel_index = [1i32, 3, 0];
        let out_index = [2i32, 0, 3];
        let spans = [(0i64, 30i64), (20, 45), (50, 50), (60, 90)];
        let iv: Vec<SampleRange> = spans
            .iter()
            .map(|&(first, last)| SampleRange { first, last })
            .collect();
        let (det_mask, shared_mask, cut_bit, mask_bit) = (1u8, 2u8, 1u8, 4u8);

        let mut want = flags_in.clone();
        let mut want_counts = [5i64, 17];
        for d in 0..n_det {
            let r = out_index[d] as usize * n_samp;
            for s in 0..n_samp {
                if !spans.iter().any(|&(f, l)| (f..l).contains(&(s as i64))) {
                    want[r + s] |= cut_bit;
                }
            }
            for &(f, l) in &spans {
                for s in f as usize..l as usize {
                    let mut v = 0u8;
                    if det_flags[flag_index[d] as usize * n_samp + s] & det_mask != 0
                        || shared[s] & shared_mask != 0
                    {
                        v |= cut_bit;
                    }
                    let p = pixels[pixel_index[d] as usize * n_samp + s];
                    if p >= 0 {
                        let ls = g2l[(p / nps) as usize];
                        if ls >= 0 && mask[(ls * nps + p % nps) as usize] != 0 {
                            v |= mask_bit;
                        }
                    }
                    want[r + s] |= v;
                    want_counts[0] += i64::from(want[r + s] != 0);
                    want_counts[1] += 1;
                }
            }
        }
        assert!(want.iter().any(|&f| f & mask_bit != 0) && want.contains(&1));

        for threads in 1..=3 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut flags = flags_in.clone();
            let mut counts = [5i64, 17];
            let a = SolverFlagsArgs {
                n_det: n_det as u64,
                n_samp: n_samp as u64,
                flag_index: flag_index.as_ptr(),
                pixel_index: pixel_index.as_ptr(),
                out_index: out_index.as_ptr(),
                intervals: SampleRanges {
                    ptr: iv.as_ptr(),
                    len: iv.len() as u64,
                },
                global2local: arr(&g2l),
                n_pix_submap: nps,
                det_flags: arr(&det_flags),
                shared_flags: arr(&shared),
                pixels: arr(&pixels),
                pixel_mask: arr(&mask),
                flags: arr_mut(&mut flags),
                counts: arr_mut(&mut counts),
                det_flag_mask: det_mask,
                shared_flag_mask: shared_mask,
                cut_bit,
                mask_bit,
                reserved: [0; 4],
            };
            run_on(&pool, a).unwrap();
            assert_eq!(flags, want, "{threads} threads");
            assert_eq!(counts, want_counts, "{threads} threads");
        }
    }

    /// A pixel beyond the map is a data fault naming the detector and the
    /// sample; a pixel of a submap that is not local flags nothing.
    #[test]
    fn a_pixel_beyond_the_map_is_a_fault() {
        let g2l = [0i64, -1];
        let mask = [1u8; 4];
        let pixel_index = [0i32];
        let out_index = [0i32];
        let iv = [SampleRange { first: 0, last: 4 }];
        let run_with = |pixels: &[i64], flags: &mut [u8], counts: &mut [i64]| {
            let a = SolverFlagsArgs {
                n_det: 1,
                n_samp: 4,
                flag_index: std::ptr::null(),
                pixel_index: pixel_index.as_ptr(),
                out_index: out_index.as_ptr(),
                intervals: SampleRanges {
                    ptr: iv.as_ptr(),
                    len: 1,
                },
                global2local: arr(&g2l),
                n_pix_submap: 4,
                det_flags: Array::ABSENT,
                shared_flags: Array::ABSENT,
                pixels: arr(pixels),
                pixel_mask: arr(&mask),
                flags: arr_mut(flags),
                counts: arr_mut(counts),
                det_flag_mask: 0,
                shared_flag_mask: 0,
                cut_bit: 0,
                mask_bit: 4,
                reserved: [0; 4],
            };
            // SAFETY: every array is a live local of the stated length.
            unsafe {
                let v = check::check_solver_flags(&a).unwrap();
                run(&v, &a)
            }
        };
        let (mut flags, mut counts) = ([0u8; 4], [0i64; 2]);
        run_with(&[0, 5, -1, 3], &mut flags, &mut counts).unwrap();
        assert_eq!(flags, [4, 0, 0, 4]);
        assert_eq!(counts, [2, 4]);
        let e = run_with(&[0, 1, 8, 2], &mut flags, &mut counts).unwrap_err();
        let msg = format!("{e:?}");
        assert!(
            msg.contains("sample 2") && msg.contains("beyond the map"),
            "{msg}"
        );
        assert_eq!(counts, [2, 4], "counts untouched by a faulting call");
    }
}
