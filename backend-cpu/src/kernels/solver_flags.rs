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
