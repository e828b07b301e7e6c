//! Comparing a backend's outputs with TOAST's, and the report of one case.
//!
//! [`CaseOutcome`] is what running a case gives (pass, pass within
//! tolerance, fail with the first differing field, kernel error, skipped).
//! `compare` is the exact comparison (bits for floats, except that two NaNs
//! match), [`Comparison`] chooses between it and the tolerant mode described
//! in the [module docs](super), and `verdict` folds the comparisons of a
//! kernel's outputs into one outcome.

use crate::host::Backend;
use std::fmt;

/// The result of running one case.
#[derive(Debug, Clone, PartialEq)]
pub enum CaseOutcome {
    /// Every output matched TOAST's exactly.
    Pass,
    /// Every output matched within the tolerant comparison, and some
    /// elements differed (the first such field).
    PassTolerant {
        field: String,
        /// Number of elements that differ (all within the tolerance).
        n_diff: usize,
        /// Largest `|got - want| / max|want|` over the field.
        max_rel_diff: f64,
    },
    /// An output differs (the first such field, in the kernel's output order).
    Fail {
        field: String,
        /// Largest |ours - TOAST's| (infinite when only one side is NaN).
        max_abs_diff: f64,
        /// Number of differing elements.
        n_diff: usize,
        /// Flat (row-major) index of the first differing element.
        first_diff_index: usize,
    },
    /// The kernel call itself failed.
    Error { message: String },
    /// The case could not run here (e.g. the backend lacks the kernel).
    Skipped { reason: String },
}

impl CaseOutcome {
    /// A pass, exact or within tolerance.
    pub fn is_pass(&self) -> bool {
        matches!(self, CaseOutcome::Pass | CaseOutcome::PassTolerant { .. })
    }
}

impl fmt::Display for CaseOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaseOutcome::Pass => f.write_str("pass"),
            CaseOutcome::PassTolerant {
                field,
                n_diff,
                max_rel_diff,
            } => write!(
                f,
                "pass within tolerance: {field} n = {n_diff} differ, max |diff| / max|want| = {max_rel_diff:e}"
            ),
            CaseOutcome::Fail {
                field,
                max_abs_diff,
                n_diff,
                first_diff_index,
            } => write!(
                f,
                "{field} max |diff| = {max_abs_diff:e}, n = {n_diff} (first at flat index {first_diff_index})"
            ),
            CaseOutcome::Error { message } => write!(f, "kernel error: {message}"),
            CaseOutcome::Skipped { reason } => f.write_str(reason),
        }
    }
}

/// Exact comparison of one element type.
pub(super) trait Exact: Copy {
    fn same(a: Self, b: Self) -> bool;
    fn diff(a: Self, b: Self) -> f64;
}

impl Exact for f64 {
    fn same(a: f64, b: f64) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }
    fn diff(a: f64, b: f64) -> f64 {
        if a.is_nan() != b.is_nan() {
            f64::INFINITY
        } else {
            (a - b).abs()
        }
    }
}
impl Exact for i64 {
    fn same(a: i64, b: i64) -> bool {
        a == b
    }
    fn diff(a: i64, b: i64) -> f64 {
        (a as f64 - b as f64).abs()
    }
}
impl Exact for u8 {
    fn same(a: u8, b: u8) -> bool {
        a == b
    }
    fn diff(a: u8, b: u8) -> f64 {
        (a as f64 - b as f64).abs()
    }
}

/// Compare `got` with `want`; `None` when identical.
pub(super) fn compare<T: Exact>(field: &str, got: &[T], want: &[T]) -> Option<CaseOutcome> {
    let mut n_diff = 0;
    let mut first = None;
    let mut max = 0.0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if !T::same(g, w) {
            n_diff += 1;
            first.get_or_insert(i);
            let d = T::diff(g, w);
            if d > max || d.is_nan() {
                max = d;
            }
        }
    }
    if got.len() != want.len() {
        n_diff += got.len().abs_diff(want.len());
        first.get_or_insert(got.len().min(want.len()));
        max = f64::INFINITY;
    }
    first.map(|i| CaseOutcome::Fail {
        field: field.to_string(),
        max_abs_diff: max,
        n_diff,
        first_diff_index: i,
    })
}

/// The relative tolerance of `filter_polynomial` outputs against TOAST's,
/// in units of the largest input (TOAST solves with OpenBLAS's dgelss,
/// reproducible only to its last bits; FORMAT.md section 13), in every mode.
pub const POLYNOMIAL_RTOL: f64 = 2e-14;
/// The relative tolerance of `filter_poly2D` coefficients against TOAST's,
/// per (sample, group) block, in units of the block's largest magnitude or
/// 1 (FORMAT.md section 14), in every mode.
pub const POLY2D_RTOL: f64 = 1e-10;

/// Compare an output TOAST computes with LAPACK, in every mode: element `i`
/// may differ by `rtol * scale(i)`, except where `exact(i)` (there it must
/// be bit-identical). `None` when all elements are identical.
pub(super) fn within(
    field: &str,
    got: &[f64],
    want: &[f64],
    rtol: f64,
    exact: impl Fn(usize) -> bool,
    scale: impl Fn(usize) -> f64,
) -> Option<CaseOutcome> {
    let fail = compare(field, got, want)?;
    if got.len() != want.len() {
        return Some(fail);
    }
    let mut n_diff = 0;
    let mut max_rel = 0.0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if <f64 as Exact>::same(g, w) {
            continue;
        }
        let s = scale(i);
        let d = (g - w).abs();
        if exact(i) || !(g.is_finite() && w.is_finite()) || d > rtol * s {
            return Some(fail);
        }
        n_diff += 1;
        max_rel = max_rel.max(d / s);
    }
    Some(CaseOutcome::PassTolerant {
        field: field.to_string(),
        n_diff,
        max_rel_diff: max_rel,
    })
}

/// The first failing comparison, else the first tolerant pass, else Pass.
pub(super) fn verdict(results: impl IntoIterator<Item = Option<CaseOutcome>>) -> CaseOutcome {
    let mut tolerant = None;
    for r in results.into_iter().flatten() {
        if matches!(r, CaseOutcome::PassTolerant { .. }) {
            tolerant.get_or_insert(r);
        } else {
            return r;
        }
    }
    tolerant.unwrap_or(CaseOutcome::Pass)
}

/// The norm-wise relative tolerance of [`Comparison::Tolerant`] for outputs
/// of the device's trigonometry (`stokes_weights_IQU` weights).
pub const TRIG_RTOL: f64 = 1e-14;
/// The norm-wise relative tolerance of [`Comparison::Tolerant`] for atomic
/// accumulations (`build_noise_weighted` zmap, `cov_accum_diag_invnpp`).
pub const ACCUM_RTOL: f64 = 1e-13;

/// The relative tolerance of the fused kernels' compact form (FORMAT.md
/// section 17), in every mode, per element in units of the largest
/// |expected| value: the rebuilt weights are within a few ulp of
/// `stokes_weights_IQU`'s (8 ulp of `η cal` bounds the rational form's
/// error; the CPU plugin's test `weights_within_a_few_ulp_of_the_kernel`),
/// so the weights, and the maps and amplitudes summed from them, differ by
/// rounding only. The kept form, which reads TOAST's own weights, is held
/// exact on the CPU (the unfused sequence's operations).
pub const FUSED_COMPACT_RTOL: f64 = 1e-12;

/// The relative tolerance of the PCG solver's vector kernels (`amp_dot`,
/// `amp_axpby`) in tolerant mode, per element in units of the sum of the
/// magnitudes of its terms: a device compiler may contract `a * b + c`
/// into one fused multiply-add (one rounding fewer per term).
pub const AMP_RTOL: f64 = 1e-15;

/// The tolerance of `sim_noise` (FORMAT.md section 18), in every mode, per
/// sample in units of the RMS of the detector's expected noise: TOAST's
/// inverse FFT is FFTW's, ours `realfft`'s on the CPU and a Stockham FFT on
/// a device, which round differently (about 1e-15 of the RMS), and the case's
/// amplitudes are numpy's interpolation where TOAST's C++ computes its own
/// (an ulp of `log10`/`pow` apart).
pub const NOISE_RTOL: f64 = 1e-12;

/// How outputs are compared with TOAST's (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    /// Bit for bit (two NaNs match).
    Exact,
    /// Exact, except `stokes_weights_IQU` weights within [`TRIG_RTOL`] and
    /// `build_noise_weighted` zmap and `cov_accum_diag_invnpp` within
    /// [`ACCUM_RTOL`], `template_offset_project_signal` and (kept form)
    /// `fused_project` amplitudes within [`AMP_RTOL`] x `step_length` (at
    /// most `n_samp`; a device's tree sum), norm-wise, with identical NaN
    /// patterns.
    Tolerant,
}

impl Comparison {
    /// Exact for a host-addressable backend (the CPU class, which claims
    /// bit-exactness), tolerant for a device backend.
    pub fn for_backend(b: &Backend) -> Self {
        if b.host_addressable() {
            Comparison::Exact
        } else {
            Comparison::Tolerant
        }
    }

    /// A one-line description, for reports.
    pub fn describe(self) -> String {
        match self {
            Comparison::Exact => "exact (bit for bit; NaN matches NaN)".to_string(),
            Comparison::Tolerant => format!(
                "tolerant (device backend: stokes_weights_IQU weights within {TRIG_RTOL:e} and build_noise_weighted zmap / cov_accum_diag_invnpp / cov_accum_timestream invnpp within {ACCUM_RTOL:e} x max|want|, template_offset_project_signal / fused_project amplitudes within {AMP_RTOL:e} x step_length (at most n_samp) x max|want|, same NaN/inf pattern; all other outputs exact)"
            ),
        }
    }

    /// Compare a float field that the tolerant mode relaxes.
    pub(super) fn float(
        self,
        field: &str,
        got: &[f64],
        want: &[f64],
        rtol: f64,
    ) -> Option<CaseOutcome> {
        let exact = compare(field, got, want);
        if self == Comparison::Exact || exact.is_none() || got.len() != want.len() {
            return exact;
        }
        let scale = want
            .iter()
            .filter(|w| w.is_finite())
            .fold(0.0f64, |m, w| m.max(w.abs()));
        let tol = rtol * scale;
        let mut n_diff = 0;
        let mut max_rel = 0.0f64;
        for (&g, &w) in got.iter().zip(want) {
            if <f64 as Exact>::same(g, w) {
                continue;
            }
            let d = (g - w).abs();
            if !(g.is_finite() && w.is_finite()) || d > tol {
                return exact;
            }
            n_diff += 1;
            max_rel = max_rel.max(d / scale);
        }
        Some(CaseOutcome::PassTolerant {
            field: field.to_string(),
            n_diff,
            max_rel_diff: max_rel,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparison_is_bitwise_with_nan_equal() {
        assert!(compare("x", &[1.0, f64::NAN], &[1.0, f64::NAN]).is_none());
        let f = compare("x", &[0.0, 1.0, 3.0], &[-0.0, 1.0, 2.5]).unwrap();
        assert_eq!(
            f,
            CaseOutcome::Fail {
                field: "x".into(),
                max_abs_diff: 0.5,
                n_diff: 2,
                first_diff_index: 0
            }
        );
        let f = compare("x", &[f64::NAN], &[1.0]).unwrap();
        assert!(matches!(f, CaseOutcome::Fail { max_abs_diff, .. } if max_abs_diff.is_infinite()));
    }

    #[test]
    fn tolerant_comparison_is_normwise_keeps_nan_patterns_and_reports() {
        let want = [1.0, 1e-17, f64::NAN, -2.0];
        // Exact mode: any bit difference fails.
        let got = [1.0 + 2e-16, 3e-17, f64::NAN, -2.0];
        assert!(matches!(
            Comparison::Exact.float("w", &got, &want, TRIG_RTOL),
            Some(CaseOutcome::Fail { n_diff: 2, .. })
        ));
        // Tolerant: both within 1e-14 x max|want| = 2e-14, reported.
        match Comparison::Tolerant.float("w", &got, &want, TRIG_RTOL) {
            Some(CaseOutcome::PassTolerant {
                n_diff,
                max_rel_diff,
                ..
            }) => {
                assert_eq!(n_diff, 2);
                assert!(max_rel_diff > 0.0 && max_rel_diff < TRIG_RTOL);
            }
            o => panic!("{o:?}"),
        }
        // Identical: a plain pass (None).
        assert!(Comparison::Tolerant
            .float("w", &want, &want, TRIG_RTOL)
            .is_none());
        // Beyond the tolerance, or a NaN where TOAST has a number: failure.
        let far = [1.0 + 1e-12, 1e-17, f64::NAN, -2.0];
        assert!(matches!(
            Comparison::Tolerant.float("w", &far, &want, TRIG_RTOL),
            Some(CaseOutcome::Fail { .. })
        ));
        let nan = [1.0, f64::NAN, f64::NAN, -2.0];
        assert!(matches!(
            Comparison::Tolerant.float("w", &nan, &want, TRIG_RTOL),
            Some(CaseOutcome::Fail { .. })
        ));
        // A tolerant pass never hides a failure of another field.
        let v = verdict([
            Comparison::Tolerant.float("w", &got, &want, TRIG_RTOL),
            compare("p", &[1i64], &[2i64]),
        ]);
        assert!(matches!(v, CaseOutcome::Fail { ref field, .. } if field == "p"));
        assert!(!v.is_pass());
    }
}
