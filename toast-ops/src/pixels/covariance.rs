//! The pixel-domain white-noise covariance: per-pixel inversion with a
//! condition-number cut, and application to a noise-weighted map. (The
//! hits and the inverse covariance are accumulated by the
//! `cov_accum_timestream` kernel, called by `ops::BuildHitMap` and
//! `ops::BuildInverseCovariance`.)
//!
//! The inverse covariance of a pixel is the symmetric `nnz × nnz` matrix
//! `Σ_samples w_det · p pᵀ` (`p` the Stokes weights of the sample, `w_det`
//! the detector's noise weight). It is stored, as in TOAST, as the upper
//! triangle row by row (`(0,0) (0,1) (0,2) (1,1) (1,2) (2,2)` for IQU), that
//! is `nnz (nnz + 1) / 2` values per pixel.
//!
//! [`invert_covariance`] follows TOAST's `cov_eigendecompose_diag`: an
//! eigendecomposition of each pixel's matrix (here by cyclic Jacobi
//! rotations, which are exact to rounding for these tiny matrices and need
//! no LAPACK), `rcond = λ_min / λ_max` (0 when `λ_max <= 0`), and the
//! inverse `V diag(1/λ) Vᵀ` when `rcond >= threshold`; otherwise, and for
//! unhit pixels, the pixel is cut: its covariance and its rcond are set to
//! zero (TOAST's rcond map holds only the kept pixels' values). For
//! `nnz = 1` TOAST takes a shortcut that we keep: `rcond = 1` everywhere and
//! the value is inverted where it is non-zero. [`apply_covariance`] is
//! `cov_apply_diag`: `m = C z` per pixel, with the per-pixel arithmetic of
//! the CPU plugin's `cov_apply_diag` kernel (`toast_accel::math`); a pixel
//! whose map values are all zero (an unhit pixel) is left at `+0` without
//! reading its covariance, the same bits for a finite covariance, which
//! makes the map-maker's 25 applications cost a pass over the map alone.
//!
//! Every pixel is independent, so the inversion and the application run in
//! parallel over pixels and give the same bits for any thread count.

use crate::pixels::PixelData;
use rayon::prelude::*;
use std::sync::Arc;
use toast_accel::math::cov_apply_pixel;
use toast_core::OpError;

/// Values per pixel of a packed symmetric `nnz × nnz` matrix.
pub fn block_size(nnz: usize) -> usize {
    nnz * (nnz + 1) / 2
}

/// The `nnz` of a packed matrix with `block` values per pixel, if any.
pub fn nnz_of_block(block: usize) -> Option<usize> {
    (1..=16).find(|&n| block_size(n) == block)
}

/// Unpack a packed symmetric block into a full row-major matrix.
fn unpack(packed: &[f64], nnz: usize, full: &mut [f64]) {
    let mut off = 0;
    for j in 0..nnz {
        for k in j..nnz {
            full[j * nnz + k] = packed[off];
            full[k * nnz + j] = packed[off];
            off += 1;
        }
    }
}

/// Eigenvalues and eigenvectors of a symmetric matrix by cyclic Jacobi
/// rotations. `a` (row-major `n × n`) is destroyed; on return `evals` holds
/// the eigenvalues and the columns of `v` the eigenvectors. Returns false if
/// the iteration did not converge (or met a non-finite value).
pub fn jacobi_eigen(a: &mut [f64], n: usize, evals: &mut [f64], v: &mut [f64]) -> bool {
    for (i, x) in v.iter_mut().enumerate() {
        *x = if i / n == i % n { 1.0 } else { 0.0 };
    }
    if a.iter().any(|x| !x.is_finite()) {
        return false;
    }
    let mut converged = false;
    for _sweep in 0..64 {
        let mut off = 0.0;
        let mut diag = 0.0;
        for p in 0..n {
            diag += a[p * n + p] * a[p * n + p];
            for q in p + 1..n {
                off += a[p * n + q] * a[p * n + q];
            }
        }
        if off == 0.0 || off <= 1e-34 * diag {
            converged = true;
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a[p * n + q];
                if apq == 0.0 {
                    continue;
                }
                let app = a[p * n + p];
                let aqq = a[q * n + q];
                let theta = 0.5 * (aqq - app) / apq;
                let mut t = 1.0 / (theta.abs() + (theta * theta + 1.0).sqrt());
                if theta < 0.0 {
                    t = -t;
                }
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                a[p * n + p] = app - t * apq;
                a[q * n + q] = aqq + t * apq;
                a[p * n + q] = 0.0;
                a[q * n + p] = 0.0;
                for r in 0..n {
                    if r != p && r != q {
                        let arp = a[r * n + p];
                        let arq = a[r * n + q];
                        let np = c * arp - s * arq;
                        let nq = s * arp + c * arq;
                        a[r * n + p] = np;
                        a[p * n + r] = np;
                        a[r * n + q] = nq;
                        a[q * n + r] = nq;
                    }
                }
                for r in 0..n {
                    let vrp = v[r * n + p];
                    let vrq = v[r * n + q];
                    v[r * n + p] = c * vrp - s * vrq;
                    v[r * n + q] = s * vrp + c * vrq;
                }
            }
        }
    }
    for (i, e) in evals.iter_mut().enumerate() {
        *e = a[i * n + i];
    }
    converged && evals.iter().all(|e| e.is_finite())
}

/// Invert one packed block in place; returns its rcond (see the module doc).
fn invert_block(block: &mut [f64], nnz: usize, threshold: f64) -> f64 {
    if nnz == 1 {
        if block[0] != 0.0 {
            block[0] = 1.0 / block[0];
        }
        return 1.0;
    }
    let mut a = [0.0f64; 256];
    let mut v = [0.0f64; 256];
    let mut evals = [0.0f64; 16];
    let a = &mut a[..nnz * nnz];
    let v = &mut v[..nnz * nnz];
    let evals = &mut evals[..nnz];
    unpack(block, nnz, a);
    let mut rcond = 0.0;
    if jacobi_eigen(a, nnz, evals, v) {
        let emin = evals.iter().copied().fold(1.0e100, f64::min);
        let emax = evals.iter().copied().fold(0.0, f64::max);
        if emax > 0.0 {
            rcond = emin / emax;
        }
        if rcond >= threshold && emin > 0.0 {
            let mut off = 0;
            for j in 0..nnz {
                for k in j..nnz {
                    let mut x = 0.0;
                    for (m, e) in evals.iter().enumerate() {
                        x += v[j * nnz + m] * v[k * nnz + m] / e;
                    }
                    block[off] = x;
                    off += 1;
                }
            }
            return rcond;
        }
    }
    // A cut pixel reports rcond 0, as TOAST's `cov_eigendecompose_diag`.
    block.iter_mut().for_each(|x| *x = 0.0);
    0.0
}

/// Invert every pixel's packed covariance in place, cutting (zeroing) the
/// pixels whose rcond is below `threshold`; returns the rcond map.
pub fn invert_covariance(
    cov: &mut PixelData<f64>,
    threshold: f64,
) -> Result<PixelData<f64>, OpError> {
    let block = cov.n_value();
    let nnz = nnz_of_block(block).ok_or_else(|| OpError::InvalidData {
        what: format!(
            "a covariance with {block} values per pixel is not a packed symmetric matrix"
        ),
    })?;
    let mut rcond = PixelData::<f64>::try_new(Arc::clone(cov.distribution()), 1, "rcond")?;
    cov.data_mut()
        .par_chunks_mut(block)
        .zip(rcond.data_mut().par_iter_mut())
        .with_min_len(1024)
        .for_each(|(b, r)| {
            // An all-zero block (a pixel no sample hit) is cut: it stays
            // zero with rcond 0, which it already is, so neither is written
            // and the pages of unhit pixels stay unmapped (nnz = 1 reports
            // rcond 1 for every pixel, as TOAST does).
            if nnz > 1 && b.iter().all(|x| x.to_bits() == 0) {
                return;
            }
            *r = invert_block(b, nnz, threshold);
        });
    Ok(rcond)
}

/// `map = cov · map` per pixel (TOAST's `cov_apply_diag`).
pub fn apply_covariance(cov: &PixelData<f64>, map: &mut PixelData<f64>) -> Result<(), OpError> {
    let nnz = map.n_value();
    if nnz == 0 || nnz > 16 {
        return Err(OpError::InvalidData {
            what: format!(
            "cannot apply a covariance to a map with {nnz} values per pixel (1 to 16 supported)"
        ),
        });
    }
    if cov.n_value() != block_size(nnz) {
        return Err(OpError::InvalidData {
            what: format!(
            "cannot apply a covariance with {} values per pixel to a map with {nnz} values per \
             pixel (expected {})",
            cov.n_value(),
            block_size(nnz)
        ),
        });
    }
    if cov.distribution() != map.distribution() {
        return Err(OpError::InvalidData {
            what: "the covariance and the map have different pixel distributions".into(),
        });
    }
    let block = cov.n_value();
    if let Some(support) = map.support().cloned() {
        // A confined map is +0 outside its support, where `C · 0` would
        // give +0 again: only the support's pixels are visited.
        let c = cov.data();
        let cov_of = |p: usize| &c[p * block..(p + 1) * block];
        let (m, pixels) = (map.data_mut(), support.pixels());
        use super::support::for_each_support_pixel as each;
        // The common sizes with a constant length, as below.
        match nnz {
            1 => each(m, nnz, pixels, |p, m| apply_pixel(&mut m[..1], cov_of(p))),
            3 => each(m, nnz, pixels, |p, m| apply_pixel(&mut m[..3], cov_of(p))),
            _ => each(m, nnz, pixels, |p, m| apply_pixel(m, cov_of(p))),
        }
        return Ok(());
    }
    let pairs = map
        .data_mut()
        .par_chunks_mut(nnz)
        .zip(cov.data().par_chunks(block))
        .with_min_len(1024);
    // The common sizes with a constant length (unrolled; the same operations
    // in the same order, so the same bits as the generic call).
    match nnz {
        1 => pairs.for_each(|(m, c)| apply_pixel(&mut m[..1], c)),
        3 => pairs.for_each(|(m, c)| apply_pixel(&mut m[..3], c)),
        _ => pairs.for_each(|(m, c)| apply_pixel(m, c)),
    }
    Ok(())
}

/// [`cov_apply_pixel`] for one pixel, skipping the pixels whose map values
/// are all zero (every unhit pixel, most of the local pixels of a small
/// scan): there `C · 0` is `+0` in every component for a finite `C`
/// (`0.0 + c·(±0) = +0`), so they are set to `+0` without reading their
/// covariance. A covariance that is NaN or infinite at a pixel where the
/// map is zero would give NaN in the product; [`invert_covariance`] never
/// leaves one (its blocks are inverses of positive-definite matrices or
/// cut to zero).
#[inline(always)]
fn apply_pixel(m: &mut [f64], c: &[f64]) {
    if m.iter().all(|&x| x == 0.0) {
        // Only a -0 needs a write (clean cache lines stay clean).
        for x in m.iter_mut().filter(|x| x.to_bits() != 0) {
            *x = 0.0;
        }
        return;
    }
    cov_apply_pixel(m, c);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pixels::PixelDistribution;

    fn dist() -> Arc<PixelDistribution> {
        Arc::new(PixelDistribution::new(8, 2, &[1]).unwrap())
    }

    #[test]
    fn jacobi_recovers_a_known_decomposition() {
        // A = R diag(4, 1, 0.25) Rᵀ for a rotation R.
        let (c, s) = (0.6f64, 0.8f64);
        let r = [
            c,
            -s,
            0.0,
            s * 0.5,
            c * 0.5,
            -0.75f64.sqrt(),
            s * 0.75f64.sqrt(),
            c * 0.75f64.sqrt(),
            0.5,
        ];
        let d = [4.0, 1.0, 0.25];
        let mut a = [0.0; 9];
        for i in 0..3 {
            for j in 0..3 {
                a[i * 3 + j] = (0..3).map(|k| r[i * 3 + k] * d[k] * r[j * 3 + k]).sum();
            }
        }
        let orig = a;
        let mut ev = [0.0; 3];
        let mut v = [0.0; 9];
        assert!(jacobi_eigen(&mut a, 3, &mut ev, &mut v));
        let mut sorted = ev;
        sorted.sort_by(f64::total_cmp);
        for (e, x) in sorted.iter().zip([0.25, 1.0, 4.0]) {
            assert!((e - x).abs() < 1e-14, "{sorted:?}");
        }
        // A v = λ v
        for m in 0..3 {
            for i in 0..3 {
                let av: f64 = (0..3).map(|k| orig[i * 3 + k] * v[k * 3 + m]).sum();
                assert!((av - ev[m] * v[i * 3 + m]).abs() < 1e-13);
            }
        }
    }

    #[test]
    fn invert_and_apply_round_trip() {
        let mut cov = PixelData::<f64>::new(dist(), 6);
        // Pixel 0: well conditioned; pixel 1: singular (one direction only);
        // pixel 2: unhit; pixel 3: diagonal.
        let p0 = [3.0, 0.5, -0.2, 2.0, 0.1, 1.5];
        let p1 = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0];
        let p3 = [2.0, 0.0, 0.0, 4.0, 0.0, 8.0];
        cov.data_mut()[0..6].copy_from_slice(&p0);
        cov.data_mut()[6..12].copy_from_slice(&p1);
        cov.data_mut()[18..24].copy_from_slice(&p3);
        let inv = cov.clone();
        let rcond = invert_covariance(&mut cov, 1e-3).unwrap();
        let r = rcond.data();
        assert!(r[0] > 0.1 && r[0] <= 1.0);
        assert_eq!(r[1], 0.0, "a cut pixel reports rcond 0");
        assert_eq!(r[2], 0.0);
        assert!((r[3] - 0.25).abs() < 1e-15);
        assert!(
            cov.data()[6..18].iter().all(|&x| x == 0.0),
            "cut pixels zeroed"
        );
        let d3 = &cov.data()[18..24];
        for (x, e) in d3.iter().zip([0.5, 0.0, 0.0, 0.25, 0.0, 0.125]) {
            assert!((x - e).abs() < 1e-15);
        }
        // C⁻¹ applied to C z gives z back on the good pixel.
        let mut m = PixelData::<f64>::new(dist(), 3);
        m.data_mut()[0..3].copy_from_slice(&[1.0, -2.0, 0.5]);
        apply_covariance(&inv, &mut m).unwrap();
        apply_covariance(&cov, &mut m).unwrap();
        for (x, e) in m.data()[0..3].iter().zip([1.0, -2.0, 0.5]) {
            assert!((x - e).abs() < 1e-14, "{:?}", &m.data()[0..3]);
        }
        assert!(apply_covariance(&rcond, &mut m).is_err());
    }

    #[test]
    fn zero_map_pixels_match_the_full_product() {
        // Pixels with an all-zero map (±0) give the bits of cov_apply_pixel
        // (+0), whatever their finite covariance; the others are the product.
        let d = dist();
        for nnz in [1usize, 3, 4] {
            let mut cov = PixelData::<f64>::new(d.clone(), block_size(nnz));
            for (i, c) in cov.data_mut().iter_mut().enumerate() {
                *c = ((i * 7 + 3) % 11) as f64 - 5.5;
            }
            let mut map = PixelData::<f64>::new(d.clone(), nnz);
            for (p, px) in map.data_mut().chunks_mut(nnz).enumerate() {
                for (k, x) in px.iter_mut().enumerate() {
                    *x = match p {
                        0 => 0.0,
                        1 => -0.0,
                        2 if k == 0 => -0.0,
                        2 => 0.0,
                        _ => (k as f64 + 1.5) * if k % 2 == 0 { 1.0 } else { -0.0 },
                    };
                }
            }
            let mut want = map.data().to_vec();
            for (m, c) in want.chunks_mut(nnz).zip(cov.data().chunks(block_size(nnz))) {
                cov_apply_pixel(m, c);
            }
            apply_covariance(&cov, &mut map).unwrap();
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(map.data()), bits(&want), "nnz {nnz}");
            assert!(map.data()[..nnz].iter().all(|x| x.to_bits() == 0));
        }
    }

    #[test]
    fn nnz_one_is_toast_shortcut() {
        let mut cov = PixelData::<f64>::new(dist(), 1);
        cov.data_mut()[0] = 4.0;
        let rcond = invert_covariance(&mut cov, 0.5).unwrap();
        assert_eq!(cov.data(), &[0.25, 0.0, 0.0, 0.0]);
        assert_eq!(rcond.data(), &[1.0; 4]);
    }
}
