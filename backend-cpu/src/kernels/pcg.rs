//! The PCG solver's amplitude-vector kernels (not TOAST registry kernels;
//! FORMAT.md section 16): `amp_dot`, a flagged dot product as ordered
//! per-block partial sums, and `amp_axpby`, `y ← αx + βy`.
//!
//! Both are exact: each partial sum is the sequential sum of its block in
//! index order (blocks run in parallel, each block on one thread), so the
//! result does not depend on the thread count, and with one block it is
//! the plain sequential dot product the map-maker always computed on the
//! host. `amp_axpby` rounds `αx`, `βy`, then their sum, per element
//! (`y ← αx` when `β == 0`). The arithmetic is `toast_accel::math`'s, which
//! the map-maker's host path calls too.

use crate::arrays::{self, Arg};
use rayon::prelude::*;
use toast_accel::abi::{AmpAxpbyArgs, AmpDotArgs};
use toast_accel::check::AmpDot;
use toast_accel::math::{axpby, dot_block, flagged_dot};
use toast_accel::plugin_support::PluginError;

/// The `amp_dot` entry: `partials[k]` the flagged dot product of block `k`.
///
/// # Safety
/// `a` has passed `check_amp_dot` (giving `v`) and its arrays are host
/// memory of the stated lengths.
pub(crate) unsafe fn run_dot(v: &AmpDot, a: &AmpDotArgs) -> Result<(), PluginError> {
    const K: &str = "amp_dot";
    arrays::check_disjoint(
        K,
        &[Arg::new::<f64>("partials", a.partials)],
        &[
            Arg::new::<f64>("a", a.a),
            Arg::new::<f64>("b", a.b),
            Arg::new::<u8>("flags", a.flags),
        ],
    )?;
    // SAFETY: host arrays of the validated lengths; `partials`, the only
    // output, overlaps nothing else (checked above).
    let (x, y, flags, partials) = unsafe {
        (
            arrays::input::<f64>(K, "a", a.a)?,
            arrays::input::<f64>(K, "b", a.b)?,
            arrays::input::<u8>(K, "flags", a.flags)?,
            arrays::output::<f64>(K, "partials", a.partials)?,
        )
    };
    partials.par_iter_mut().enumerate().for_each(|(k, p)| {
        let r = dot_block(k, v.n, v.nblock);
        *p = flagged_dot(&x[r.clone()], &y[r.clone()], &flags[r]);
    });
    Ok(())
}

/// The `amp_axpby` entry: `y_i ← (α x_i) + (β y_i)`.
///
/// # Safety
/// `a` has passed `check_amp_axpby` and its arrays are host memory of the
/// stated lengths.
pub(crate) unsafe fn run_axpby(a: &AmpAxpbyArgs) -> Result<(), PluginError> {
    const K: &str = "amp_axpby";
    arrays::check_disjoint(
        K,
        &[Arg::new::<f64>("y", a.y)],
        &[Arg::new::<f64>("x", a.x)],
    )?;
    // SAFETY: host arrays of the validated lengths; `y`, the only output,
    // overlaps nothing else (checked above).
    let (x, y) = unsafe {
        (
            arrays::input::<f64>(K, "x", a.x)?,
            arrays::output::<f64>(K, "y", a.y)?,
        )
    };
    let (alpha, beta) = (a.alpha, a.beta);
    y.par_chunks_mut(4096)
        .zip(x.par_chunks(4096))
        .for_each(|(yc, xc)| axpby(alpha, xc, beta, yc));
    Ok(())
}
