//! Compact pointing for the map-maker's host passes
//! (`binner.compact_pointing`).
//!
//! The expanded pointing of a sample is 32 bytes (an i64 HEALPix pixel and
//! three f64 IQU weights). In compact form the map-maker keeps only a
//! 4-byte pixel (i32, exactly TOAST's pixel: it is computed once by the
//! `pixels_healpix` kernel and narrowed, [`CompactPixels`]) and, in every
//! pass that reads pointing, [`ExpandCompactPointing`] rebuilds one
//! detector batch's pixels and weights: the pixels by widening, the
//! weights from the boresight and the detector's focal-plane quaternion,
//! without the two `atan2` and the `cos`/`sin` of the
//! `stokes_weights_IQU` kernel (see [`iqu_cos_sin`]). That costs a few
//! nanoseconds a sample instead of the three pointing kernels' ~70, so the
//! pointing can be rebuilt twice per CG iteration.
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
//! below); the pixels are exact. Where the rational form does not apply
//! (on the pole axis, `r = 0`; a non-finite or zero `x² + y²`, e.g. the
//! kernel's NaN for `vd_z < -1`) the sample takes the kernel's formula,
//! and with a HWP angle every sample does (its angle needs `cos` and
//! `sin` anyway). Each sample is computed on its own, so the weights do
//! not depend on the thread count.

use super::pixels_healpix::PixelsHealpixConfig;
use super::stokes_weights::{StokesMode, StokesWeightsConfig};
use super::util::{pointing_field, select_detectors};
use super::PointingDetectorConfig;
use crate::accel::kernels::view_intervals;
use crate::math::qarray::{mult, rotate_unit, Quat, XAXIS, ZAXIS};
use rayon::prelude::*;
use toast_core::{
    Category, DType, Data, ExecContext, Observation, OpError, Operator, Requirements, SharedData,
};

/// Samples per parallel task of the weight computation.
const CHUNK: usize = 4096;

/// The kernel's `alpha` (FORMAT.md section 4), with its `atan2`, `cos`
/// and `sin`: the fallback of [`iqu_cos_sin`] and the HWP path. The same
/// function the CPU plugin's kernel calls (`toast_accel::math`).
fn alpha_exact(q: &Quat) -> f64 {
    toast_accel::math::stokes_alpha(q)
}

/// `(cos 2α, sin 2α)` of the detector quaternion `q` without
/// trigonometric functions (see the module documentation), or the
/// kernel's `cos` and `sin` of `2α` where the rational form does not
/// apply.
#[inline(always)]
pub fn iqu_cos_sin(q: &Quat) -> (f64, f64) {
    let (c, s, good) = rational(q);
    if good {
        (c, s)
    } else {
        let ang = alpha_exact(q) * 2.0;
        (ang.cos(), ang.sin())
    }
}

/// Narrow the pixels of the selected detectors into the i32 field
/// `compact` (made for every local detector when missing). A pixel beyond
/// `i32` is an error naming it (the map-maker uses compact pointing only
/// where `12 nside²` fits).
#[derive(Debug, Clone)]
pub struct CompactPixels {
    /// Instance name.
    pub name: String,
    /// The i64 pixel field.
    pub pixels: String,
    /// The i32 output field.
    pub compact: String,
    /// Detector flag bits that exclude a detector.
    pub det_mask: u8,
}

impl Operator for CompactPixels {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        Requirements::new().detdata(&self.pixels)
    }
    fn provides(&self) -> Requirements {
        Requirements::new().detdata(&self.compact)
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        for ob in &mut data.obs {
            let dets = select_detectors(ctx, ob, self.det_mask);
            if dets.is_empty() {
                continue;
            }
            if !ob.detdata.contains(&self.compact) {
                ob.detdata.create(&self.compact, DType::I32, &[], None)?;
            }
            let name = ob.name().to_string();
            let [pix, out] = ob
                .detdata
                .get_disjoint_mut([self.pixels.as_str(), self.compact.as_str()])?;
            for d in &dets {
                let p = pix.row_of::<i64>(d)?;
                let o = out.row_of_mut::<i32>(d)?;
                for (s, (o, &p)) in o.iter_mut().zip(p).enumerate() {
                    *o = i32::try_from(p).map_err(|_| -> OpError {
                        toast_core::PixelOutOfRange {
                            what: "compact pixels".into(),
                            observation: name.clone(),
                            detector: d.clone(),
                            sample: s,
                            pixel: p,
                            limit: "does not fit the compact pointing's 32-bit pixels".into(),
                        }
                        .into()
                    })?;
                }
            }
        }
        Ok(())
    }
}

/// Rebuild the selected detectors' pixels (i64) and Stokes weights from
/// the compact pixels and the boresight (see the module documentation),
/// into fields that hold only those detectors (host runs over detector
/// batches, as [`pointing_field`]'s `transient`).
#[derive(Debug, Clone)]
pub struct ExpandCompactPointing {
    /// Instance name.
    pub name: String,
    /// The i32 compact pixel field.
    pub compact: String,
    /// The detector pointing (boresight, shared flags, detector mask).
    pub det_pointing: PointingDetectorConfig,
    /// The pixelization (its output field).
    pub pixels: PixelsHealpixConfig,
    /// The weights (mode, HWP, convention, view, output field).
    pub weights: StokesWeightsConfig,
}

impl ExpandCompactPointing {
    fn view(&self) -> Option<&str> {
        self.weights
            .view
            .as_deref()
            .or(self.det_pointing.view.as_deref())
    }
}

/// One detector's weight parameters.
pub(crate) struct DetParams {
    fp: Quat,
    eta: f64,
    cal: f64,
    gamma: f64,
}

impl DetParams {
    /// Detector `d` of `ob`: its focal-plane quaternion, polarization
    /// efficiency `η = (1 - ε) / (1 + ε)`, calibration 1 and angle `γ`.
    pub(crate) fn of(ob: &Observation, d: &str) -> Result<Self, OpError> {
        let det = ob.detector(d)?;
        let eps = det.pol_leakage;
        let eta = (1.0 - eps) / (1.0 + eps);
        Ok(DetParams {
            fp: det.quat,
            eta,
            cal: 1.0,
            gamma: det.gamma,
        })
    }
}

impl Operator for ExpandCompactPointing {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        let mut r = Requirements::new()
            .detdata(&self.compact)
            .shared(&self.det_pointing.boresight);
        if let Some(f) = &self.det_pointing.shared_flags {
            r.add(Category::Shared, f);
        }
        if let Some(v) = self.view() {
            r.add(Category::Intervals, v);
        }
        r
    }
    fn provides(&self) -> Requirements {
        Requirements::new()
            .detdata(&self.pixels.pixels)
            .detdata(&self.weights.weights)
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        let nnz = self.weights.mode.nnz();
        let view = self.view().map(str::to_string);
        for ob in &mut data.obs {
            let dets = select_detectors(ctx, ob, self.det_pointing.det_mask);
            pointing_field(ob, &self.pixels.pixels, DType::I64, &[], &dets, true)?;
            pointing_field(ob, &self.weights.weights, DType::F64, &[nnz], &dets, true)?;
            if dets.is_empty() {
                continue;
            }
            let intervals = view_intervals(ob, view.as_deref())?;
            let params = dets
                .iter()
                .map(|d| DetParams::of(ob, d))
                .collect::<Result<Vec<_>, _>>()?;
            let src = Source::of(&ob.shared, &self.det_pointing, &self.weights)?;
            let [comp, pix, wts] = ob.detdata.get_disjoint_mut([
                self.compact.as_str(),
                self.pixels.pixels.as_str(),
                self.weights.weights.as_str(),
            ])?;
            for (d, p) in dets.iter().zip(&params) {
                let c = comp.row_of::<i32>(d)?;
                for (o, &c) in pix.row_of_mut::<i64>(d)?.iter_mut().zip(c) {
                    *o = i64::from(c);
                }
                let w = wts.row_of_mut::<f64>(d)?;
                if self.weights.mode == StokesMode::I {
                    for iv in &intervals {
                        w[iv.first as usize..iv.last as usize].fill(p.cal);
                    }
                    continue;
                }
                for iv in &intervals {
                    let (first, last) = (iv.first as usize, iv.last as usize);
                    w[3 * first..3 * last]
                        .par_chunks_mut(3 * CHUNK)
                        .enumerate()
                        .for_each(|(k, out)| src.weights(p, first + k * CHUNK, out));
                }
            }
        }
        Ok(())
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
    /// The IQU weights' inputs of observation `ob` as `weights` and
    /// `det_pointing` configure them (boresight, the shared flags that cut
    /// it, the HWP angle when present, the U sign), for a fused host pass
    /// that rebuilds weights sample block by sample block (see
    /// [`crate::mapmaker`]). The caller checks the mode is IQU.
    pub(crate) fn of(
        shared: &'a SharedData,
        det_pointing: &PointingDetectorConfig,
        weights: &StokesWeightsConfig,
    ) -> Result<Self, OpError> {
        let hwp = match weights.hwp_angle.as_deref() {
            Some(h) if shared.contains(h) => Some(shared.data::<f64>(h)?),
            _ => None,
        };
        let flags = match (&det_pointing.shared_flags, det_pointing.shared_flag_mask) {
            (Some(f), m) if m != 0 => Some((shared.data::<u8>(f)?, m)),
            _ => None,
        };
        Ok(Source {
            bore: shared.data::<f64>(&det_pointing.boresight)?,
            flags,
            hwp,
            u_sign: if weights.iau { -1.0 } else { 1.0 },
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
                let q = mult(&self.boresight(s), &p.fp);
                let ang = 2.0 * (2.0 * (p.gamma - h[s]) - alpha_exact(&q));
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
                let m = mult(&b, &p.fp);
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
                    let ang = alpha_exact(&[q[0][l], q[1][l], q[2][l], q[3][l]]) * 2.0;
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

/// Samples per block of the vectorized weights.
const LANES: usize = 8;

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
    let vd = rotate_unit(q, &ZAXIS);
    let vo = rotate_unit(q, &XAXIS);
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
        let ang = alpha_exact(q) * 2.0;
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
            qs.push(mult(&[0.0, 0.0, sp, cp], &[s, 0.0, 0.0, c]));
            qs.push(mult(&[0.0, 0.0, sp, cp], &[c, 0.0, 0.0, s]));
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
        let vd = rotate_unit(&q, &ZAXIS);
        assert!(vd[2] < -1.0);
        let (c, s) = iqu_cos_sin(&q);
        let (c0, s0) = exact(&q);
        assert!(c.is_nan() && s.is_nan() && c0.is_nan() && s0.is_nan());
    }
}
