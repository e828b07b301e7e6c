//! cov_accum_diag_hits and cov_accum_diag_invnpp: accumulate the hit map and
//! the diagonal inverse pixel-noise covariance (TOAST 3.0.6's
//! `toast::cov_accum_diag_hits` / `toast::cov_accum_diag_invnpp`, libtoast
//! `toast_map_cov.cpp`; `tests/data/toast-kernels/FORMAT.md`, sections 11-12).
//!
//! Plain functions over slices, and the plugin's entries ([`run_hits`],
//! [`run_invnpp`]) that call them. Deterministic parallel accumulation as in
//! `mapmaker.rs`: every pixel has one owning task (blocks of 1024 flat
//! pixels dealt round robin, so that a detector's scan, which may stay in one
//! part of the sky for a whole call, is shared evenly); every task walks all
//! samples in order and accumulates only the samples of its pixels, so every
//! element is summed in sample order, bit-identical to TOAST's one-thread
//! run for any thread count. With one thread it is one plain pass. The
//! accumulation is a scatter into a map of hundreds of MB, bound by cache
//! and TLB misses: each pass asks for the cache line of the pixel a few
//! samples ahead (a prefetch, which changes no result), and `invnpp` with
//! nnz = 1 or 3 is compiled for that size (its six products unrolled).
//!
//! [`run_apply`] is `cov_apply_diag` (`toast::cov_apply_diag`, FORMAT.md
//! section 15): `vec ← mat · vec` per pixel. Pixels are independent, so it
//! runs in parallel over pixels with the same bits for any thread count.

use crate::arrays::{self, Arg};
use crate::par::{first_fault, SampleFault, SharedMut, TaskResult};
use rayon::prelude::*;
use std::sync::atomic::{AtomicI64, Ordering};
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

/// Every sample's pixel is in the map (or skipped: negative), checked
/// after the shapes and before the accumulation adds anything, so that a
/// fault leaves the output untouched (see the kernels module); one
/// parallel read of the two arrays.
fn check_in_map(
    kernel: &str,
    nsub: i64,
    nsubpix: i64,
    submap: &[i64],
    subpix: &[i64],
) -> Result<(), PluginError> {
    // Not negative, and beyond the map: branch-free, so that the scan of a
    // block vectorises (a short-circuiting search per sample made the
    // check cost as much as the hits themselves).
    let beyond = |sm: i64, px: i64| {
        (sm >= 0) & (px >= 0) & ((sm as u64 >= nsub as u64) | (px as u64 >= nsubpix as u64))
    };
    const BLOCK: usize = 1 << 14;
    let bad_block = submap
        .par_chunks(BLOCK)
        .zip(subpix.par_chunks(BLOCK))
        .position_first(|(sm, px)| {
            sm.iter()
                .zip(px)
                .fold(false, |any, (&a, &b)| any | beyond(a, b))
        });
    let Some(block) = bad_block else {
        return Ok(());
    };
    let first = block * BLOCK;
    let i = (first..submap.len())
        .find(|&i| beyond(submap[i], subpix[i]))
        .expect("the block holds a sample beyond the map");
    Err(super::fault_error(
        kernel,
        beyond_the_map(nsub, nsubpix, submap[i], subpix[i], i),
    ))
}

/// The output map of [`accumulate`]: `nsub * nsubpix` pixels of
/// `per_pixel` elements.
struct Pixels<T> {
    nsub: i64,
    nsubpix: i64,
    per_pixel: usize,
    out: SharedMut<T>,
}

impl<T> Pixels<T> {
    /// One task's pass: `f(i, pixel)` for every sample `i`, in order, whose
    /// submap and pixel are in the map and whose flat pixel `keep` accepts;
    /// the first sample beyond the map (not negative, not in it) ends the
    /// pass with its fault. Samples with a negative submap (not local) or
    /// pixel (flagged) are skipped, as TOAST skips them.
    ///
    /// # Safety
    /// While the pass runs, no other task may touch a pixel `keep` accepts.
    #[inline(always)]
    unsafe fn pass<F, K>(&self, submap: &[i64], subpix: &[i64], f: &F, keep: K) -> TaskResult
    where
        F: Fn(usize, *mut T),
        K: Fn(usize) -> bool,
    {
        let (nsub, nsubpix) = (self.nsub, self.nsubpix);
        let base = self.out.as_mut_ptr();
        let n = submap.len().min(subpix.len());
        for (i, (&sm, &px)) in submap.iter().zip(subpix).enumerate() {
            if i + PREFETCH_AHEAD < n {
                let (sa, pa) = (submap[i + PREFETCH_AHEAD], subpix[i + PREFETCH_AHEAD]);
                if (sa as u64) < nsub as u64 && (pa as u64) < nsubpix as u64 {
                    let ha = (sa * nsubpix + pa) as usize;
                    if keep(ha) {
                        prefetch(base.wrapping_add(ha * self.per_pixel));
                    }
                }
            }
            // Compared as unsigned, a negative value is beyond the map too.
            if (sm as u64) < nsub as u64 && (px as u64) < nsubpix as u64 {
                let hpx = (sm * nsubpix + px) as usize;
                if keep(hpx) {
                    // SAFETY: hpx < nsub * nsubpix, the pixels of `out`
                    // (`accumulate` built this from them), so the pixel's
                    // elements lie inside it; the caller's contract makes
                    // them this task's.
                    f(i, unsafe { base.add(hpx * self.per_pixel) });
                }
            } else if sm >= 0 && px >= 0 {
                return Err(beyond_the_map(nsub, nsubpix, sm, px, i));
            }
        }
        Ok(())
    }
}

/// How many samples ahead [`Pixels::pass`] asks for the pixel's cache line.
const PREFETCH_AHEAD: usize = 16;

/// A hint to load the cache line at `p` (no effect on the results; never
/// faults, whatever the address).
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it reads nothing architecturally and
    // does not fault on any address, and SSE is part of x86_64's baseline.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Pixels per ownership block of [`accumulate`]'s tasks: task `t` of `n`
/// owns the flat pixels `hpx` with `(hpx >> OWNER_SHIFT) % n == t`. Blocks
/// of 1024 pixels interleave the tasks over the whole map, so that one
/// detector's scan (which may stay in one part of the sky for a whole call)
/// is shared evenly, while a block is still large enough that neighbouring
/// samples mostly land in the same task.
const OWNER_SHIFT: u32 = 10;

/// Call `f(i, out)` for every sample `i` TOAST accumulates, in sample order
/// per pixel: `out` is the `per_pixel` elements of flat pixel `hpx` (a
/// pointer to `per_pixel` elements of `out`).
///
/// With one thread, one pass over the samples. With more, every pixel has
/// one owning task (blocks of `2^OWNER_SHIFT` pixels dealt round robin);
/// each task walks every sample in order and takes those of its pixels, so
/// each element is written by one task, in sample order, bit-identical to
/// the one-thread pass, and every task meets the same first fault (after
/// accumulating the samples before it, as the one-thread pass does).
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
    F: Fn(usize, *mut T) + Sync,
{
    let npix = out.len() / per_pixel;
    debug_assert!(npix as u64 == nsub as u64 * nsubpix as u64 && nsub >= 1 && nsubpix >= 1);
    let blocks = (npix >> OWNER_SHIFT) + 1;
    let parts = rayon::current_num_threads().clamp(1, blocks);
    let map = Pixels {
        nsub,
        nsubpix,
        per_pixel,
        out: SharedMut::new(out),
    };
    let result = if parts == 1 {
        // SAFETY: the one task owns every pixel.
        unsafe { map.pass(submap, subpix, &f, |_| true) }
    } else {
        // A mask when it can (the usual 2 or 4 threads): the test runs twice
        // per sample, and a division takes tens of cycles.
        let mask = parts.is_power_of_two().then_some(parts - 1);
        (0..parts)
            .into_par_iter()
            .map(|t| {
                // SAFETY: task t keeps the pixels of the blocks b with
                // b % parts == t: no two tasks keep the same pixel.
                unsafe {
                    match mask {
                        Some(m) => {
                            map.pass(submap, subpix, &f, |hpx| (hpx >> OWNER_SHIFT) & m == t)
                        }
                        None => {
                            map.pass(submap, subpix, &f, |hpx| (hpx >> OWNER_SHIFT) % parts == t)
                        }
                    }
                }
            })
            .reduce(|| Ok(()), first_fault)
    };
    result.map_err(|f| super::fault_error(kernel, f))
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
    check_in_map(K, nsub, nsubpix, submap, subpix)?;
    let parts = rayon::current_num_threads();
    if parts > 1
        && submap.len() >= HITS_SPLIT_FROM
        && std::mem::align_of::<AtomicI64>() == std::mem::align_of::<i64>()
    {
        hits_by_samples(nsub, nsubpix, submap, subpix, &mut hits[..npix], parts);
        return Ok(());
    }
    accumulate(
        K,
        nsub,
        nsubpix,
        submap,
        subpix,
        &mut hits[..npix],
        1,
        |_, h| {
            // SAFETY: `accumulate` passes the address of the pixel's one
            // element, which this task alone touches.
            unsafe { *h += 1 };
        },
    )
}

/// Samples from which [`cov_accum_diag_hits`] splits them between threads.
const HITS_SPLIT_FROM: usize = 1 << 14;

/// [`cov_accum_diag_hits`] on several threads: the samples (not the
/// pixels, as [`accumulate`] does) are split into one contiguous range per
/// task, and each hit is an atomic increment. A hit count is an integer
/// sum, the same in any order, so the result is the one-task pass's; each
/// task reads only its own samples instead of every sample (the pixel
/// split read all of them in every task and scaled poorly: 2 threads at
/// 0.97-1.10x TOAST's). The samples were checked (`check_in_map`): each
/// is in the map or skipped.
fn hits_by_samples(
    nsub: i64,
    nsubpix: i64,
    submap: &[i64],
    subpix: &[i64],
    hits: &mut [i64],
    parts: usize,
) {
    // SAFETY: `AtomicI64` has the size of `i64` and, as checked by the
    // caller, its alignment; `hits` is borrowed exclusively for this call
    // and every access below goes through the atomics, so viewing its
    // elements as atomics is sound.
    let atoms: &[AtomicI64] = unsafe { &*(hits as *mut [i64] as *const [AtomicI64]) };
    let n = submap.len().min(subpix.len());
    let chunk = n.div_ceil(parts);
    let pixel = |i: usize| {
        let (sm, px) = (submap[i], subpix[i]);
        // Compared as unsigned, a negative value is beyond the map too.
        ((sm as u64) < nsub as u64 && (px as u64) < nsubpix as u64)
            .then(|| (sm * nsubpix + px) as usize)
    };
    (0..parts).into_par_iter().for_each(|t| {
        let (lo, hi) = ((t * chunk).min(n), ((t + 1) * chunk).min(n));
        for i in lo..hi {
            if i + PREFETCH_AHEAD < hi {
                if let Some(a) = pixel(i + PREFETCH_AHEAD) {
                    prefetch(atoms.as_ptr().wrapping_add(a));
                }
            }
            if let Some(h) = pixel(i) {
                atoms[h].fetch_add(1, Ordering::Relaxed);
            }
        }
    });
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
    check_in_map(K, nsub, nsubpix, submap, subpix)?;
    let out = &mut invnpp[..npix * block];
    match nnz {
        1 => accumulate_invnpp::<1, 1>(K, nsub, nsubpix, submap, subpix, weights, scale, out),
        3 => accumulate_invnpp::<3, 6>(K, nsub, nsubpix, submap, subpix, weights, scale, out),
        _ => accumulate(K, nsub, nsubpix, submap, subpix, out, block, |i, cov| {
            // SAFETY: `accumulate` passes the address of the pixel's
            // `block` elements, which this task alone touches.
            let cov = unsafe { std::slice::from_raw_parts_mut(cov, block) };
            upper_products(&weights[i * nnz..(i + 1) * nnz], scale, cov);
        }),
    }
}

/// `cov[jk] += w[k] * (w[j] * scale)` for `j <= k`, row by row (TOAST's
/// operations, in its order; `cov_accum_timestream` shares them).
#[inline(always)]
pub(crate) fn upper_products(w: &[f64], scale: f64, cov: &mut [f64]) {
    let mut c = 0;
    for (j, &wj) in w.iter().enumerate() {
        let scaled_weight = wj * scale;
        for &wk in &w[j..] {
            cov[c] += wk * scaled_weight;
            c += 1;
        }
    }
}

/// [`cov_accum_diag_invnpp`]'s accumulation for `NNZ` known at compile time
/// (`BLOCK = NNZ (NNZ + 1) / 2`): the same operations as [`upper_products`],
/// unrolled, on arrays whose length the compiler knows.
#[allow(clippy::too_many_arguments)]
fn accumulate_invnpp<const NNZ: usize, const BLOCK: usize>(
    kernel: &str,
    nsub: i64,
    nsubpix: i64,
    submap: &[i64],
    subpix: &[i64],
    weights: &[f64],
    scale: f64,
    out: &mut [f64],
) -> Result<(), PluginError> {
    debug_assert_eq!(BLOCK, NNZ * (NNZ + 1) / 2);
    accumulate(
        kernel,
        nsub,
        nsubpix,
        submap,
        subpix,
        out,
        BLOCK,
        |i, cov| {
            // SAFETY: `accumulate` passes the address of the pixel's BLOCK
            // elements, which this task alone touches.
            let cov = unsafe { &mut *cov.cast::<[f64; BLOCK]>() };
            upper_products(&weights[i * NNZ..][..NNZ], scale, cov);
        },
    )
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
    fn hits_split_by_samples_are_the_single_pass_counts() {
        // Pseudo-random pixels, some negative (skipped), over 5 submaps.
        let (nsub, nsubpix) = (5i64, 3000i64);
        let n = 3 * HITS_SPLIT_FROM + 17;
        let mut x = 12345u64;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as i64
        };
        let submap: Vec<i64> = (0..n).map(|_| next() % 6 - 1).collect();
        let subpix: Vec<i64> = (0..n).map(|_| next() % nsubpix).collect();
        let npix = (nsub * nsubpix) as usize;
        let mut want = vec![7i64; npix];
        for (&sm, &px) in submap.iter().zip(&subpix) {
            if sm >= 0 {
                want[(sm * nsubpix + px) as usize] += 1;
            }
        }
        for parts in [2, 3, 4] {
            let mut got = vec![7i64; npix];
            hits_by_samples(nsub, nsubpix, &submap, &subpix, &mut got, parts);
            assert_eq!(got, want, "{parts} tasks");
        }
        // A sample beyond the map, late: the kernel's fault, naming it,
        // and not one hit counted (the samples before it included).
        let mut bad = submap.clone();
        bad[n - 3] = nsub;
        let mut got = vec![7i64; npix];
        let e = cov_accum_diag_hits(nsub, nsubpix, 1, &bad, &subpix, &mut got).unwrap_err();
        let text = format!("{e:?}");
        assert!(
            text.contains(&format!("sample {}", n - 3)) && text.contains(&format!("submap {nsub}")),
            "{text}"
        );
        assert!(got.iter().all(|&h| h == 7), "hits changed before the fault");
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

    /// A map of many ownership blocks, so that several tasks share it.
    #[test]
    fn many_tasks_give_the_one_task_bits_and_fault() {
        let (nsub, nsubpix) = (7i64, 3000i64);
        let n = 20_000;
        let mut state = 7u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            state >> 33
        };
        let mut submap: Vec<i64> = Vec::with_capacity(n);
        let mut subpix: Vec<i64> = Vec::with_capacity(n);
        let mut weights = Vec::with_capacity(3 * n);
        for _ in 0..n {
            let r = next();
            // About 5 % not local, 5 % flagged, runs of nearby pixels.
            submap.push(if r % 20 == 0 { -1 } else { (r % 7) as i64 });
            subpix.push(if r % 20 == 1 {
                -1
            } else {
                ((r >> 3) % 40 + (r >> 9) % 2960) as i64
            });
            for _ in 0..3 {
                weights.push((next() as f64 / (1u64 << 31) as f64) - 0.5);
            }
        }
        let npix = (nsub * nsubpix) as usize;
        let run = |sm: &[i64], px: &[i64]| {
            let mut hits = vec![0i64; npix];
            let h = cov_accum_diag_hits(nsub, nsubpix, 3, sm, px, &mut hits)
                .map_err(|e| format!("{e:?}"));
            let mut inv = vec![0.0; npix * 6];
            let i = cov_accum_diag_invnpp(nsub, nsubpix, 3, sm, px, &weights, 0.7, &mut inv)
                .map_err(|e| format!("{e:?}"));
            (hits, got_bits(&inv), h, i)
        };
        let pool = |t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        };
        let one = pool(1).install(|| run(&submap, &subpix));
        assert!(one.0.iter().sum::<i64>() > (n as i64) * 8 / 10);
        assert_eq!(one, pool(3).install(|| run(&submap, &subpix)));
        // A pixel beyond the map: the same first fault at every thread
        // count, and nothing accumulated (not even the samples before it).
        let mut bad = subpix.clone();
        bad[12_345] = nsubpix;
        let one = pool(1).install(|| run(&submap, &bad));
        assert!(
            one.2.as_ref().unwrap_err().contains("sample 12345"),
            "{:?}",
            one.2
        );
        assert!(
            one.3.as_ref().unwrap_err().contains("sample 12345"),
            "{:?}",
            one.3
        );
        assert!(one.0.iter().all(|&h| h == 0) && one.1.iter().all(|&b| b == 0));
        assert_eq!(one, pool(4).install(|| run(&submap, &bad)));
    }

    #[test]
    fn out_of_range_pixel_is_a_fault() {
        let mut hits = vec![0i64; 8];
        let e = cov_accum_diag_hits(2, 4, 1, &[0, 1, 2], &[1, 3, 0], &mut hits).unwrap_err();
        assert!(format!("{e:?}").contains("sample 2"), "{e:?}");
        // The two samples before it are not counted: a fault leaves the
        // output as it was.
        assert_eq!(hits, vec![0i64; 8]);
        let mut inv = vec![0.5; 8];
        let e = cov_accum_diag_invnpp(2, 4, 1, &[1, 2], &[0, 0], &[1.0, 1.0], 1.0, &mut inv)
            .unwrap_err();
        assert!(format!("{e:?}").contains("sample 1"), "{e:?}");
        assert_eq!(inv, vec![0.5; 8]);
        let mut hits = vec![0i64; 8];
        let e = cov_accum_diag_hits(2, 4, 1, &[0, 1], &[4, 0], &mut hits).unwrap_err();
        assert!(format!("{e:?}").contains("sample 0"), "{e:?}");
        let mut inv = vec![0.0; 8];
        let e = cov_accum_diag_invnpp(2, 4, 1, &[0], &[0, 1], &[1.0], 1.0, &mut inv).unwrap_err();
        assert!(format!("{e:?}").contains("subpix"), "{e:?}");
    }
}
