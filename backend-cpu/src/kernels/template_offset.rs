//! The offset-template kernels: add_to_signal, project_signal and
//! apply_diag_precond.
//!
//! The amplitude layout (`check::OffsetLayout`) is validated before the call,
//! so every amplitude index a sample maps to lies inside `amplitudes`:
//! `n_amp_views[v] >= ceil(len_v / step_length)` bounds the index within a
//! view, and `amp_offset[i] + sum(n_amp_views) <= n_amp` bounds the block.

use crate::arrays::{self, Arg};
use crate::par::{for_each_chunk, split_out_in_two, SharedMut};
use rayon::prelude::*;
use toast_accel::abi::{
    TemplateOffsetAddArgs, TemplateOffsetPrecondArgs, TemplateOffsetProjectArgs,
};
use toast_accel::check::{TemplateOffsetAdd, TemplateOffsetProject};
use toast_accel::plugin_support::PluginError;

/// # Safety
/// `a` has passed `check_template_offset_add` (giving `v`) and its arrays
/// are host memory of the stated lengths.
pub(crate) unsafe fn run_add(
    v: &TemplateOffsetAdd<'_>,
    a: &TemplateOffsetAddArgs,
) -> Result<(), PluginError> {
    const K: &str = "template_offset_add_to_signal";
    arrays::check_disjoint(
        K,
        &[Arg::new::<f64>("det_data", a.det_data)],
        &[
            Arg::new::<f64>("amplitudes", a.amplitudes),
            Arg::new::<u8>("amplitude_flags", a.amplitude_flags),
        ],
    )?;
    // SAFETY: host arrays of the validated lengths; `det_data` overlaps nothing.
    let (amps, flags, det_data) = unsafe {
        (
            arrays::input::<f64>(K, "amplitudes", a.amplitudes)?,
            arrays::input::<u8>(K, "amplitude_flags", a.amplitude_flags)?,
            arrays::output::<f64>(K, "det_data", a.det_data)?,
        )
    };
    let det_data = SharedMut::new(det_data);
    let n_samp = v.n_samp;
    let lay = &v.layout;
    let step = lay.step_length as usize;
    let r = for_each_chunk(n_samp, v.intervals, |segs| {
        for det in 0..v.n_det {
            let row = v.data_index[det] as usize;
            let base = lay.amp_offset[det] as usize;
            for seg in segs {
                let first_v = v.intervals[seg.view].first as usize;
                let voff = base + lay.view_offset[seg.view] as usize;
                // SAFETY: this task owns samples [seg.first, seg.last) of every row.
                let data = unsafe { det_data.slice_mut(row * n_samp + seg.first, seg.len()) };
                // Walk the segment one amplitude step at a time.
                let mut s = seg.first;
                while s < seg.last {
                    let k = (s - first_v) / step;
                    let end = first_v
                        .saturating_add((k + 1).saturating_mul(step))
                        .min(seg.last);
                    let amp = voff + k;
                    if flags[amp] == 0 {
                        let x = amps[amp];
                        for d in &mut data[s - seg.first..end - seg.first] {
                            *d += x;
                        }
                    }
                    s = end;
                }
            }
        }
        Ok(())
    });
    r.map_err(|f| super::fault_error(K, f))
}

/// One unit of project_signal work: amplitudes `[amp_lo, amp_hi)` of view
/// `view` of detector `det` (indices relative to the view).
#[derive(Debug, Clone, Copy)]
struct ProjTask {
    det: usize,
    view: usize,
    amp_lo: usize,
    amp_hi: usize,
}

/// # Safety
/// `a` has passed `check_template_offset_project` (giving `v`) and its
/// arrays are host memory of the stated lengths.
pub(crate) unsafe fn run_project(
    v: &TemplateOffsetProject<'_>,
    a: &TemplateOffsetProjectArgs,
) -> Result<(), PluginError> {
    const K: &str = "template_offset_project_signal";
    arrays::check_disjoint(
        K,
        &[Arg::new::<f64>("amplitudes", a.amplitudes)],
        &[
            Arg::new::<f64>("det_data", a.det_data),
            Arg::new::<u8>("flag_data", a.flag_data),
            Arg::new::<u8>("amplitude_flags", a.amplitude_flags),
        ],
    )?;
    // SAFETY: host arrays of the validated lengths; `amplitudes` overlaps nothing.
    let (det_data, flag_data, amp_flags, amps) = unsafe {
        (
            arrays::input::<f64>(K, "det_data", a.det_data)?,
            arrays::input::<u8>(K, "flag_data", a.flag_data)?,
            arrays::input::<u8>(K, "amplitude_flags", a.amplitude_flags)?,
            arrays::output::<f64>(K, "amplitudes", a.amplitudes)?,
        )
    };
    let amps = SharedMut::new(amps);
    let lay = &v.layout;
    let step = lay.step_length as usize;
    let n_samp = v.n_samp;
    let mask = a.flag_mask;
    // Amplitudes per task: about 16384 samples of work.
    let per_task = (16384 / step).max(1);
    let tasks_of = |det: usize| -> Vec<ProjTask> {
        let mut t = Vec::new();
        for (view, iv) in v.intervals.iter().enumerate() {
            let len = (iv.last - iv.first) as usize;
            let n = len.div_ceil(step);
            let mut lo = 0;
            while lo < n {
                let hi = (lo + per_task).min(n);
                t.push(ProjTask {
                    det,
                    view,
                    amp_lo: lo,
                    amp_hi: hi,
                });
                lo = hi;
            }
        }
        t
    };
    let run_task = |t: &ProjTask| {
        let iv = v.intervals[t.view];
        let (first, last) = (iv.first as usize, iv.last as usize);
        let voff = lay.amp_offset[t.det] as usize + lay.view_offset[t.view] as usize;
        let drow = v.data_index[t.det] as usize * n_samp;
        let fi = v.flag_index[t.det];
        // SAFETY: this task owns the amplitudes of its range (see below for
        // why no other running task shares them).
        let out = unsafe { amps.slice_mut(voff + t.amp_lo, t.amp_hi - t.amp_lo) };
        let fl = &amp_flags[voff + t.amp_lo..voff + t.amp_hi];
        for (k, (acc, &f)) in out.iter_mut().zip(fl).enumerate() {
            if f != 0 {
                continue;
            }
            let s0 = first + (t.amp_lo + k) * step;
            let s1 = s0.saturating_add(step).min(last);
            let data = &det_data[drow + s0..drow + s1];
            // Sequential sum in sample order, into the existing amplitude;
            // a flagged sample adds +0.0 as in TOAST.
            let mut x = *acc;
            if fi >= 0 {
                let frow = fi as usize * n_samp;
                for (&d, &fg) in data.iter().zip(&flag_data[frow + s0..frow + s1]) {
                    x += if fg & mask == 0 { d } else { 0.0 };
                }
            } else {
                for &d in data {
                    x += d;
                }
            }
            *acc = x;
        }
    };
    // Within one detector, views own disjoint amplitude ranges. Detectors
    // whose blocks are disjoint can run together; otherwise they run one
    // after the other so a shared amplitude sums detectors in order.
    if blocks_disjoint(lay.amp_offset, lay.block_len) {
        let tasks: Vec<ProjTask> = (0..v.n_det).flat_map(tasks_of).collect();
        tasks.par_iter().for_each(run_task);
    } else {
        for det in 0..v.n_det {
            tasks_of(det).par_iter().for_each(run_task);
        }
    }
    Ok(())
}

/// Whether the blocks `[off, off + len)` of all detectors are pairwise disjoint.
fn blocks_disjoint(offsets: &[i64], len: i64) -> bool {
    if len == 0 {
        return true;
    }
    let mut o = offsets.to_vec();
    o.sort_unstable();
    o.windows(2).all(|w| w[1] >= w[0] + len)
}

/// Amplitudes up to which `template_offset_apply_diag_precond` runs on the
/// calling thread ([`super::CpuKernel::inline`]), with at most one pool
/// thread taking half of it when it is awake ([`split_out_in_two`]): at about
/// 0.3 ns per amplitude, 2^17 amplitudes take ~40 µs, the order of a pool
/// hand-over. The element-wise math is the same either way (same bits).
const PRECOND_INLINE_MAX: u64 = 1 << 17;

/// Whether a precond call runs serially on the calling thread.
pub(crate) fn precond_inline(a: &TemplateOffsetPrecondArgs) -> bool {
    a.n_amp <= PRECOND_INLINE_MAX
}

/// `out = flags == 0 ? in * offset_var : 0.0`.
///
/// # Safety
/// `a` has passed `check_template_offset_precond` and its arrays are host
/// memory of the stated lengths.
pub(crate) unsafe fn run_precond(a: &TemplateOffsetPrecondArgs) -> Result<(), PluginError> {
    const K: &str = "template_offset_apply_diag_precond";
    const CHUNK: usize = 1 << 14;
    let serial = precond_inline(a);
    let inputs = [
        Arg::new::<f64>("offset_var", a.offset_var),
        Arg::new::<u8>("amplitude_flags", a.amplitude_flags),
    ];
    // SAFETY: host arrays of the validated lengths.
    let (var, flags) = unsafe {
        (
            arrays::input::<f64>(K, "offset_var", a.offset_var)?,
            arrays::input::<u8>(K, "amplitude_flags", a.amplitude_flags)?,
        )
    };
    if a.amplitudes_in.ptr == a.amplitudes_out.ptr {
        // In place (element-wise, so it is well defined).
        arrays::check_disjoint(
            K,
            &[Arg::new::<f64>("amplitudes_out", a.amplitudes_out)],
            &inputs,
        )?;
        // SAFETY: `amplitudes_out` (= `amplitudes_in`) is host memory of n_amp validated f64s;
        // check_disjoint showed it overlaps neither offset_var nor amplitude_flags, and it is
        // the only view of that buffer.
        let out = unsafe { arrays::output::<f64>(K, "amplitudes_out", a.amplitudes_out)? };
        let body = |((o, va), f): ((&mut [f64], &[f64]), &[u8])| {
            for ((o, &va), &f) in o.iter_mut().zip(va).zip(f) {
                // The product for every element, then a select: the loop
                // vectorises (a branch around the product does not).
                let x = *o * va;
                *o = if f == 0 { x } else { 0.0 };
            }
        };
        if serial {
            split_out_in_two(out, |o, r| body(((o, &var[r.clone()]), &flags[r])));
        } else {
            out.par_chunks_mut(CHUNK)
                .zip(var.par_chunks(CHUNK))
                .zip(flags.par_chunks(CHUNK))
                .for_each(body);
        }
    } else {
        let mut others = inputs.to_vec();
        others.push(Arg::new::<f64>("amplitudes_in", a.amplitudes_in));
        arrays::check_disjoint(
            K,
            &[Arg::new::<f64>("amplitudes_out", a.amplitudes_out)],
            &others,
        )?;
        // SAFETY: host arrays of the validated n_amp elements; check_disjoint showed
        // `amplitudes_out` overlaps no input, so the output view is exclusive.
        let (inp, out) = unsafe {
            (
                arrays::input::<f64>(K, "amplitudes_in", a.amplitudes_in)?,
                arrays::output::<f64>(K, "amplitudes_out", a.amplitudes_out)?,
            )
        };
        type Piece<'a> = (((&'a mut [f64], &'a [f64]), &'a [f64]), &'a [u8]);
        let body = |(((o, i), va), f): Piece<'_>| {
            for (((o, &i), &va), &f) in o.iter_mut().zip(i).zip(va).zip(f) {
                // As above: product, then select.
                let x = i * va;
                *o = if f == 0 { x } else { 0.0 };
            }
        };
        if serial {
            split_out_in_two(out, |o, r| {
                body((((o, &inp[r.clone()]), &var[r.clone()]), &flags[r]))
            });
        } else {
            out.par_chunks_mut(CHUNK)
                .zip(inp.par_chunks(CHUNK))
                .zip(var.par_chunks(CHUNK))
                .zip(flags.par_chunks(CHUNK))
                .for_each(body);
        }
    }
    Ok(())
}
