//! stokes_weights_I and stokes_weights_IQU.

use crate::arrays::{self, Arg};
use crate::par::{for_each_chunk, SharedMut};
use toast_accel::abi::{StokesWeightsIArgs, StokesWeightsIquArgs};
use toast_accel::check::{StokesWeightsI, StokesWeightsIqu};
use toast_accel::plugin_support::PluginError;

/// # Safety
/// `a` has passed `check_stokes_weights_i` (giving `v`) and its arrays are
/// host memory of the stated lengths.
pub(crate) unsafe fn run_i(
    v: &StokesWeightsI<'_>,
    a: &StokesWeightsIArgs,
) -> Result<(), PluginError> {
    const K: &str = "stokes_weights_I";
    // SAFETY: host array of the validated length; the only array argument.
    let weights = SharedMut::new(unsafe { arrays::output::<f64>(K, "weights", a.weights)? });
    let n_samp = v.n_samp;
    let r = for_each_chunk(n_samp, v.intervals, |segs| {
        for det in 0..v.n_det {
            let row = v.weight_index[det] as usize;
            for seg in segs {
                // SAFETY: this task owns samples [seg.first, seg.last) of every row.
                fill_streaming(
                    unsafe { weights.slice_mut(row * n_samp + seg.first, seg.len()) },
                    v.cal[det],
                );
            }
        }
        streaming_done();
        Ok(())
    });
    r.map_err(|f| super::fault_error(K, f))
}

/// `dst.fill(x)`, with non-temporal stores on x86_64: stokes_weights_I only
/// writes (tens of MB per call, more than the caches), and ordinary stores
/// first read every line they write; streaming stores do not, which halves
/// the memory traffic. The values are the same. A task that used it calls
/// [`streaming_done`] before it ends.
fn fill_streaming(dst: &mut [f64], x: f64) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_set1_pd, _mm_stream_pd};
        // Up to the first 16-byte boundary, and the tail, ordinary stores.
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        let (first, rest) = dst.split_at_mut(head);
        first.fill(x);
        let pairs = rest.len() / 2;
        let (body, tail) = rest.split_at_mut(pairs * 2);
        tail.fill(x);
        let p = body.as_mut_ptr();
        // SAFETY: SSE2 is part of x86_64's baseline; `p + 2k` for k < pairs
        // is 16-byte aligned (the split above) and inside `body`, this
        // task's part of the output.
        unsafe {
            let v = _mm_set1_pd(x);
            for k in 0..pairs {
                _mm_stream_pd(p.add(2 * k), v);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.fill(x);
}

/// Order this thread's streaming stores ([`fill_streaming`]) before what it
/// does next (the end of its task, which the caller synchronises with).
fn streaming_done() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86_64's baseline; a fence has no other effect.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// The polarisation angle `alpha` of `stokes_weights_alpha` (written once
/// in toast-accel, shared with toast-ops' compact pointing).
use toast_accel::math::stokes_alpha as alpha;

/// # Safety
/// `a` has passed `check_stokes_weights_iqu` (giving `v`) and its arrays are
/// host memory of the stated lengths.
pub(crate) unsafe fn run_iqu(
    v: &StokesWeightsIqu<'_>,
    a: &StokesWeightsIquArgs,
) -> Result<(), PluginError> {
    const K: &str = "stokes_weights_IQU";
    arrays::check_disjoint(
        K,
        &[Arg::new::<f64>("weights", a.weights)],
        &[
            Arg::new::<f64>("quats", a.quats),
            Arg::new::<f64>("hwp", a.hwp),
        ],
    )?;
    // SAFETY: host arrays of the validated lengths; `weights` overlaps nothing.
    let (quats, hwp, weights) = unsafe {
        (
            arrays::input::<f64>(K, "quats", a.quats)?,
            arrays::input::<f64>(K, "hwp", a.hwp)?,
            arrays::output::<f64>(K, "weights", a.weights)?,
        )
    };
    let weights = SharedMut::new(weights);
    let n_samp = v.n_samp;
    let u_sign = if a.iau != 0 { -1.0 } else { 1.0 };
    let use_hwp = v.use_hwp;
    let r = for_each_chunk(n_samp, v.intervals, |segs| {
        for det in 0..v.n_det {
            let eps = v.epsilon[det];
            let eta = (1.0 - eps) / (1.0 + eps);
            let cal = v.cal[det];
            let gamma = v.gamma[det];
            let qrow = v.quat_index[det] as usize;
            let wrow = v.weight_index[det] as usize;
            for seg in segs {
                let q = &quats[4 * (qrow * n_samp + seg.first)..4 * (qrow * n_samp + seg.last)];
                // SAFETY: this task owns samples [seg.first, seg.last) of every row.
                let out =
                    unsafe { weights.slice_mut(3 * (wrow * n_samp + seg.first), 3 * seg.len()) };
                if use_hwp {
                    let h = &hwp[seg.first..seg.last];
                    for ((w, qq), &hw) in out.chunks_exact_mut(3).zip(q.chunks_exact(4)).zip(h) {
                        let al = alpha(qq);
                        let ang = 2.0 * (2.0 * (gamma - hw) - al);
                        let cang = ang.cos();
                        let sang = ang.sin();
                        w[0] = cal;
                        w[1] = cang * eta * cal;
                        w[2] = -sang * eta * cal * u_sign;
                    }
                } else {
                    for (w, qq) in out.chunks_exact_mut(3).zip(q.chunks_exact(4)) {
                        let ang = alpha(qq) * 2.0;
                        let cang = ang.cos();
                        let sang = ang.sin();
                        w[0] = cal;
                        w[1] = cang * eta * cal;
                        w[2] = sang * eta * cal * u_sign;
                    }
                }
            }
        }
        Ok(())
    });
    r.map_err(|f| super::fault_error(K, f))
}
