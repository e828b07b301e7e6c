//! Reference arithmetic that the CPU plugin and the host both run, written
//! once so that the two give the same bits by construction.
//!
//! [`cov_apply_pixel`] is one pixel of TOAST's `cov_apply_diag`: the CPU
//! plugin's `cov_apply_diag` kernel (backend-cpu) and the host-side
//! covariance application of toast-ops (`pixels::covariance::
//! apply_covariance`, the final maps and every CPU run) both call it, and
//! the device source (`device/kernels.h`, `toast_cov_apply_diag`) spells out
//! the same operations in the same order.
//!
//! [`flagged_dot`] and [`axpby`] are the PCG solver's vector arithmetic
//! (`amp_dot` per block, `amp_axpby`): the CPU plugin's kernels and the
//! map-maker's host path (toast-ops `mapmaker::solve`, every CPU run) both
//! call them.
//!
//! [`qa_rotate`] and [`stokes_alpha`] are the quaternion rotation and the
//! polarisation angle of TOAST's pointing kernels (`hpix_qa_rotate`,
//! `stokes_weights_alpha`): the CPU plugin's `pixels_healpix` and
//! `stokes_weights_*` kernels and the map-maker's compact-pointing path
//! (toast-ops `ops::pointing_compact`, its exact fallback) both call them.
//!
//! [`rng`] is TOAST's noise generator (Threefry-2x64-20, `u01`, Giles'
//! erfinv): the CPU plugin's `sim_noise` kernel and the host's workloads.

pub mod rng;

/// The most map components [`cov_apply_pixel`] takes.
pub const COV_MAX_NNZ: usize = 16;

/// `m ← C m` for one pixel of `nnz = m.len()` components (at most
/// [`COV_MAX_NNZ`]), `C` the packed symmetric matrix `c` row by row
/// (`(0,0) (0,1) .. (1,1) ..`, `nnz (nnz + 1) / 2` values), in TOAST's
/// order: `t[j] += C[jk] m[k]`, and `t[k] += C[jk] m[j]` off the diagonal.
/// Inlined, so a constant `m.len()` at the call site unrolls the loops.
///
/// # Panics
/// If `m` has more than [`COV_MAX_NNZ`] values or `c` fewer than
/// `nnz (nnz + 1) / 2` (callers validate both first).
#[inline(always)]
pub fn cov_apply_pixel(m: &mut [f64], c: &[f64]) {
    let nnz = m.len();
    let mut t = [0.0f64; COV_MAX_NNZ];
    let mut off = 0;
    for j in 0..nnz {
        for k in j..nnz {
            t[j] += c[off] * m[k];
            if k != j {
                t[k] += c[off] * m[j];
            }
            off += 1;
        }
    }
    m.copy_from_slice(&t[..nnz]);
}

/// `Σ a_i b_i` over the entries with `flags_i == 0`, in index order from
/// 0.0, skipping flagged entries (a NaN there never reaches the sum).
pub fn flagged_dot(a: &[f64], b: &[f64], flags: &[u8]) -> f64 {
    let mut s = 0.0;
    for ((x, y), f) in a.iter().zip(b).zip(flags) {
        if *f == 0 {
            s += x * y;
        }
    }
    s
}

/// The entries of block `k` when `n` entries are cut into `nblock`
/// consecutive blocks of `ceil(n / nblock)` (`amp_dot`'s blocks; empty past
/// the end).
pub fn dot_block(k: usize, n: usize, nblock: usize) -> std::ops::Range<usize> {
    let chunk = n.div_ceil(nblock.max(1)).max(1);
    let lo = k.saturating_mul(chunk).min(n);
    lo..(lo + chunk).min(n)
}

/// `y_i ← (α x_i) + (β y_i)`, each product rounded, then the sum; with
/// `β == 0`, `y_i ← α x_i` (`y` is not read, as in BLAS: a copy when
/// `α == 1`, whatever `y` held, signed zeros included).
pub fn axpby(alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
    if beta == 0.0 {
        for (yi, xi) in y.iter_mut().zip(x) {
            *yi = alpha * xi;
        }
    } else {
        for (yi, xi) in y.iter_mut().zip(x) {
            *yi = alpha * xi + beta * *yi;
        }
    }
}

/// `hpix_qa_rotate(q, v)` (TOAST's C), every term kept (multiplications by
/// 0 and 1 included) so that signed zeros, infinities and NaNs propagate as
/// in C. `q` is `[x, y, z, w]` of unit norm (its first four values are read).
#[inline(always)]
pub fn qa_rotate(q: &[f64], v: &[f64; 3]) -> [f64; 3] {
    let xw = q[3] * q[0];
    let yw = q[3] * q[1];
    let zw = q[3] * q[2];
    let x2 = -q[0] * q[0];
    let xy = q[0] * q[1];
    let xz = q[0] * q[2];
    let y2 = -q[1] * q[1];
    let yz = q[1] * q[2];
    let z2 = -q[2] * q[2];
    [
        2.0 * ((y2 + z2) * v[0] + (xy - zw) * v[1] + (yw + xz) * v[2]) + v[0],
        2.0 * ((zw + xy) * v[0] + (x2 + z2) * v[1] + (yz - xw) * v[2]) + v[1],
        2.0 * ((xz - yw) * v[0] + (xw + yz) * v[1] + (x2 + y2) * v[2]) + v[2],
    ]
}

/// The polarisation angle `alpha` of TOAST's `stokes_weights_alpha` for the
/// detector quaternion `q` (FORMAT.md section 4), with its `atan2`, `cos`
/// and `sin`, in TOAST's operation order.
#[inline(always)]
pub fn stokes_alpha(q: &[f64]) -> f64 {
    let vd = qa_rotate(q, &[0.0, 0.0, 1.0]);
    let vo = qa_rotate(q, &[1.0, 0.0, 0.0]);
    let ang_xy = vd[1].atan2(vd[0]);
    let vm_x = vd[2] * ang_xy.cos();
    let vm_y = vd[2] * ang_xy.sin();
    let vm_z = -(1.0 - vd[2] * vd[2]).sqrt();
    let alpha_y = vd[0] * (vm_y * vo[2] - vm_z * vo[1]) - vd[1] * (vm_x * vo[2] - vm_z * vo[0])
        + vd[2] * (vm_x * vo[1] - vm_y * vo[0]);
    let alpha_x = vm_x * vo[0] + vm_y * vo[1] + vm_z * vo[2];
    alpha_y.atan2(alpha_x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_symmetric_product() {
        // C = [[2, 1, 0], [1, 3, -1], [0, -1, 4]], m = (1, 2, 3).
        let c = [2.0, 1.0, 0.0, 3.0, -1.0, 4.0];
        let mut m = [1.0, 2.0, 3.0];
        cov_apply_pixel(&mut m, &c);
        assert_eq!(m, [4.0, 4.0, 10.0]);
        let mut one = [3.0];
        cov_apply_pixel(&mut one, &[0.5]);
        assert_eq!(one, [1.5]);
    }

    #[test]
    fn flagged_dot_skips_flags_and_axpby_copies_on_beta_zero() {
        let a = [1.0, f64::NAN, 3.0];
        let b = [2.0, 5.0, -1.0];
        assert_eq!(super::flagged_dot(&a, &b, &[0, 1, 0]), -1.0);
        let mut y = [f64::NAN, 1.0, 2.0];
        super::axpby(1.0, &[-0.0, 4.0, 5.0], 0.0, &mut y);
        assert!(y[0] == 0.0 && y[0].is_sign_negative());
        assert_eq!(&y[1..], &[4.0, 5.0]);
        super::axpby(0.5, &[2.0, 2.0, 2.0], 2.0, &mut y);
        assert_eq!(&y[1..], &[9.0, 11.0]);
    }
}
