//! Reference arithmetic that the CPU plugin and the host both run, written
//! once so that the two give the same bits by construction.
//!
//! [`cov_apply_pixel`] is one pixel of TOAST's `cov_apply_diag`: the CPU
//! plugin's `cov_apply_diag` kernel (backend-cpu) and the host-side
//! covariance application of toast-ops (`pixels::covariance::
//! apply_covariance`, the final maps and every CPU run) both call it, and
//! the device source (`device/kernels.h`, `toast_cov_apply_diag`) spells out
//! the same operations in the same order.

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
}
