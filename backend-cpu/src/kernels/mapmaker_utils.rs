//! cov_accum_diag_hits and cov_accum_diag_invnpp: accumulate the hit map and
//! the diagonal inverse pixel-noise covariance (TOAST 3.0.6's
//! `toast::cov_accum_diag_hits` / `toast::cov_accum_diag_invnpp`, libtoast
//! `toast_map_cov.cpp`; `tests/data/toast-kernels/FORMAT.md`, sections 11-12).
//!
//! Plain functions over slices, and the plugin's entries ([`run_hits`],
//! [`run_invnpp`]) that call them. Deterministic parallel accumulation as in
//! `mapmaker.rs`: the flat local pixel axis is split into one range per task;
//! every task walks all samples in order and accumulates only the samples of
//! its pixels, so every element is summed in sample order, bit-identical to
//! TOAST's one-thread run for any thread count.
//!
//! [`run_apply`] is `cov_apply_diag` (`toast::cov_apply_diag`, FORMAT.md
//! section 15): `vec ← mat · vec` per pixel. Pixels are independent, so it
//! runs in parallel over pixels with the same bits for any thread count.

use crate::arrays::{self, Arg};
use crate::par::{first_fault, SampleFault, SharedMut, TaskResult};
use rayon::prelude::*;
use toast_accel::abi::{CovAccumDiagHitsArgs, CovAccumDiagInvnppArgs, CovApplyDiagArgs};
use toast_accel::check::{CovAccum, CovApply};
use toast_accel::math::cov_apply_pixel;
use toast_accel::plugin_support::PluginError;

/// The `cov_accum_diag_hits` entry.
///
/// # Safety
/// `a` has passed `check_cov_accum_diag_hits` (giving `v`) and its arrays
/// are host memory of the stated lengths.
pub(crate) unsafe fn run_hits(v: &CovAccum, a: &CovAccumDiagHitsArgs) -> Result<(), PluginError> {
    const K: &str = "cov_accum_diag_hits";
    if !v.active {
        return Ok(());
    }
    // SAFETY: host arrays of the validated lengths; `hits` is the only output.
    let (submap, subpix, hits) = unsafe {
        (
            arrays::input::<i64>(K, "submap", a.submap)?,
            arrays::input::<i64>(K, "subpix", a.subpix)?,
            arrays::output::<i64>(K, "hits", a.hits)?,
        )
    };
    cov_accum_diag_hits(v.nsub, v.nsubpix, a.nnz, submap, subpix, hits)
}

/// The `cov_accum_diag_invnpp` entry.
///
/// # Safety
/// As [`run_hits`], for `check_cov_accum_diag_invnpp`.
pub(crate) unsafe fn run_invnpp(
    v: &CovAccum,
    a: &CovAccumDiagInvnppArgs,
) -> Result<(), PluginError> {
    const K: &str = "cov_accum_diag_invnpp";
    if !v.active {
        return Ok(());
    }
    // SAFETY: host arrays of the validated lengths; `invnpp` is the only output.
    let (submap, subpix, weights, invnpp) = unsafe {
        (
            arrays::input::<i64>(K, "submap", a.submap)?,
            arrays::input::<i64>(K, "subpix", a.subpix)?,
            arrays::input::<f64>(K, "weights", a.weights)?,
            arrays::output::<f64>(K, "invnpp", a.invnpp)?,
        )
    };
    cov_accum_diag_invnpp(
        v.nsub, v.nsubpix, a.nnz, submap, subpix, weights, a.scale, invnpp,
    )
}

/// The `cov_apply_diag` entry: `vec ← mat · vec` at every local pixel,
/// `mat` the packed symmetric matrix (row by row), in TOAST's operation
/// order ([`cov_apply_pixel`], shared with the host path of toast-ops).
///
/// # Safety
/// `a` has passed `check_cov_apply_diag` (giving `v`) and its arrays are
/// host memory of the stated lengths.
pub(crate) unsafe fn run_apply(v: &CovApply, a: &CovApplyDiagArgs) -> Result<(), PluginError> {
    const K: &str = "cov_apply_diag";
    if !v.active {
        return Ok(());
    }
    arrays::check_disjoint(
        K,
        &[Arg::new::<f64>("vec", a.vec)],
        &[Arg::new::<f64>("mat", a.mat)],
    )?;
    // SAFETY: host arrays of the validated lengths; `vec`, the only output,
    // overlaps nothing else (checked above).
    let (mat, vec) = unsafe {
        (
            arrays::input::<f64>(K, "mat", a.mat)?,
            arrays::output::<f64>(K, "vec", a.vec)?,
        )
    };
    vec.par_chunks_mut(v.nnz)
        .zip(mat.par_chunks(v.block))
        .with_min_len(1024)
        .for_each(|(m, c)| cov_apply_pixel(m, c));
    Ok(())
}

/// The fault of sample `i`, whose `submap` or `subpix` is beyond the local
/// map (out of the per-sample loop: it is met at most once).
#[cold]
#[inline(never)]
fn beyond_the_map(nsub: i64, nsubpix: i64, submap: i64, subpix: i64, i: usize) -> SampleFault {
    SampleFault::new(
        0,
        0,
        i,
        format!(
            "submap {submap}, pixel {subpix} is beyond the local map \
             ({nsub} submaps x {nsubpix} pixels)"
        ),
    )
}

fn check_common(
    kernel: &str,
    nsub: i64,
    nsubpix: i64,
    submap: &[i64],
    subpix: &[i64],
    (out_name, out_len): (&str, usize),
    per_pixel: usize,
) -> Result<usize, PluginError> {
    if nsubpix < 1 {
        return Err(PluginError::invalid(format!(
            "{kernel}: nsubpix must be positive (it is {nsubpix})"
        )));
    }
    if submap.len() != subpix.len() {
        return Err(PluginError::invalid(format!(
            "{kernel}: submap has {} samples and subpix {}",
            submap.len(),
            subpix.len()
        )));
    }
    let npix = (nsub as u64)
        .checked_mul(nsubpix as u64)
        .and_then(|n| n.checked_mul(per_pixel as u64))
        .filter(|&n| n <= out_len as u64)
        .ok_or_else(|| {
            PluginError::invalid(format!(
                "{kernel}: {out_name} has {out_len} elements, fewer than {nsub} submaps x \
                 {nsubpix} pixels x {per_pixel}"
            ))
        })?;
    Ok(npix as usize / per_pixel)
}

/// Call `f(i, hpx, out)` for every sample `i` TOAST accumulates, in sample
/// order per pixel: `out` is the `per_pixel` elements of flat pixel `hpx`.
/// The pixels are split into one range per task; each task walks every
/// sample and takes those of its pixels, so each element is written by one
/// task, in sample order, and every task meets the same first fault.
#[allow(clippy::too_many_arguments)]
fn accumulate<T: Send, F>(
    kernel: &str,
    nsub: i64,
    nsubpix: i64,
    submap: &[i64],
    subpix: &[i64],
    out: &mut [T],
    per_pixel: usize,
    f: F,
) -> Result<(), PluginError>
where
    F: Fn(usize, &mut [T]) + Sync,
{
    let npix = out.len() / per_pixel;
    let parts = rayon::current_num_threads().clamp(1, npix.max(1));
    let shared = SharedMut::new(out);
    (0..parts)
        .into_par_iter()
        .map(|t| -> TaskResult {
            let (lo, hi) = (t * npix / parts, (t + 1) * npix / parts);
            for (i, (&sm, &px)) in submap.iter().zip(subpix).enumerate() {
                // A negative submap (not local) or pixel (flagged): skipped,
                // as TOAST skips it.
                if sm < 0 || px < 0 {
                    continue;
                }
                if sm >= nsub || px >= nsubpix {
                    return Err(beyond_the_map(nsub, nsubpix, sm, px, i));
                }
                let hpx = (sm * nsubpix + px) as usize;
                if hpx < lo || hpx >= hi {
                    continue;
                }
                // SAFETY: only the task owning pixels [lo, hi) touches them.
                f(i, unsafe { shared.slice_mut(hpx * per_pixel, per_pixel) });
            }
            Ok(())
        })
        .reduce(|| Ok(()), first_fault)
        .map_err(|f| super::fault_error(kernel, f))
}

/// `hits[submap[i] * nsubpix + subpix[i]] += 1` for every sample with a
/// non-negative submap and pixel. `nnz` is unused (TOAST takes it); with
/// `nsub < 1` nothing is read or written (TOAST returns at once).
pub(crate) fn cov_accum_diag_hits(
    nsub: i64,
    nsubpix: i64,
    _nnz: i64,
    submap: &[i64],
    subpix: &[i64],
    hits: &mut [i64],
) -> Result<(), PluginError> {
    const K: &str = "cov_accum_diag_hits";
    if nsub < 1 {
        return Ok(());
    }
    let npix = check_common(K, nsub, nsubpix, submap, subpix, ("hits", hits.len()), 1)?;
    accumulate(
        K,
        nsub,
        nsubpix,
        submap,
        subpix,
        &mut hits[..npix],
        1,
        |_, h| {
            h[0] += 1;
        },
    )
}

/// Accumulate `scale * w wᵀ` (the lower triangle, row by row: `(j, k)` for
/// `j <= k`) into pixel `submap[i] * nsubpix + subpix[i]` of `invnpp`, for
/// every sample with a non-negative submap and pixel, as TOAST does:
/// `invnpp[.., jk] += w[k] * (w[j] * scale)`. With `nsub < 1` nothing is
/// read or written.
#[allow(clippy::too_many_arguments)]
pub(crate) fn cov_accum_diag_invnpp(
    nsub: i64,
    nsubpix: i64,
    nnz: i64,
    submap: &[i64],
    subpix: &[i64],
    weights: &[f64],
    scale: f64,
    invnpp: &mut [f64],
) -> Result<(), PluginError> {
    const K: &str = "cov_accum_diag_invnpp";
    if nsub < 1 {
        return Ok(());
    }
    if nnz < 1 {
        return Err(PluginError::invalid(format!(
            "{K}: nnz must be positive (it is {nnz})"
        )));
    }
    let nnz = nnz as usize;
    let block = nnz * (nnz + 1) / 2;
    let npix = check_common(
        K,
        nsub,
        nsubpix,
        submap,
        subpix,
        ("invnpp", invnpp.len()),
        block,
    )?;
    if weights.len() / nnz != submap.len() {
        return Err(PluginError::invalid(format!(
            "{K}: weights has {} elements for {} samples of nnz = {nnz}",
            weights.len(),
            submap.len()
        )));
    }
    let out = &mut invnpp[..npix * block];
    accumulate(K, nsub, nsubpix, submap, subpix, out, block, |i, cov| {
        let w = &weights[i * nnz..(i + 1) * nnz];
        let mut c = 0;
        for j in 0..nnz {
            let scaled_weight = w[j] * scale;
            for &wk in &w[j..] {
                cov[c] += wk * scaled_weight;
                c += 1;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_cases::{reference_case, Case};

    fn run_hits(c: &mut Case) -> (Vec<i64>, Vec<i64>) {
        let mut hits = c.i64("hits_in");
        cov_accum_diag_hits(
            c.scalar_i64("nsub"),
            c.scalar_i64("nsubpix"),
            c.scalar_i64("nnz"),
            &c.i64("submap"),
            &c.i64("subpix"),
            &mut hits,
        )
        .unwrap();
        (hits, c.i64("hits_out"))
    }

    #[test]
    fn hits_match_toast() {
        for name in ["cov_accum_diag_hits_basic", "cov_accum_diag_hits_nsub0"] {
            let mut c = reference_case(name);
            let (got, want) = run_hits(&mut c);
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn invnpp_matches_toast_bit_for_bit() {
        for name in [
            "cov_accum_diag_invnpp_nnz3",
            "cov_accum_diag_invnpp_nnz1_zero_start",
        ] {
            let mut c = reference_case(name);
            let mut invnpp = c.f64("invnpp_in");
            cov_accum_diag_invnpp(
                c.scalar_i64("nsub"),
                c.scalar_i64("nsubpix"),
                c.scalar_i64("nnz"),
                &c.i64("submap"),
                &c.i64("subpix"),
                &c.f64("weights"),
                c.scalar_f64("scale"),
                &mut invnpp,
            )
            .unwrap();
            let want = c.f64("invnpp_out");
            assert!(
                got_bits(&invnpp) == got_bits(&want),
                "{name}: differs from TOAST"
            );
        }
    }

    fn got_bits(x: &[f64]) -> Vec<u64> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn invnpp_does_not_depend_on_the_thread_count() {
        let run = || {
            let mut c = reference_case("cov_accum_diag_invnpp_nnz3");
            let mut inv = c.f64("invnpp_in");
            let (sm, px, w) = (c.i64("submap"), c.i64("subpix"), c.f64("weights"));
            cov_accum_diag_invnpp(5, 8, 3, &sm, &px, &w, c.scalar_f64("scale"), &mut inv).unwrap();
            got_bits(&inv)
        };
        let pool = |n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        };
        assert_eq!(pool(1).install(run), pool(5).install(run));
    }

    #[test]
    fn out_of_range_pixel_is_a_fault() {
        let mut hits = vec![0i64; 8];
        let e = cov_accum_diag_hits(2, 4, 1, &[0, 1, 2], &[1, 3, 0], &mut hits).unwrap_err();
        assert!(format!("{e:?}").contains("sample 2"), "{e:?}");
        let mut hits = vec![0i64; 8];
        let e = cov_accum_diag_hits(2, 4, 1, &[0, 1], &[4, 0], &mut hits).unwrap_err();
        assert!(format!("{e:?}").contains("sample 0"), "{e:?}");
        let mut inv = vec![0.0; 8];
        let e = cov_accum_diag_invnpp(2, 4, 1, &[0], &[0, 1], &[1.0], 1.0, &mut inv).unwrap_err();
        assert!(format!("{e:?}").contains("subpix"), "{e:?}");
    }
}
