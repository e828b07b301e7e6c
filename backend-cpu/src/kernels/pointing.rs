//! pointing_detector: `quats[quat_index[i], s] = b(s) * focalplane[i]`.

use crate::arrays::{self, Arg};
use crate::par::{for_each_chunk, SharedMut};
use toast_accel::abi::PointingDetectorArgs;
use toast_accel::check::PointingDetector;
use toast_accel::plugin_support::PluginError;

const K: &str = "pointing_detector";

/// Hamilton product `p * q` (xyzw) in TOAST's operation order.
#[inline(always)]
pub(crate) fn qa_mult(p: &[f64; 4], q: &[f64; 4]) -> [f64; 4] {
    [
        p[0] * q[3] + p[1] * q[2] - p[2] * q[1] + p[3] * q[0],
        -p[0] * q[2] + p[1] * q[3] + p[2] * q[0] + p[3] * q[1],
        p[0] * q[1] - p[1] * q[0] + p[2] * q[3] + p[3] * q[2],
        -p[0] * q[0] - p[1] * q[1] - p[2] * q[2] + p[3] * q[3],
    ]
}

/// # Safety
/// `a` has passed `check_pointing_detector` (giving `v`) and its arrays are
/// host memory of the stated lengths.
pub(crate) unsafe fn run(
    v: &PointingDetector<'_>,
    a: &PointingDetectorArgs,
) -> Result<(), PluginError> {
    arrays::check_disjoint(
        K,
        &[Arg::new::<f64>("quats", a.quats)],
        &[
            Arg::new::<f64>("boresight", a.boresight),
            Arg::new::<u8>("shared_flags", a.shared_flags),
        ],
    )?;
    // SAFETY: host arrays of the validated lengths; `quats` overlaps nothing.
    let (boresight, flags, quats) = unsafe {
        (
            arrays::input::<f64>(K, "boresight", a.boresight)?,
            arrays::input::<u8>(K, "shared_flags", a.shared_flags)?,
            arrays::output::<f64>(K, "quats", a.quats)?,
        )
    };
    let quats = SharedMut::new(quats);
    let n_samp = v.n_samp;
    let mask = a.shared_flag_mask;
    let use_flags = v.use_flags;
    const IDENTITY: [f64; 4] = [0.0, 0.0, 0.0, 1.0];
    let r = for_each_chunk(n_samp, v.intervals, |segs| {
        for det in 0..v.n_det {
            let fp: [f64; 4] = v.focalplane[4 * det..4 * det + 4].try_into().unwrap();
            let row = v.quat_index[det] as usize;
            for seg in segs {
                // SAFETY: this task owns samples [seg.first, seg.last) of every
                // row; the segment is released before the next one is taken.
                let out = unsafe { quats.slice_mut(4 * (row * n_samp + seg.first), 4 * seg.len()) };
                let bore = &boresight[4 * seg.first..4 * seg.last];
                if use_flags {
                    let fl = &flags[seg.first..seg.last];
                    for ((o, b), &f) in out.chunks_exact_mut(4).zip(bore.chunks_exact(4)).zip(fl) {
                        let p: [f64; 4] = if f & mask == 0 {
                            b.try_into().unwrap()
                        } else {
                            IDENTITY
                        };
                        o.copy_from_slice(&qa_mult(&p, &fp));
                    }
                } else {
                    for (o, b) in out.chunks_exact_mut(4).zip(bore.chunks_exact(4)) {
                        o.copy_from_slice(&qa_mult(&b.try_into().unwrap(), &fp));
                    }
                }
            }
        }
        Ok(())
    });
    r.map_err(|f| super::fault_error(K, f))
}
