//! noise_weight: `det_data[data_index[i], s] *= detector_weights[i]`.

use crate::arrays;
use crate::par::{for_each_chunk, SharedMut};
use toast_accel::abi::NoiseWeightArgs;
use toast_accel::check::NoiseWeight;
use toast_accel::plugin_support::PluginError;

const K: &str = "noise_weight";

/// # Safety
/// `a` has passed `check_noise_weight` (giving `v`) and its arrays are host
/// memory of the stated lengths.
pub(crate) unsafe fn run(v: &NoiseWeight<'_>, a: &NoiseWeightArgs) -> Result<(), PluginError> {
    // SAFETY: host array of the validated length; the only array argument.
    let det_data = SharedMut::new(unsafe { arrays::output::<f64>(K, "det_data", a.det_data)? });
    let n_samp = v.n_samp;
    let r = for_each_chunk(n_samp, v.intervals, |segs| {
        for det in 0..v.n_det {
            let row = v.data_index[det] as usize;
            let w = v.detector_weights[det];
            for seg in segs {
                // SAFETY: this task owns samples [seg.first, seg.last) of every row.
                for d in unsafe { det_data.slice_mut(row * n_samp + seg.first, seg.len()) } {
                    *d *= w;
                }
            }
        }
        Ok(())
    });
    r.map_err(|f| super::fault_error(K, f))
}
