//! filter_polynomial and filter_poly2D (TOAST 3.0.6's `toast::filter_polynomial`
//! and `toast::filter_poly2D_solve`, libtoast `toast_tod_filter.cpp`;
//! `tests/data/toast-kernels/FORMAT.md`, sections 13-14).
//!
//! Plain functions over slices, and the plugin's entries
//! ([`run_polynomial`], [`run_poly2d`]) that call them.
//!
//! TOAST solves each least-squares problem with LAPACK `dgelss` (an SVD) from
//! the OpenBLAS it links, whose result depends on the CPU's BLAS kernels in
//! the last bits (FORMAT.md). Bit-exactness with TOAST is therefore not a
//! meaningful target; what is reproduced exactly is everything around the
//! solve (the Legendre templates, the masked normal matrices of poly2D, the
//! subtraction order), and the solve itself is a small hand-written one that
//! the device source (`toast-accel/device/kernels.h`) repeats operation for
//! operation, so the CPU and every device give the same bits: the normal
//! equations, a cyclic Jacobi eigen-decomposition of the symmetric matrix and
//! the pseudo-inverse with dgelss's singular-value cut. Against TOAST the
//! results agree to about 1e-12 relative (the tests' tolerances).
//!
//! The normal equations square the templates' condition number. A
//! filter_polynomial scan whose normal matrix is ill-conditioned (an order
//! near the square root of its length or above:
//! [`NORMAL_EQUATIONS_MIN_RATIO`]) is solved on the CPU as TOAST's SVD
//! solves it, without forming the normal matrix ([`lstsq_subtract`]:
//! Givens QR, then a one-sided Jacobi SVD), to the accuracy the problem
//! allows (condition number x eps); the device code keeps the normal
//! equations there (FORMAT.md section 13).
//!
//! Speed: a scan's normal matrix and its first signal's right-hand side are
//! summed in one pass over the samples ([`ScanFit::with_rhs`]), with the sums
//! in registers for up to 6 templates (order 5: a `FixedSums`, whose size the
//! compiler knows), and the fitted polynomial is subtracted in a second pass;
//! every sum gets the same operations in the same order as in the device
//! code's separate passes, so the bits do not change.

use crate::arrays;
use crate::par::SharedMut;
use rayon::prelude::*;
use toast_accel::abi::{FilterPoly2dArgs, FilterPolynomialArgs};
use toast_accel::check::{FilterPoly2d, FilterPolynomial};
use toast_accel::plugin_support::PluginError;

/// The `filter_polynomial` entry: the rows `signal_index` of `signals`.
///
/// # Safety
/// `a` has passed `check_filter_polynomial` (giving `v`) and its arrays are
/// host memory of the stated lengths.
pub(crate) unsafe fn run_polynomial(
    v: &FilterPolynomial<'_>,
    a: &FilterPolynomialArgs,
) -> Result<(), PluginError> {
    const K: &str = "filter_polynomial";
    if v.n_samp == 0 || v.n_signal == 0 {
        return Ok(());
    }
    // SAFETY: host arrays of the validated lengths; `signals` is the only output.
    let (flags, signals) = unsafe {
        (
            arrays::input::<u8>(K, "flags", a.flags)?,
            arrays::output::<f64>(K, "signals", a.signals)?,
        )
    };
    let mut rows: Vec<Option<&mut [f64]>> = signals.chunks_mut(v.n_samp).map(Some).collect();
    // The validator checked every index is a row, and that none repeats.
    let mut picked: Vec<&mut [f64]> = v
        .signal_index
        .iter()
        .map(|&r| rows[r as usize].take().expect("a validated, distinct row"))
        .collect();
    filter_polynomial(v.order, flags, &mut picked, v.starts, v.stops)
}

/// The `filter_poly2D` entry.
///
/// # Safety
/// `a` has passed `check_filter_poly2d` (giving `v`) and its arrays are host
/// memory of the stated lengths.
pub(crate) unsafe fn run_poly2d(
    v: &FilterPoly2d<'_>,
    a: &FilterPoly2dArgs,
) -> Result<(), PluginError> {
    const K: &str = "filter_poly2D";
    // SAFETY: host arrays of the validated lengths; `coeff` is the only output.
    let (signals, masks, coeff) = unsafe {
        (
            arrays::input::<f64>(K, "signals", a.signals)?,
            arrays::input::<u8>(K, "masks", a.masks)?,
            arrays::output::<f64>(K, "coeff", a.coeff)?,
        )
    };
    filter_poly2d(
        v.n_samp,
        v.n_det,
        v.n_group,
        v.n_mode,
        v.det_groups,
        v.templates,
        signals,
        masks,
        coeff,
    )
}

/// Sweeps of the Jacobi method before giving up (a symmetric matrix of the
/// sizes used here converges in fewer than ten).
const JACOBI_MAX_SWEEPS: usize = 64;

/// The largest polynomial order + 1 (templates per fit) accepted, every
/// backend's (the validator refuses more); it only bounds the memory a call
/// can ask for.
pub(crate) const MAX_TEMPLATES: usize = toast_accel::check::MAX_POLY_TEMPLATES as usize;

/// Diagonalise the symmetric `n x n` row-major matrix `a` in place with the
/// cyclic Jacobi method: on return the diagonal of `a` holds the eigenvalues
/// and column `i` of `v` (`v[k * n + i]`) the eigenvector of eigenvalue `i`.
/// `kernels.h`'s `toast_jacobi_eigen` is the same sequence of operations.
pub(crate) fn jacobi_eigen(n: usize, a: &mut [f64], v: &mut [f64]) {
    for (k, x) in v[..n * n].iter_mut().enumerate() {
        *x = if k % (n + 1) == 0 { 1.0 } else { 0.0 };
    }
    for _ in 0..JACOBI_MAX_SWEEPS {
        let mut rotated = false;
        for p in 0..n {
            for q in p + 1..n {
                let apq = a[p * n + q];
                if apq == 0.0 {
                    continue;
                }
                let app = a[p * n + p];
                let aqq = a[q * n + q];
                let g = 100.0 * apq.abs();
                if app.abs() + g == app.abs() && aqq.abs() + g == aqq.abs() {
                    // Below the last bit of both diagonal elements.
                    a[p * n + q] = 0.0;
                    a[q * n + p] = 0.0;
                    continue;
                }
                let h = aqq - app;
                let t = if h.abs() + g == h.abs() {
                    apq / h
                } else {
                    let theta = 0.5 * h / apq;
                    let t = 1.0 / (theta.abs() + (1.0 + theta * theta).sqrt());
                    if theta < 0.0 {
                        -t
                    } else {
                        t
                    }
                };
                let c = 1.0 / (1.0 + t * t).sqrt();
                let s = t * c;
                for k in 0..n {
                    if k == p || k == q {
                        continue;
                    }
                    let akp = a[k * n + p];
                    let akq = a[k * n + q];
                    let nkp = c * akp - s * akq;
                    let nkq = s * akp + c * akq;
                    a[k * n + p] = nkp;
                    a[p * n + k] = nkp;
                    a[k * n + q] = nkq;
                    a[q * n + k] = nkq;
                }
                a[p * n + p] = app - t * apq;
                a[q * n + q] = aqq + t * apq;
                a[p * n + q] = 0.0;
                a[q * n + p] = 0.0;
                for k in 0..n {
                    let vkp = v[k * n + p];
                    let vkq = v[k * n + q];
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
                rotated = true;
            }
        }
        if !rotated {
            break;
        }
    }
}

/// `b <- pinv(A) b` for the symmetric `A` that [`jacobi_eigen`] left in `a`
/// (eigenvalues on the diagonal) and `v`, keeping the eigenvalues whose
/// magnitude exceeds `max(rcond * largest magnitude, f64::MIN_POSITIVE)`, as
/// dgelss keeps singular values (the singular values of a symmetric matrix
/// are the magnitudes of its eigenvalues). All zero for a zero matrix. `w`
/// is scratch of `n`.
pub(crate) fn pinv_apply(n: usize, a: &[f64], v: &[f64], rcond: f64, b: &mut [f64], w: &mut [f64]) {
    let mut smax = 0.0f64;
    for i in 0..n {
        let s = a[i * n + i].abs();
        if s > smax {
            smax = s;
        }
    }
    let mut thr = rcond * smax;
    if thr < f64::MIN_POSITIVE {
        thr = f64::MIN_POSITIVE;
    }
    for i in 0..n {
        let mut x = 0.0;
        for k in 0..n {
            x += v[k * n + i] * b[k];
        }
        let l = a[i * n + i];
        w[i] = if l.abs() > thr { x / l } else { 0.0 };
    }
    for k in 0..n {
        let mut x = 0.0;
        for i in 0..n {
            x += v[k * n + i] * w[i];
        }
        b[k] = x;
    }
}

/// Samples per block of [`legendre`]'s table.
const LEGENDRE_BLOCK: usize = 64;

/// The Legendre polynomials `P_0..P_{norder-1}` at the `len` (at most
/// [`LEGENDRE_BLOCK`]) points `xstart + (first + i) dx`, into
/// `table[k * LEGENDRE_BLOCK + i]`, by TOAST's recurrence
/// `P_k = ((2k-1) x P_{k-1} - (k-1) P_{k-2}) / k` with `1/k` as a factor.
/// A block of samples at a time, each order across the block: the samples
/// are independent, so the recurrence's latency overlaps between them (one
/// sample at a time, it is a chain of dependent products); every value is
/// the same operations on the same operands as for one point.
#[inline(always)]
pub(crate) fn legendre(
    norder: usize,
    xstart: f64,
    dx: f64,
    first: usize,
    len: usize,
    table: &mut [f64],
) {
    const B: usize = LEGENDRE_BLOCK;
    debug_assert!(len <= B && table.len() >= norder * B);
    if norder == 0 {
        return;
    }
    table[..len].fill(1.0);
    if norder == 1 {
        return;
    }
    for (i, p1) in table[B..B + len].iter_mut().enumerate() {
        *p1 = xstart + (first + i) as f64 * dx;
    }
    for k in 2..norder {
        let orderinv = 1.0 / k as f64;
        let (c1, c2) = ((2 * k - 1) as f64, (k - 1) as f64);
        let (lower, upper) = table.split_at_mut(k * B);
        let (x, pm2, pm1) = (
            &lower[B..B + len],
            &lower[(k - 2) * B..(k - 2) * B + len],
            &lower[(k - 1) * B..(k - 1) * B + len],
        );
        for (i, pk) in upper[..len].iter_mut().enumerate() {
            *pk = (c1 * x[i] * pm1[i] - c2 * pm2[i]) * orderinv;
        }
    }
}

/// dgelss's rcond for filter_polynomial on the normal equations: TOAST passes
/// rcond = -1 (machine precision on the singular values of the templates,
/// 1.1e-16, i.e. 1.2e-32 on the eigenvalues of their normal matrix), which
/// the normal matrix cannot resolve; its eigenvalues carry an absolute error
/// of about eps times the largest, so the cut is there (FORMAT.md).
pub(crate) const POLY_RCOND: f64 = f64::EPSILON;

/// dgelss's rcond in filter_poly2D (TOAST's constant).
pub(crate) const POLY2D_RCOND: f64 = 1e-6;

/// One scan of filter_polynomial after TOAST's clamping.
#[derive(Debug, Clone, Copy)]
struct Scan {
    start: usize,
    len: usize,
}

/// TOAST's clamping of scan `(start, stop)` to `n` samples (stop exclusive):
/// `start < 0` becomes 0; `stop > n`, **compared as unsigned** (so a negative
/// stop too), becomes `n`; `stop < start` skips the scan.
fn clamp_scan(start: i64, stop: i64, n: usize) -> Option<Scan> {
    let start = start.max(0);
    let stop = if stop < 0 || stop as u64 > n as u64 {
        n as i64
    } else {
        stop
    };
    (stop >= start).then(|| Scan {
        start: start as usize,
        len: (stop - start) as usize,
    })
}

/// The sums one pass over a scan accumulates for a fit of `n()` templates:
/// the upper triangle of the Legendre normal matrix `a[j][k] = Σ P_j P_k`
/// (`j <= k`) and the right-hand side `rhs[k] = Σ P_k s` of one signal,
/// over the good samples, in sample order.
///
/// Two stores of the same sums: [`FixedSums`] for the usual small orders,
/// whose size the compiler knows, so that once the pass is inlined its loops
/// over templates unroll and the sums live in registers (through memory,
/// every sample's update of a sum waits for the previous sample's store);
/// [`DynSums`] for any size. [`normal_pass`] is written once for both.
trait Sums {
    fn n(&self) -> usize;
    fn a(&mut self, j: usize, k: usize) -> &mut f64;
    fn rhs(&mut self, k: usize) -> &mut f64;
}

/// [`Sums`] of `N` templates.
struct FixedSums<const N: usize> {
    a: [[f64; N]; N],
    rhs: [f64; N],
}

impl<const N: usize> Sums for FixedSums<N> {
    #[inline(always)]
    fn n(&self) -> usize {
        N
    }
    #[inline(always)]
    fn a(&mut self, j: usize, k: usize) -> &mut f64 {
        &mut self.a[j][k]
    }
    #[inline(always)]
    fn rhs(&mut self, k: usize) -> &mut f64 {
        &mut self.rhs[k]
    }
}

/// [`Sums`] of any number of templates (`a` row-major, `n x n`).
struct DynSums {
    n: usize,
    a: Vec<f64>,
    rhs: Vec<f64>,
}

impl Sums for DynSums {
    #[inline(always)]
    fn n(&self) -> usize {
        self.n
    }
    #[inline(always)]
    fn a(&mut self, j: usize, k: usize) -> &mut f64 {
        &mut self.a[j * self.n + k]
    }
    #[inline(always)]
    fn rhs(&mut self, k: usize) -> &mut f64 {
        &mut self.rhs[k]
    }
}

/// One pass over a scan (`flags`, `signal`, Legendre abscissae `xstart +
/// i dx`): adds to `sums` the products of every good sample, in sample
/// order (`a[j][k] += P_j P_k`, then `rhs[k] += P_k s`, the operations the
/// separate passes of the device code do per element, in the same order),
/// and returns the number of good samples.
#[inline(always)]
fn normal_pass<S: Sums>(sums: &mut S, xstart: f64, dx: f64, flags: &[u8], signal: &[f64]) -> usize {
    const B: usize = LEGENDRE_BLOCK;
    let n = sums.n();
    let mut p = vec![0.0; n * B];
    let mut ngood = 0;
    for (ib, (f, s)) in flags.chunks(B).zip(signal.chunks(B)).enumerate() {
        legendre(n, xstart, dx, ib * B, f.len(), &mut p);
        for (i, (_, &s)) in f.iter().zip(s).enumerate().filter(|(_, (&f, _))| f == 0) {
            ngood += 1;
            for j in 0..n {
                let pj = p[j * B + i];
                for k in j..n {
                    *sums.a(j, k) += pj * p[k * B + i];
                }
            }
            for k in 0..n {
                *sums.rhs(k) += p[k * B + i] * s;
            }
        }
    }
    ngood
}

/// [`normal_pass`] for `n` templates, with the sums in a [`FixedSums`] when
/// `n` is one of the small sizes, returned as `(ngood, a (n x n, upper
/// triangle), rhs)`.
fn normal_sums(
    n: usize,
    xstart: f64,
    dx: f64,
    flags: &[u8],
    signal: &[f64],
) -> (usize, Vec<f64>, Vec<f64>) {
    fn fixed<const N: usize>(
        xstart: f64,
        dx: f64,
        flags: &[u8],
        signal: &[f64],
    ) -> (usize, Vec<f64>, Vec<f64>) {
        let mut s = FixedSums::<N> {
            a: [[0.0; N]; N],
            rhs: [0.0; N],
        };
        let ngood = normal_pass(&mut s, xstart, dx, flags, signal);
        (ngood, s.a.concat(), s.rhs.to_vec())
    }
    match n {
        1 => fixed::<1>(xstart, dx, flags, signal),
        2 => fixed::<2>(xstart, dx, flags, signal),
        3 => fixed::<3>(xstart, dx, flags, signal),
        4 => fixed::<4>(xstart, dx, flags, signal),
        5 => fixed::<5>(xstart, dx, flags, signal),
        6 => fixed::<6>(xstart, dx, flags, signal),
        _ => {
            let mut s = DynSums {
                n,
                a: vec![0.0; n * n],
                rhs: vec![0.0; n],
            };
            let ngood = normal_pass(&mut s, xstart, dx, flags, signal);
            (ngood, s.a, s.rhs)
        }
    }
}

/// The fit of one scan: the Legendre normal matrix of its good samples,
/// diagonalised. Shared by its signals.
struct ScanFit {
    norder: usize,
    dx: f64,
    xstart: f64,
    /// Eigenvalues on the diagonal.
    a: Vec<f64>,
    v: Vec<f64>,
}

impl ScanFit {
    /// The fit of a scan of at most `norder_max` templates and the
    /// right-hand side of its first signal, from one pass over both
    /// ([`normal_pass`]); `None` when no sample is good. With fewer good
    /// samples than `norder_max`, the fit has one template per good sample:
    /// its sums are the leading ones of the pass's (the Legendre recurrence
    /// and every sum of the lower orders are the same operations whatever
    /// the number of templates).
    fn with_rhs(flags: &[u8], signal: &[f64], norder_max: usize) -> Option<(Self, Vec<f64>)> {
        let len = flags.len();
        let dx = 2.0 / len as f64;
        let xstart = 0.5 * dx - 1.0;
        let (ngood, sums, mut rhs) = normal_sums(norder_max, xstart, dx, flags, signal);
        if ngood == 0 {
            return None;
        }
        let norder = ngood.min(norder_max);
        let mut a = vec![0.0; norder * norder];
        for j in 0..norder {
            for k in j..norder {
                a[j * norder + k] = sums[j * norder_max + k];
                a[k * norder + j] = sums[j * norder_max + k];
            }
        }
        rhs.truncate(norder);
        let mut v = vec![0.0; norder * norder];
        jacobi_eigen(norder, &mut a, &mut v);
        let fit = ScanFit {
            norder,
            dx,
            xstart,
            a,
            v,
        };
        Some((fit, rhs))
    }

    /// The right-hand side of another signal: `Σ P_k s` over the good
    /// samples, in sample order (the sums [`normal_pass`] makes for the
    /// first signal).
    fn rhs(&self, flags: &[u8], signal: &[f64]) -> Vec<f64> {
        const B: usize = LEGENDRE_BLOCK;
        let n = self.norder;
        let mut p = vec![0.0; n * B];
        let mut amp = vec![0.0; n];
        for (ib, (f, s)) in flags.chunks(B).zip(signal.chunks(B)).enumerate() {
            legendre(n, self.xstart, self.dx, ib * B, f.len(), &mut p);
            for (i, (_, &s)) in f.iter().zip(s).enumerate().filter(|(_, (&f, _))| f == 0) {
                for k in 0..n {
                    amp[k] += p[k * B + i] * s;
                }
            }
        }
        amp
    }

    /// Solve for the amplitudes of right-hand side `amp` and subtract the
    /// fitted polynomial from every sample of `signal`, flagged or not.
    fn subtract(&self, mut amp: Vec<f64>, signal: &mut [f64]) {
        let n = self.norder;
        let mut w = vec![0.0; n];
        pinv_apply(n, &self.a, &self.v, POLY_RCOND, &mut amp, &mut w);
        subtract_polynomial(&amp, self.xstart, self.dx, signal);
    }

    /// Whether the normal matrix is too ill-conditioned for its solve to be
    /// TOAST's: its smallest eigenvalue below [`NORMAL_EQUATIONS_MIN_RATIO`]
    /// of its largest.
    fn ill_conditioned(&self) -> bool {
        let n = self.norder;
        let (mut lmin, mut lmax) = (f64::INFINITY, 0.0f64);
        for i in 0..n {
            let l = self.a[i * n + i].abs();
            lmin = lmin.min(l);
            lmax = lmax.max(l);
        }
        lmin < NORMAL_EQUATIONS_MIN_RATIO * lmax
    }
}

/// Subtract `Σ_k amp[k] P_k(x_i)` from every sample `i` of `signal` (the
/// Legendre abscissae `xstart + i dx`), the terms in order k = 0, 1, ..;
/// across a block of samples the subtractions are independent.
fn subtract_polynomial(amp: &[f64], xstart: f64, dx: f64, signal: &mut [f64]) {
    const B: usize = LEGENDRE_BLOCK;
    let n = amp.len();
    let mut p = vec![0.0; n * B];
    for (ib, s) in signal.chunks_mut(B).enumerate() {
        legendre(n, xstart, dx, ib * B, s.len(), &mut p);
        for (k, &ak) in amp.iter().enumerate() {
            for (x, &pk) in s.iter_mut().zip(&p[k * B..]) {
                *x -= ak * pk;
            }
        }
    }
}

/// The smallest eigenvalue of a scan's normal matrix, relative to its
/// largest, that the normal equations solve as TOAST's SVD of the
/// templates does: 2^-22, a template matrix of condition number 2048.
/// Their solution's error grows as that ratio's inverse times the unit
/// roundoff (5e-10 of the data at a ratio of ~1e-6, FORMAT.md section 13),
/// and below about 1e-16 the eigenvalue cut drops templates TOAST keeps
/// (a residual 10% of the data larger at order 150 on 500 samples). Below
/// it the scan is fitted by [`lstsq_subtract`].
const NORMAL_EQUATIONS_MIN_RATIO: f64 = 1.0 / (1u64 << 22) as f64;

/// Sweeps of the one-sided Jacobi SVD before giving up.
const SVD_MAX_SWEEPS: usize = 100;

/// Fit the `norder` Legendre templates to each of `signals` (one scan: the
/// abscissae `xstart + i dx`, good samples where `flags == 0`) by least
/// squares, as TOAST's `dgelss` with rcond -1 does, and subtract the fit
/// from every sample. For the scans whose normal matrix is ill-conditioned
/// ([`NORMAL_EQUATIONS_MIN_RATIO`]), so without forming it: each good
/// sample's row of templates (with its signal values) is rotated into an
/// upper triangular `R` and `Qᵀ s` by Givens rotations (backward stable,
/// `norder²` memory), `R`'s SVD is taken by one-sided Jacobi (Hestenes:
/// its singular values, those of the templates, to their own relative
/// accuracy), and the amplitudes are `V Σ⁺ Uᵀ Qᵀ s` with the singular
/// values at most `f64::EPSILON` of the largest dropped (dgelss's cut).
fn lstsq_subtract(norder: usize, xstart: f64, dx: f64, flags: &[u8], signals: &mut [&mut [f64]]) {
    const B: usize = LEGENDRE_BLOCK;
    let (n, m) = (norder, signals.len());
    // R row-major (upper triangle), Y = Qᵀ S row-major (n x m).
    let mut r = vec![0.0f64; n * n];
    let mut y = vec![0.0f64; n * m];
    let mut table = vec![0.0; n * B];
    let mut row = vec![0.0; n];
    let mut yrow = vec![0.0; m];
    for (ib, f) in flags.chunks(B).enumerate() {
        legendre(n, xstart, dx, ib * B, f.len(), &mut table);
        for (i, _) in f.iter().enumerate().filter(|(_, &f)| f == 0) {
            for (k, x) in row.iter_mut().enumerate() {
                *x = table[k * B + i];
            }
            for (q, v) in yrow.iter_mut().enumerate() {
                *v = signals[q][ib * B + i];
            }
            for j in 0..n {
                let pj = row[j];
                if pj == 0.0 {
                    continue;
                }
                let rjj = r[j * n + j];
                let h = rjj.hypot(pj);
                let (c, s) = (rjj / h, pj / h);
                r[j * n + j] = h;
                for k in j + 1..n {
                    let (a, b) = (r[j * n + k], row[k]);
                    r[j * n + k] = c * a + s * b;
                    row[k] = c * b - s * a;
                }
                for (q, v) in yrow.iter_mut().enumerate() {
                    let a = y[j * m + q];
                    y[j * m + q] = c * a + s * *v;
                    *v = c * *v - s * a;
                }
            }
        }
    }
    // One-sided Jacobi on the columns of R (column-major copy): A = R V
    // with orthogonal columns, |A_j| the singular values.
    let mut a = vec![0.0f64; n * n];
    for i in 0..n {
        for j in i..n {
            a[j * n + i] = r[i * n + j];
        }
    }
    let mut v = vec![0.0; n * n];
    for j in 0..n {
        v[j * n + j] = 1.0;
    }
    for _ in 0..SVD_MAX_SWEEPS {
        let mut rotated = false;
        for p in 0..n {
            for q in p + 1..n {
                let (cp, cq) = (&a[p * n..(p + 1) * n], &a[q * n..(q + 1) * n]);
                let (mut alpha, mut beta, mut gamma) = (0.0, 0.0, 0.0);
                for (x, z) in cp.iter().zip(cq) {
                    alpha += x * x;
                    beta += z * z;
                    gamma += x * z;
                }
                if gamma == 0.0 || gamma.abs() <= f64::EPSILON * (alpha * beta).sqrt() {
                    continue;
                }
                rotated = true;
                let zeta = (beta - alpha) / (2.0 * gamma);
                let t = zeta.signum() / (zeta.abs() + (1.0 + zeta * zeta).sqrt());
                let c = 1.0 / (1.0 + t * t).sqrt();
                let s = c * t;
                for mat in [&mut a, &mut v] {
                    for i in 0..n {
                        let (x, z) = (mat[p * n + i], mat[q * n + i]);
                        mat[p * n + i] = c * x - s * z;
                        mat[q * n + i] = s * x + c * z;
                    }
                }
            }
        }
        if !rotated {
            break;
        }
    }
    let sigma2: Vec<f64> = (0..n)
        .map(|j| a[j * n..(j + 1) * n].iter().map(|x| x * x).sum())
        .collect();
    let smax = sigma2.iter().fold(0.0f64, |m, &s| m.max(s)).sqrt();
    let keep = |s2: f64| s2.sqrt() > (f64::EPSILON * smax).max(f64::MIN_POSITIVE);
    for (q, signal) in signals.iter_mut().enumerate() {
        // amp = Σ_j V_j (A_j · y) / σ_j².
        let mut amp = vec![0.0; n];
        for j in (0..n).filter(|&j| keep(sigma2[j])) {
            let dot: f64 = (0..n).map(|i| a[j * n + i] * y[i * m + q]).sum();
            let w = dot / sigma2[j];
            for (k, ak) in amp.iter_mut().enumerate() {
                *ak += v[j * n + k] * w;
            }
        }
        subtract_polynomial(&amp, xstart, dx, signal);
    }
}

/// Fit and subtract a Legendre polynomial of order `order` from every signal,
/// one scan `[starts[i], stops[i])` at a time, in scan order, using the
/// common `flags` (any non-zero value flags a sample). A scan whose samples
/// are all flagged (or that is empty) is left alone; one with fewer good
/// samples than `order + 1` is fitted with as many templates as good samples.
/// `order < 0` does nothing.
pub(crate) fn filter_polynomial(
    order: i64,
    flags: &[u8],
    signals: &mut [&mut [f64]],
    starts: &[i64],
    stops: &[i64],
) -> Result<(), PluginError> {
    const K: &str = "filter_polynomial";
    if starts.len() != stops.len() {
        return Err(PluginError::invalid(format!(
            "{K}: {} starts and {} stops",
            starts.len(),
            stops.len()
        )));
    }
    let n = flags.len();
    if let Some((i, s)) = signals.iter().enumerate().find(|(_, s)| s.len() != n) {
        return Err(PluginError::invalid(format!(
            "{K}: signal {i} has {} samples, the flags {n}",
            s.len()
        )));
    }
    if order < 0 {
        return Ok(());
    }
    if order >= MAX_TEMPLATES as i64 {
        return Err(PluginError::invalid(format!(
            "{K}: order {order} is beyond the supported {}",
            MAX_TEMPLATES - 1
        )));
    }
    let norder_max = order as usize + 1;
    let scans: Vec<Scan> = starts
        .iter()
        .zip(stops)
        .filter_map(|(&a, &b)| clamp_scan(a, b, n))
        .collect();
    let shared: Vec<SharedMut<f64>> = signals.iter_mut().map(|s| SharedMut::new(s)).collect();
    // SAFETY (for every use below): a call touches samples
    // [scan.start, scan.start + scan.len) of each signal, through at most one
    // live slice per signal at a time, and calls run concurrently only for
    // disjoint scans.
    let run = |scan: &Scan| {
        let f = &flags[scan.start..scan.start + scan.len];
        let Some((first, rest)) = shared.split_first() else {
            return;
        };
        /// # Safety
        /// As `SharedMut::slice_mut`: no other live slice of the range.
        #[allow(clippy::mut_from_ref)]
        unsafe fn scan_of<'s>(s: &'s SharedMut<f64>, scan: &Scan) -> &'s mut [f64] {
            // SAFETY: the caller's contract.
            unsafe { s.slice_mut(scan.start, scan.len) }
        }
        // SAFETY: see above (each slice made is the signal's only live one).
        let slice = |s| unsafe { scan_of(s, scan) };
        // The first signal's slice lives only for the normal sums.
        let Some((fit, rhs)) = ScanFit::with_rhs(f, slice(first), norder_max) else {
            return;
        };
        if fit.ill_conditioned() {
            let mut all: Vec<&mut [f64]> = shared.iter().map(slice).collect();
            lstsq_subtract(fit.norder, fit.xstart, fit.dx, f, &mut all);
            return;
        }
        fit.subtract(rhs, slice(first));
        for sig in rest {
            let sig = slice(sig);
            let rhs = fit.rhs(f, sig);
            fit.subtract(rhs, sig);
        }
    };
    // Scans that overlap must run in order (the second fits what the first
    // left, as TOAST's one-thread run does); disjoint ones run in parallel.
    let mut sorted: Vec<&Scan> = scans.iter().filter(|s| s.len > 0).collect();
    sorted.sort_by_key(|s| s.start);
    let disjoint = sorted
        .windows(2)
        .all(|w| w[0].start + w[0].len <= w[1].start);
    if disjoint {
        sorted.par_iter().for_each(|scan| run(scan));
    } else {
        scans.iter().for_each(run);
    }
    Ok(())
}

/// Solve, for every sample and detector group, the least-squares fit of the
/// group's detector signals by the per-detector templates (`n_mode` of them),
/// with the detectors whose mask is 0 weighted by 0.0 (`masks` non-zero means
/// good), and write the coefficients to `coeff[sample, group, ..]`, as TOAST
/// does: `A = Σ_d t_d t_dᵀ m_d`, `rhs = Σ_d t_d s_d m_d` (detectors in index
/// order, `(t_i * s) * m` and `(t_i * t_j) * m`, the upper triangle mirrored
/// as it is accumulated), then dgelss with rcond 1e-6. A detector with a
/// negative group is in none. Shapes: `det_groups` `[n_det]`, `templates`
/// `[n_det, n_mode]`, `signals` and `masks` `[n_samp, n_det]`, `coeff`
/// `[n_samp, n_group, n_mode]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn filter_poly2d(
    n_samp: usize,
    n_det: usize,
    n_group: usize,
    n_mode: usize,
    det_groups: &[i32],
    templates: &[f64],
    signals: &[f64],
    masks: &[u8],
    coeff: &mut [f64],
) -> Result<(), PluginError> {
    const K: &str = "filter_poly2D";
    let lens = [
        ("det_groups", det_groups.len(), n_det),
        ("templates", templates.len(), n_det * n_mode),
        ("signals", signals.len(), n_samp * n_det),
        ("masks", masks.len(), n_samp * n_det),
        ("coeff", coeff.len(), n_samp * n_group * n_mode),
    ];
    for (name, got, want) in lens {
        if got != want {
            return Err(PluginError::invalid(format!(
                "{K}: {name} has {got} elements, expected {want}"
            )));
        }
    }
    if n_mode > MAX_TEMPLATES {
        return Err(PluginError::invalid(format!(
            "{K}: {n_mode} modes is beyond the supported {MAX_TEMPLATES}"
        )));
    }
    if let Some((i, g)) = det_groups
        .iter()
        .enumerate()
        .find(|(_, &g)| g >= 0 && g as usize >= n_group)
    {
        return Err(PluginError::invalid(format!(
            "{K}: det {i}: group {g} invalid for {n_group} groups"
        )));
    }
    if n_mode == 0 || n_group == 0 {
        return Ok(());
    }
    // The members of each group, in detector order (TOAST's summation order).
    let members: Vec<Vec<usize>> = (0..n_group)
        .map(|g| {
            (0..n_det)
                .filter(|&d| det_groups[d] >= 0 && det_groups[d] as usize == g)
                .collect()
        })
        .collect();
    // Contiguous blocks of samples, a few per thread, so that a block's
    // consecutive samples can share their groups' decompositions.
    let block = n_samp
        .div_ceil(rayon::current_num_threads().max(1) * 4)
        .max(1);
    coeff
        .par_chunks_mut(block * n_group * n_mode)
        .enumerate()
        .for_each(|(ib, out)| {
            let mut fits: Vec<GroupFit> = members
                .iter()
                .map(|m| GroupFit::new(n_mode, m.len()))
                .collect();
            for (k, out) in out.chunks_exact_mut(n_group * n_mode).enumerate() {
                let isamp = ib * block + k;
                let sig = &signals[isamp * n_det..(isamp + 1) * n_det];
                let msk = &masks[isamp * n_det..(isamp + 1) * n_det];
                for ((fit, m), rhs) in fits
                    .iter_mut()
                    .zip(&members)
                    .zip(out.chunks_exact_mut(n_mode))
                {
                    fit.update(n_mode, m, templates, msk);
                    poly2d_rhs(n_mode, m, templates, sig, msk, rhs);
                    pinv_apply(n_mode, &fit.a, &fit.v, POLY2D_RCOND, rhs, &mut fit.w);
                }
            }
        });
    Ok(())
}

/// The decomposed normal matrix of one group, kept from one sample to the
/// next: the matrix depends only on which of the group's detectors are good
/// (the templates are fixed and a mask weighs by exactly 0.0 or 1.0), so
/// when that set has not changed, the matrix and its decomposition would be
/// recomputed to the same bits, and are reused instead. Most consecutive
/// samples share their mask (flags come in bursts), so the O(n_mode³)
/// decomposition runs only where the mask changes and the cost per sample
/// is that of the right-hand side and the O(n_mode²) pseudo-inverse.
struct GroupFit {
    /// Whether `a` and `v` hold the decomposition of the mask `good`.
    valid: bool,
    /// `masks != 0` of each member at the sample `a` was made for.
    good: Vec<bool>,
    /// Eigenvalues on the diagonal (see [`jacobi_eigen`]).
    a: Vec<f64>,
    v: Vec<f64>,
    /// Scratch of [`pinv_apply`].
    w: Vec<f64>,
}

impl GroupFit {
    fn new(n_mode: usize, n_members: usize) -> Self {
        GroupFit {
            valid: false,
            good: vec![false; n_members],
            a: vec![0.0; n_mode * n_mode],
            v: vec![0.0; n_mode * n_mode],
            w: vec![0.0; n_mode],
        }
    }

    /// Make `a` and `v` the decomposition of the normal matrix of the
    /// members `m` under the masks `msk`, unless they already are.
    fn update(&mut self, n_mode: usize, m: &[usize], templates: &[f64], msk: &[u8]) {
        let same = self.valid && m.iter().zip(&self.good).all(|(&d, &g)| (msk[d] != 0) == g);
        if same {
            return;
        }
        for (g, &d) in self.good.iter_mut().zip(m) {
            *g = msk[d] != 0;
        }
        poly2d_matrix(n_mode, m, templates, msk, &mut self.a);
        jacobi_eigen(n_mode, &mut self.a, &mut self.v);
        self.valid = true;
    }
}

/// The normal matrix `a` of one sample and group (members `m`), in TOAST's
/// order: `(t_i * t_j) * mask`, the upper triangle mirrored as it is
/// accumulated, a masked detector weighed by 0.0 (not skipped).
#[inline(always)]
fn poly2d_matrix(n_mode: usize, m: &[usize], templates: &[f64], msk: &[u8], a: &mut [f64]) {
    a.fill(0.0);
    for &idet in m {
        let det_mask = if msk[idet] == 0 { 0.0 } else { 1.0 };
        let t = &templates[idet * n_mode..(idet + 1) * n_mode];
        for im in 0..n_mode {
            for jm in im..n_mode {
                let val = t[im] * t[jm] * det_mask;
                a[im * n_mode + jm] += val;
                if jm > im {
                    a[jm * n_mode + im] += val;
                }
            }
        }
    }
}

/// The right-hand side `rhs` of one sample and group (members `m`), in
/// TOAST's order: `(t_i * s) * mask`.
#[inline(always)]
fn poly2d_rhs(
    n_mode: usize,
    m: &[usize],
    templates: &[f64],
    sig: &[f64],
    msk: &[u8],
    rhs: &mut [f64],
) {
    rhs.fill(0.0);
    for &idet in m {
        let det_mask = if msk[idet] == 0 { 0.0 } else { 1.0 };
        let det_sig = sig[idet];
        let t = &templates[idet * n_mode..(idet + 1) * n_mode];
        for (r, &ti) in rhs.iter_mut().zip(t) {
            *r += ti * det_sig * det_mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_cases::reference_case;

    /// Largest |got - want| over the largest |want| (1 if that is 0).
    fn rel_err(got: &[f64], want: &[f64]) -> f64 {
        let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1.0);
        got.iter()
            .zip(want)
            .map(|(g, w)| (g - w).abs())
            .fold(0.0f64, f64::max)
            / scale
    }

    fn run_poly(name: &str) -> (Vec<f64>, Vec<f64>, Vec<f64>, usize) {
        let mut c = reference_case(name);
        let order = c.scalar_i64("order");
        let flags = c.u8("flags");
        let (mut sig, shape) = c.shaped::<f64>("signals_in");
        let sig_in = sig.clone();
        let n = shape[1];
        {
            let mut rows: Vec<&mut [f64]> = sig.chunks_mut(n).collect();
            filter_polynomial(order, &flags, &mut rows, &c.i64("starts"), &c.i64("stops")).unwrap();
        }
        (sig, c.f64("signals_out"), sig_in, n)
    }

    const POLY_CASES: [&str; 6] = [
        "filter_polynomial_order0",
        "filter_polynomial_order1",
        "filter_polynomial_order2",
        "filter_polynomial_order5",
        "filter_polynomial_order10",
        "filter_polynomial_order3_overlap_clamp",
    ];

    #[test]
    fn filter_polynomial_matches_toast() {
        for name in POLY_CASES {
            let (got, want, sig_in, _) = run_poly(name);
            // Samples TOAST leaves alone (no scan, all-flagged scans) are
            // untouched here too, bit for bit.
            for (i, ((g, w), x)) in got.iter().zip(&want).zip(&sig_in).enumerate() {
                if w.to_bits() == x.to_bits() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{name}: element {i}");
                }
            }
            // The rest to the solve's rounding, relative to the input's scale.
            let e = rel_err(&got, &want) * want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1.0)
                / sig_in.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            eprintln!("{name}: largest error / largest input {e:e}");
            assert!(e < 2e-14, "{name}: relative error {e:e}");
        }
    }

    #[test]
    fn filter_polynomial_order0_is_the_masked_mean() {
        // One template: the fit is the mean of the good samples, exactly
        // what pinv gives for a 1x1 normal matrix (n_good).
        let flags = [0u8, 1, 0, 0];
        let mut s = [1.0, 100.0, 2.0, 6.0];
        filter_polynomial(0, &flags, &mut [&mut s[..]], &[0], &[4]).unwrap();
        assert_eq!(s, [-2.0, 97.0, -1.0, 3.0]);
    }

    /// Order 150 on a scan of 500 samples: the templates' condition number
    /// is ~3e9, so the normal equations cannot solve it (their eigenvalue
    /// cut dropped the high orders: a residual 10% of the data larger than
    /// TOAST's). A signal that is a polynomial of the fit's order, with
    /// flagged samples off it, is then removed from its good samples to
    /// the accuracy TOAST's SVD gives (cond x eps of the data), from two
    /// signals at once, and the flagged samples keep their offset.
    #[test]
    fn an_ill_conditioned_fit_is_solved_as_toasts_svd_does() {
        let (n, order) = (500usize, 150i64);
        let norder = order as usize + 1;
        let dx = 2.0 / n as f64;
        let mut table = vec![0.0; norder * LEGENDRE_BLOCK];
        let mut poly = vec![0.0; n];
        for (ib, out) in poly.chunks_mut(LEGENDRE_BLOCK).enumerate() {
            legendre(
                norder,
                0.5 * dx - 1.0,
                dx,
                ib * LEGENDRE_BLOCK,
                out.len(),
                &mut table,
            );
            for (i, v) in out.iter_mut().enumerate() {
                // Low and high orders, each of size ~1.
                *v = [1, 7, 120, 149, 150]
                    .iter()
                    .map(|&k| table[k * LEGENDRE_BLOCK + i])
                    .sum();
            }
        }
        let flags: Vec<u8> = (0..n).map(|i| u8::from(i % 97 == 5)).collect();
        let mut a = poly.clone();
        let mut b: Vec<f64> = poly.iter().map(|v| -2.0 * v).collect();
        for (i, _) in flags.iter().enumerate().filter(|(_, &f)| f != 0) {
            a[i] += 10.0;
        }
        let scale = poly.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        filter_polynomial(
            order,
            &flags,
            &mut [&mut a[..], &mut b[..]],
            &[0],
            &[n as i64],
        )
        .unwrap();
        for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
            let want = if flags[i] != 0 { 10.0 } else { 0.0 };
            assert!((x - want).abs() < 1e-6 * scale, "a[{i}] = {x}");
            if flags[i] == 0 {
                assert!(y.abs() < 2e-6 * scale, "b[{i}] = {y}");
            }
        }
    }

    #[test]
    fn filter_poly2d_matches_toast() {
        for name in [
            "filter_poly2D_groups3_order2",
            "filter_poly2D_onegroup_order0",
            "filter_poly2D_groups2_order3",
        ] {
            let mut c = reference_case(name);
            let det_groups = c.i32("det_groups");
            let (templates, tshape) = c.shaped::<f64>("templates");
            let (signals, sshape) = c.shaped::<f64>("signals");
            let masks = c.u8("masks");
            let (mut coeff, cshape) = c.shaped::<f64>("coeff_in");
            let want = c.f64("coeff_out");
            filter_poly2d(
                sshape[0],
                sshape[1],
                cshape[1],
                tshape[1],
                &det_groups,
                &templates,
                &signals,
                &masks,
                &mut coeff,
            )
            .unwrap();
            // Per (sample, group): exact zeros where TOAST has them (no
            // good detector), the rest to the solve's rounding.
            let nm = tshape[1];
            let mut worst = 0.0f64;
            for (i, (g, w)) in coeff.chunks(nm).zip(want.chunks(nm)).enumerate() {
                if w.iter().all(|&x| x == 0.0) {
                    assert!(g.iter().all(|&x| x == 0.0), "{name}: block {i}: {g:?}");
                }
                worst = worst.max(rel_err(g, w));
            }
            eprintln!("{name}: largest relative error per block {worst:e}");
            assert!(worst < 1e-10, "{name}: relative error {worst:e}");
        }
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let in_pool = |threads: usize, f: &(dyn Fn() -> Vec<u64> + Sync)| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(f)
        };
        let bits = |x: &[f64]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let poly = || bits(&run_poly("filter_polynomial_order5").0);
        assert_eq!(in_pool(1, &poly), in_pool(4, &poly));
        let poly2d = || {
            let mut c = reference_case("filter_poly2D_groups3_order2");
            let (t, ts) = c.shaped::<f64>("templates");
            let (s, ss) = c.shaped::<f64>("signals");
            let (mut coeff, cs) = c.shaped::<f64>("coeff_in");
            let (g, m) = (c.i32("det_groups"), c.u8("masks"));
            filter_poly2d(ss[0], ss[1], cs[1], ts[1], &g, &t, &s, &m, &mut coeff).unwrap();
            bits(&coeff)
        };
        assert_eq!(in_pool(1, &poly2d), in_pool(4, &poly2d));
    }

    #[test]
    fn legendre_blocks_are_the_one_point_recurrence() {
        // TOAST's recurrence at one point, as written for a single x.
        let one = |x: f64, n: usize| {
            let mut p = vec![0.0; n];
            p[0] = 1.0;
            if n > 1 {
                p[1] = x;
            }
            for k in 2..n {
                let orderinv = 1.0 / k as f64;
                p[k] = ((2 * k - 1) as f64 * x * p[k - 1] - (k - 1) as f64 * p[k - 2]) * orderinv;
            }
            p
        };
        let (n, len) = (12, 1000);
        let dx = 2.0 / len as f64;
        let xstart = 0.5 * dx - 1.0;
        let mut table = vec![0.0; n * LEGENDRE_BLOCK];
        for first in (0..len).step_by(LEGENDRE_BLOCK) {
            let m = LEGENDRE_BLOCK.min(len - first);
            legendre(n, xstart, dx, first, m, &mut table);
            for i in 0..m {
                let want = one(xstart + (first + i) as f64 * dx, n);
                for (k, w) in want.iter().enumerate() {
                    assert_eq!(table[k * LEGENDRE_BLOCK + i].to_bits(), w.to_bits());
                }
            }
        }
    }

    #[test]
    fn poly2d_reused_decompositions_are_the_recomputed_ones() {
        // 64 modes, 2 groups of 25 detectors, masks that change in bursts and
        // come back: the whole call (decompositions reused between samples)
        // gives the bits of one call per sample (each decomposed afresh).
        let (n_samp, n_det, n_group, order) = (40usize, 50usize, 2usize, 7usize);
        let n_mode = (order + 1) * (order + 1);
        let mut templates = Vec::new();
        for d in 0..n_det {
            let (x, y) = ((d % 10) as f64 / 10.0 - 0.45, (d / 10) as f64 / 5.0 - 0.4);
            for i in 0..=order as i32 {
                for j in 0..=order as i32 {
                    templates.push(x.powi(i) * y.powi(j));
                }
            }
        }
        let groups: Vec<i32> = (0..n_det).map(|d| (d % n_group) as i32).collect();
        let mut masks = vec![1u8; n_samp * n_det];
        for s in 5..9 {
            masks[s * n_det + 3] = 0;
        }
        for s in 12..30 {
            masks[s * n_det + 10] = 0;
            masks[s * n_det + 11] = if s % 3 == 0 { 0 } else { 7 };
        }
        let signals: Vec<f64> = (0..n_samp * n_det)
            .map(|k| ((k * 37) % 101) as f64 / 7.0 - 5.0)
            .collect();
        let mut all = vec![0.0; n_samp * n_group * n_mode];
        filter_poly2d(
            n_samp, n_det, n_group, n_mode, &groups, &templates, &signals, &masks, &mut all,
        )
        .unwrap();
        let r = n_group * n_mode;
        for s in 0..n_samp {
            let mut one = vec![0.0; r];
            let (sig, msk) = (
                &signals[s * n_det..(s + 1) * n_det],
                &masks[s * n_det..(s + 1) * n_det],
            );
            filter_poly2d(
                1, n_det, n_group, n_mode, &groups, &templates, sig, msk, &mut one,
            )
            .unwrap();
            let bits = |x: &[f64]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&all[s * r..(s + 1) * r]), bits(&one), "sample {s}");
        }
    }

    #[test]
    fn jacobi_diagonalises() {
        let mut a = vec![4.0, 1.0, 2.0, 1.0, 3.0, 0.5, 2.0, 0.5, 5.0];
        let a0 = a.clone();
        let mut v = vec![0.0; 9];
        jacobi_eigen(3, &mut a, &mut v);
        // A V = V diag(l)
        for i in 0..3 {
            for k in 0..3 {
                let av: f64 = (0..3).map(|j| a0[k * 3 + j] * v[j * 3 + i]).sum();
                assert!((av - v[k * 3 + i] * a[i * 3 + i]).abs() < 1e-13);
            }
        }
    }

    #[test]
    fn clamping_follows_toast() {
        assert!(clamp_scan(5, 3, 10).is_none());
        let s = clamp_scan(-4, 20, 10).unwrap();
        assert_eq!((s.start, s.len), (0, 10));
        // a negative stop compares above n as unsigned, so it becomes n
        let s = clamp_scan(2, -1, 10).unwrap();
        assert_eq!((s.start, s.len), (2, 8));
        let s = clamp_scan(12, 20, 10);
        assert!(s.is_none());
    }
}
