//! Compact pointing: IQU weights rebuilt from the boresight
//! (`compact_expand_pointing`, and the fused kernels' compact form).
//!
//! The expanded pointing of a sample is 32 bytes (an i64 HEALPix pixel and
//! three f64 IQU weights). In compact form the map-maker keeps only a
//! 4-byte pixel (i32, exactly TOAST's pixel: computed once by the
//! `pixels_healpix` kernel and narrowed) and rebuilds the weights wherever
//! a pass reads them, from the boresight and the detector's focal-plane
//! quaternion, without the two `atan2` and the `cos`/`sin` of the
//! `stokes_weights_IQU` kernel (see [`iqu_cos_sin`]): a few nanoseconds a
//! sample instead of the three pointing kernels' ~70.
//!
//! # The weights
//!
//! The kernel (FORMAT.md section 4) takes `vd = q ẑ q⁻¹`, `vo = q x̂ q⁻¹`,
//! the meridian `vm = (vd_z cos φ, vd_z sin φ, -√(1 - vd_z²))` with `φ =
//! atan2(vd_y, vd_x)`, then `α = atan2(y, x)` with `y = vd · (vm × vo)`,
//! `x = vm · vo`, and weights `[cal, η cal cos 2α, η cal sin 2α · U]`.
//! Here `cos φ = vd_x / r`, `sin φ = vd_y / r` with `r = √(vd_x² + vd_y²)`,
//! and `cos 2α = (x² - y²) / (x² + y²)`, `sin 2α = 2xy / (x² + y²)`: the
//! same quaternion product and rotations (the same operations as the
//! kernels), the same `vm` and `(x, y)` up to rounding, and the double
//! angle from the same `(x, y)` that the kernel's `atan2` takes. The
//! weights agree with the kernel's to a few ulp of `η cal` (tested
//! below; the conformance cases, made by TOAST's own pointing kernels, hold
//! them to `COMPACT_WEIGHT_TOL`); the pixels are exact. Where the rational
//! form does not apply (on the pole axis, `r = 0`; a non-finite or zero
//! `x² + y²`, e.g. the kernel's NaN for `vd_z < -1`) the sample takes the
//! kernel's formula, and with a HWP angle every sample does (its angle
//! needs `cos` and `sin` anyway). Each sample is computed on its own, so
//! the weights do not depend on the thread count or on which samples they
//! are computed with.

use super::pointing::qa_mult;
use crate::arrays::{self, Arg};
use rayon::prelude::*;
use toast_accel::abi::{Array, CompactExpandPointingArgs};
use toast_accel::check::{CompactExpandPointing, FusedPointing};
use toast_accel::math::{qa_rotate, stokes_alpha};
use toast_accel::plugin_support::PluginError;

type Quat = [f64; 4];
const ZAXIS: [f64; 3] = [0.0, 0.0, 1.0];
const XAXIS: [f64; 3] = [1.0, 0.0, 0.0];

/// Samples per parallel task of `compact_expand_pointing`.
const CHUNK: usize = 4096;

/// Samples per block of the vectorized weights.
const LANES: usize = 8;

/// `(cos 2α, sin 2α)` of the detector quaternion `q` without
/// trigonometric functions (see the module documentation), or the
/// kernel's `cos` and `sin` of `2α` where the rational form does not
/// apply.
#[inline(always)]
#[cfg(test)]
pub(crate) fn iqu_cos_sin(q: &Quat) -> (f64, f64) {
    let (c, s, good) = rational(q);
    if good {
        (c, s)
    } else {
        let ang = stokes_alpha(q) * 2.0;
        (ang.cos(), ang.sin())
    }
}

/// One detector's weight parameters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DetParams {
    fp: Quat,
    eta: f64,
    cal: f64,
    gamma: f64,
}

impl DetParams {
    /// Detector `d` of a compact-form call: its focal-plane quaternion,
    /// polarization efficiency `η = (1 - ε) / (1 + ε)`, calibration and
    /// angle `γ`.
    pub(crate) fn of(
        focalplane: &[f64],
        epsilon: &[f64],
        gamma: &[f64],
        cal: &[f64],
        d: usize,
    ) -> Self {
        let eps = epsilon[d];
        DetParams {
            fp: [
                focalplane[4 * d],
                focalplane[4 * d + 1],
                focalplane[4 * d + 2],
                focalplane[4 * d + 3],
            ],
            eta: (1.0 - eps) / (1.0 + eps),
            cal: cal[d],
            gamma: gamma[d],
        }
    }

    /// Detector `d` of a fused kernel's compact pointing.
    pub(crate) fn of_pointing(p: &FusedPointing<'_>, d: usize) -> Self {
        Self::of(p.focalplane, p.epsilon, p.gamma, p.cal, d)
    }
}

/// The shared inputs of the weights.
#[derive(Clone, Copy)]
pub(crate) struct Source<'a> {
    bore: &'a [f64],
    flags: Option<(&'a [u8], u8)>,
    hwp: Option<&'a [f64]>,
    u_sign: f64,
}

impl<'a> Source<'a> {
    /// The weights' inputs: the boresight, the shared flags that cut it
    /// (with their mask), the HWP angle, the convention.
    ///
    /// # Safety
    /// The arrays are host memory of their lengths (validated), not written
    /// during the call.
    pub(crate) unsafe fn of(
        k: &'static str,
        boresight: Array,
        (flags, mask): (Array, u8),
        hwp: Array,
        iau: u8,
    ) -> Result<Self, PluginError> {
        // SAFETY: the caller's contract.
        let (bore, flags, hwp) = unsafe {
            (
                arrays::input::<f64>(k, "boresight", boresight)?,
                arrays::input::<u8>(k, "pointing_flags", flags)?,
                arrays::input::<f64>(k, "hwp", hwp)?,
            )
        };
        Ok(Source {
            bore,
            flags: (!flags.is_empty() && mask != 0).then_some((flags, mask)),
            hwp: (!hwp.is_empty()).then_some(hwp),
            u_sign: if iau != 0 { -1.0 } else { 1.0 },
        })
    }

    /// The IQU weights of samples `first..` into `out` (3 per sample), in
    /// the kernels' operation order for the quaternion and the products.
    /// Without a HWP the samples go in blocks of [`LANES`], each step a
    /// loop over the lanes that the compiler vectorizes (with AVX2 where
    /// the CPU has it); each lane's arithmetic is the same on every path.
    pub(crate) fn weights(&self, p: &DetParams, first: usize, out: &mut [f64]) {
        self.weights_of(p, |i| first + i, out);
    }

    /// [`Source::weights`] of the samples `samples[i]` (any order) into
    /// `out[3 i..3 i + 3]`: the same arithmetic per sample, so a sample's
    /// weights do not depend on which samples it is computed with.
    pub(crate) fn weights_at(&self, p: &DetParams, samples: &[u32], out: &mut [f64]) {
        self.weights_of(p, |i| samples[i] as usize, &mut out[..3 * samples.len()]);
    }

    /// The weights of the samples `sample(0), sample(1), ...` into `out`
    /// (3 per sample).
    #[inline(always)]
    fn weights_of(&self, p: &DetParams, sample: impl Fn(usize) -> usize, out: &mut [f64]) {
        if let Some(h) = self.hwp {
            for (i, w) in out.chunks_exact_mut(3).enumerate() {
                let s = sample(i);
                let q = qa_mult(&self.boresight(s), &p.fp);
                let ang = 2.0 * (2.0 * (p.gamma - h[s]) - stokes_alpha(&q));
                w[0] = p.cal;
                w[1] = ang.cos() * p.eta * p.cal;
                w[2] = -ang.sin() * p.eta * p.cal * self.u_sign;
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above), the only
            // requirement of `weights_avx2`.
            unsafe { self.weights_avx2(p, sample, out) };
            return;
        }
        self.weights_blocks(p, sample, out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn weights_avx2(&self, p: &DetParams, sample: impl Fn(usize) -> usize, out: &mut [f64]) {
        self.weights_blocks(p, sample, out);
    }

    // Lane loops over fixed-size arrays: the form the compiler vectorizes.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn weights_blocks(&self, p: &DetParams, sample: impl Fn(usize) -> usize, out: &mut [f64]) {
        let n = out.len() / 3;
        let mut start = 0;
        while start < n {
            let len = LANES.min(n - start);
            let mut q = [[0.0f64; LANES]; 4];
            for l in 0..LANES {
                // Short blocks repeat their last sample.
                let b = self.boresight(sample(start + l.min(len - 1)));
                let m = qa_mult(&b, &p.fp);
                for k in 0..4 {
                    q[k][l] = m[k];
                }
            }
            let (c, sn, ok) = cos_sin_lanes(&q);
            for l in 0..len {
                let w = &mut out[3 * (start + l)..3 * (start + l) + 3];
                let (cang, sang) = if ok[l] {
                    (c[l], sn[l])
                } else {
                    let ang = stokes_alpha(&[q[0][l], q[1][l], q[2][l], q[3][l]]) * 2.0;
                    (ang.cos(), ang.sin())
                };
                w[0] = p.cal;
                w[1] = cang * p.eta * p.cal;
                w[2] = sang * p.eta * p.cal * self.u_sign;
            }
            start += len;
        }
    }

    /// The boresight of sample `s` (the identity where the shared flags
    /// cut it, as the `pointing_detector` kernel does).
    #[inline(always)]
    fn boresight(&self, s: usize) -> Quat {
        const IDENTITY: Quat = [0.0, 0.0, 0.0, 1.0];
        match self.flags {
            Some((f, m)) if f[s] & m != 0 => IDENTITY,
            _ => [
                self.bore[4 * s],
                self.bore[4 * s + 1],
                self.bore[4 * s + 2],
                self.bore[4 * s + 3],
            ],
        }
    }
}

/// [`iqu_cos_sin`]'s rational form on [`LANES`] quaternions (components
/// in rows): `(cos 2α, sin 2α, whether it applies)` per lane, the same
/// operations per lane as [`iqu_cos_sin`].
#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn cos_sin_lanes(q: &[[f64; LANES]; 4]) -> ([f64; LANES], [f64; LANES], [bool; LANES]) {
    let mut c = [0.0; LANES];
    let mut s = [0.0; LANES];
    let mut ok = [false; LANES];
    for l in 0..LANES {
        let (cc, ss, good) = rational(&[q[0][l], q[1][l], q[2][l], q[3][l]]);
        c[l] = cc;
        s[l] = ss;
        ok[l] = good;
    }
    (c, s, ok)
}

/// The rational `(cos 2α, sin 2α)` of `q` and whether it applies (see
/// the module documentation).
#[inline(always)]
fn rational(q: &Quat) -> (f64, f64, bool) {
    let vd = qa_rotate(q, &ZAXIS);
    let vo = qa_rotate(q, &XAXIS);
    let r = (vd[0] * vd[0] + vd[1] * vd[1]).sqrt();
    let vm_z = -(1.0 - vd[2] * vd[2]).sqrt();
    let inv_r = 1.0 / r;
    let vm_x = vd[2] * (vd[0] * inv_r);
    let vm_y = vd[2] * (vd[1] * inv_r);
    let y = vd[0] * (vm_y * vo[2] - vm_z * vo[1]) - vd[1] * (vm_x * vo[2] - vm_z * vo[0])
        + vd[2] * (vm_x * vo[1] - vm_y * vo[0]);
    let x = vm_x * vo[0] + vm_y * vo[1] + vm_z * vo[2];
    let n = x * x + y * y;
    let inv_n = 1.0 / n;
    let good = r > 0.0 && n > 0.0 && n.is_finite();
    ((x * x - y * y) * inv_n, (2.0 * x * y) * inv_n, good)
}

const K: &str = "compact_expand_pointing";

/// `compact_expand_pointing`: each detector's pixels widened from the
/// compact ones and its weights rebuilt (nnz 3) or `cal` (nnz 1), over the
/// intervals; tasks of [`CHUNK`] samples.
///
/// # Safety
/// `a` has passed `check_compact_expand_pointing` (giving `v`) and its
/// arrays are host memory of the stated lengths.
pub(crate) unsafe fn run(
    v: &CompactExpandPointing<'_>,
    a: &CompactExpandPointingArgs,
) -> Result<(), PluginError> {
    arrays::check_disjoint(
        K,
        &[
            Arg::new::<i64>("pixels", a.pixels),
            Arg::new::<f64>("weights", a.weights),
        ],
        &[
            Arg::new::<i32>("compact", a.compact),
            Arg::new::<f64>("boresight", a.boresight),
            Arg::new::<u8>("pointing_flags", a.pointing_flags),
            Arg::new::<f64>("hwp", a.hwp),
        ],
    )?;
    // SAFETY: host arrays of the validated lengths; the outputs overlap
    // nothing (checked just above).
    let (compact, pixels, weights, src) = unsafe {
        (
            arrays::input::<i32>(K, "compact", a.compact)?,
            crate::par::SharedMut::new(arrays::output::<i64>(K, "pixels", a.pixels)?),
            crate::par::SharedMut::new(arrays::output::<f64>(K, "weights", a.weights)?),
            Source::of(
                K,
                a.boresight,
                (a.pointing_flags, a.pointing_flag_mask),
                a.hwp,
                a.iau,
            )?,
        )
    };
    let n_samp = v.n_samp;
    let nnz = v.nnz;
    let mut tasks = Vec::new();
    for d in 0..v.n_det {
        for iv in v.intervals {
            let (first, last) = (iv.first as usize, iv.last as usize);
            tasks.extend(
                (first..last)
                    .step_by(CHUNK)
                    .map(|s| (d, s, (s + CHUNK).min(last))),
            );
        }
    }
    // Tasks write disjoint elements unless two detectors share an output
    // row or two intervals overlap; then they run one after the other.
    let distinct = |idx: &[i32]| {
        let mut v = idx.to_vec();
        v.sort_unstable();
        v.windows(2).all(|w| w[0] != w[1])
    };
    let mut ivs = v.intervals.to_vec();
    ivs.sort_unstable_by_key(|iv| iv.first);
    let disjoint = distinct(v.pixel_index)
        && distinct(v.weight_index)
        && ivs.windows(2).all(|w| w[0].last <= w[1].first);
    let task = |&(d, s0, s1): &(usize, usize, usize)| {
        let p = DetParams::of(v.focalplane, v.epsilon, v.gamma, v.cal, d);
        let crow = v.compact_index[d] as usize * n_samp;
        // The outputs' rows hold the window from sample `out_first`.
        let prow = v.pixel_index[d] as usize * v.out_n_samp;
        let wrow = v.weight_index[d] as usize * v.out_n_samp;
        let o0 = s0 - v.out_first;
        // SAFETY: in parallel, the tasks' ranges of the output rows are
        // disjoint (distinct rows per detector, non-overlapping intervals,
        // checked above); otherwise the tasks run one at a time.
        let (pix, w) = unsafe {
            (
                pixels.slice_mut(prow + o0, s1 - s0),
                weights.slice_mut(nnz * (wrow + o0), nnz * (s1 - s0)),
            )
        };
        for (o, &c) in pix.iter_mut().zip(&compact[crow + s0..crow + s1]) {
            *o = i64::from(c);
        }
        if nnz == 1 {
            w.fill(p.cal);
        } else {
            src.weights(&p, s0, w);
        }
    };
    if disjoint {
        tasks.par_iter().for_each(task);
    } else {
        tasks.iter().for_each(task);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random stream in [0, 1).
    fn uniform(state: &mut u64) -> f64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*state >> 11) as f64 / (1u64 << 53) as f64
    }

    fn exact(q: &Quat) -> (f64, f64) {
        let ang = stokes_alpha(q) * 2.0;
        (ang.cos(), ang.sin())
    }

    fn unit_quat(state: &mut u64) -> Quat {
        let mut q = [0.0; 4];
        for v in &mut q {
            *v = 2.0 * uniform(state) - 1.0;
        }
        let n = (q.iter().map(|v| v * v).sum::<f64>()).sqrt();
        q.map(|v| v / n)
    }

    /// The rational double angle agrees with the kernel's `atan2`, `cos`
    /// and `sin` to a few ulp of 1, over random orientations, directions
    /// near the poles and the pole axis itself.
    #[test]
    fn weights_within_a_few_ulp_of_the_kernel() {
        let mut state = 12345u64;
        let mut worst = 0.0f64;
        let mut qs: Vec<Quat> = (0..200_000).map(|_| unit_quat(&mut state)).collect();
        // Directions within 1e-6 .. 1e-12 rad of the poles, and on them.
        for k in 0..2000 {
            let eps = 10f64.powi(-6 - (k % 7));
            let psi = uniform(&mut state) * std::f64::consts::TAU;
            let (s, c) = (0.5 * eps).sin_cos();
            let (sp, cp) = (0.5 * psi).sin_cos();
            // A rotation by eps about x, then psi about z.
            qs.push(qa_mult(&[0.0, 0.0, sp, cp], &[s, 0.0, 0.0, c]));
            qs.push(qa_mult(&[0.0, 0.0, sp, cp], &[c, 0.0, 0.0, s]));
        }
        qs.push([0.0, 0.0, 0.0, 1.0]);
        qs.push([1.0, 0.0, 0.0, 0.0]);
        qs.push([0.0, 0.0, 0.3f64.sin(), 0.3f64.cos()]);
        for q in &qs {
            let (c0, s0) = exact(q);
            let (c1, s1) = iqu_cos_sin(q);
            let e = (c0 - c1).abs().max((s0 - s1).abs());
            worst = worst.max(e);
        }
        let ulp = f64::EPSILON;
        assert!(
            worst <= 8.0 * ulp,
            "worst difference {worst:e} = {} ulp",
            worst / ulp
        );
    }

    /// The kernel's NaN quirk (`vd_z < -1`) is kept: the fallback path.
    #[test]
    fn nan_quirk_is_the_kernels() {
        // (a, b, 0, 0) with a² + b² slightly above 1 puts vd_z below -1.
        let q = [0.8, 0.6000000000000001, 0.0, 0.0];
        let vd = qa_rotate(&q, &ZAXIS);
        assert!(vd[2] < -1.0);
        let (c, s) = iqu_cos_sin(&q);
        let (c0, s0) = exact(&q);
        assert!(c.is_nan() && s.is_nan() && c0.is_nan() && s0.is_nan());
    }
}
