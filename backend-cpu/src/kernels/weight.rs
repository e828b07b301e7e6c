//! noise_weight: `det_data[data_index[i], s] *= detector_weights[i]`.
//!
//! A streaming multiply, in place, bound by memory. Each stretch of a row is
//! scaled with the widest vectors the CPU has (AVX-512F, else AVX2, chosen
//! at run time; the baseline build has only SSE2), in blocks of [`BLOCK`]
//! elements that ask for the cache lines [`PREFETCH_AHEAD`] elements (8 KiB)
//! ahead. On the bench's workload (`toast-cli bench kernels`, 80 MB of
//! detector data, a loaded 2-CPU machine) the wider vectors took 0.75 to
//! 0.60 ns per sample (a standalone loop, once its pages had settled: SSE2
//! 0.60, AVX-512 0.30), and the prefetch about 8 % more off in six of seven
//! paired runs. Every element is the same IEEE product `d * w` whatever the
//! instruction set, so the results are the same bits.

use super::mapmaker_utils::prefetch;
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
    let scale = Scale::detect();
    let r = for_each_chunk(n_samp, v.intervals, |segs| {
        for det in 0..v.n_det {
            let row = v.data_index[det] as usize;
            let w = v.detector_weights[det];
            for seg in segs {
                // SAFETY: this task owns samples [seg.first, seg.last) of every row.
                scale.run(
                    unsafe { det_data.slice_mut(row * n_samp + seg.first, seg.len()) },
                    w,
                );
            }
        }
        Ok(())
    });
    r.map_err(|f| super::fault_error(K, f))
}

/// The instruction set [`Scale::run`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scale {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Baseline,
}

impl Scale {
    /// The widest the CPU has.
    fn detect() -> Scale {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Scale::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Scale::Avx2;
            }
        }
        Scale::Baseline
    }

    /// `x *= w` for every element of `d`.
    fn run(self, d: &mut [f64], w: f64) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx512` is only made by `detect` when the CPU has
            // AVX-512F, the only requirement of `scale_avx512`.
            Scale::Avx512 => unsafe { scale_avx512(d, w) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only made by `detect` when the CPU has AVX2,
            // the only requirement of `scale_avx2`.
            Scale::Avx2 => unsafe { scale_avx2(d, w) },
            Scale::Baseline => scale(d, w),
        }
    }
}

/// Elements per block of [`scale`] (8 cache lines).
const BLOCK: usize = 64;

/// How far ahead (in elements) [`scale`] asks for the cache lines it will
/// read.
const PREFETCH_AHEAD: usize = 1024;

#[inline(always)]
fn scale(d: &mut [f64], w: f64) {
    for c in d.chunks_mut(BLOCK) {
        let ahead = c.as_ptr().wrapping_add(PREFETCH_AHEAD);
        for line in 0..BLOCK / 8 {
            prefetch(ahead.wrapping_add(8 * line));
        }
        for x in c {
            *x *= w;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scale_avx512(d: &mut [f64], w: f64) {
    scale(d, w);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scale_avx2(d: &mut [f64], w: f64) {
    scale(d, w);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every instruction set the CPU has gives the baseline's bits, on
    /// lengths around the vector widths and values with signed zeros,
    /// subnormals, infinities and NaN.
    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        let mut sets = vec![Scale::Baseline];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                sets.push(Scale::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                sets.push(Scale::Avx512);
            }
        }
        let special = [0.0, -0.0, 5e-324, -2.5e-310, f64::INFINITY, f64::NAN, 1e308];
        for n in [0usize, 1, 3, 7, 8, 9, 15, 16, 17, 33, 63, 64, 65, 100, 130] {
            let data: Vec<f64> = (0..n)
                .map(|i| {
                    if i % 5 == 4 {
                        special[i % special.len()]
                    } else {
                        (i as f64 * 0.731).sin() * 1e3
                    }
                })
                .collect();
            for w in [0.999_7, -1.25, 0.0, 1e-310, f64::INFINITY] {
                let mut want = data.clone();
                scale(&mut want, w);
                for &s in &sets {
                    let mut got = data.clone();
                    s.run(&mut got, w);
                    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{s:?}, n {n}, w {w}");
                }
            }
        }
    }
}
