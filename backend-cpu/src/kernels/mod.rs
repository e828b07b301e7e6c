//! The kernels. Each `run` takes the validated arguments from
//! `toast_accel::check` and the raw argument struct (for the kernel arrays,
//! which are host addresses here) and returns a data-dependent fault, if any.
//!
//! A kernel of TOAST's registry that adds into an output (a map:
//! `build_noise_weighted`, `cov_accum_diag_*`; a timestream: `scan_map`;
//! the hit submaps of `pixels_healpix`), and `cov_accum_timestream`, leave
//! it as it was when they report a fault: a caller that fixes its input and
//! calls again must not count the samples before the fault twice. The map
//! kernels check every pixel they would look up first ([`check_pixels`];
//! one read of the pixels, in parallel), and `pixels_healpix` marks its hit
//! submaps only once every pixel is valid. An output that is only written
//! (the pixels, weights, pointing) may hold part of the call's result after
//! a fault. The map-maker's fused passes (`fused_accumulate`, called in
//! every CG iteration on pixels the run computed itself) are left without
//! the extra read: a fault there ends the run, whose outputs are then
//! absent.

pub(crate) mod compact;
pub(crate) mod cov_timestream;
pub(crate) mod fused;
pub(crate) mod healpix;
pub(crate) mod mapmaker;
pub(crate) mod mapmaker_utils;
pub mod noise;
pub(crate) mod pcg;
pub(crate) mod pointing;
pub(crate) mod polyfilter;
pub(crate) mod scan_map;
pub(crate) mod solver_flags;
pub(crate) mod stokes;
pub(crate) mod template_offset;
#[cfg(test)]
pub(crate) mod test_arrays;
#[cfg(test)]
pub(crate) mod test_cases;
pub(crate) mod weight;

use crate::par::{for_each_chunk, SampleFault};
use toast_accel::abi::{self, SampleRange};
use toast_accel::kernels::KernelArgs;
use toast_accel::plugin_support::PluginError;

/// One kernel's math on the CPU: what the plugin's generic kernel entry
/// runs, on the context's thread pool, after the validator. One impl per
/// kernel of the table (`toast_accel::toast_kernels!`); a kernel without one
/// does not compile into the plugin's function table.
pub(crate) trait CpuKernel: KernelArgs {
    /// Run the kernel.
    ///
    /// # Safety
    /// `v` is `a`'s validated view, and the arrays of `a` are host memory
    /// of the validated lengths, not used elsewhere during the call.
    unsafe fn run(v: &Self::Valid<'_>, a: &Self) -> Result<(), PluginError>;

    /// Whether this call is small enough to run serially on the calling
    /// thread instead of on the context's pool. Handing a call to the pool
    /// wakes a pool thread and waits for it (tens of microseconds when it
    /// sleeps), which is more than a short streaming kernel takes; TOAST's
    /// compiled kernels run such calls on the caller too. A kernel that says
    /// `true` must then not use rayon itself (it would go to the global pool);
    /// it may give half of its work to one pool thread with
    /// [`crate::par::split_in_two`], which never waits for a sleeping one.
    fn inline(_a: &Self) -> bool {
        false
    }
}

/// `impl CpuKernel` for an argument struct whose math is `$run(v, a)`.
/// `inline if |a| EXPR` overrides [`CpuKernel::inline`].
macro_rules! cpu_kernel {
    ($($args:ident => |$v:ident, $a:ident| $run:expr $(, inline if |$ia:ident| $inl:expr)?;)*) => {$(
        impl CpuKernel for abi::$args {
            unsafe fn run($v: &Self::Valid<'_>, $a: &Self) -> Result<(), PluginError> {
                // SAFETY: the caller's contract is the kernel's.
                unsafe { $run }
            }
            $(
                fn inline($ia: &Self) -> bool {
                    $inl
                }
            )?
        }
    )*};
}

cpu_kernel! {
    PointingDetectorArgs => |v, a| pointing::run(v, a);
    PixelsHealpixArgs => |v, a| healpix::run(v, a);
    StokesWeightsIArgs => |v, a| stokes::run_i(v, a);
    StokesWeightsIquArgs => |v, a| stokes::run_iqu(v, a);
    ScanMapArgs => |v, a| scan_map::run(v, a);
    BuildNoiseWeightedArgs => |v, a| mapmaker::run(v, a);
    NoiseWeightArgs => |v, a| weight::run(v, a);
    TemplateOffsetAddArgs => |v, a| template_offset::run_add(v, a);
    TemplateOffsetProjectArgs => |v, a| template_offset::run_project(v, a);
    TemplateOffsetPrecondArgs => |_v, a| template_offset::run_precond(a),
        inline if |a| template_offset::precond_inline(a);
    CovAccumDiagHitsArgs => |v, a| mapmaker_utils::run_hits(v, a);
    CovAccumDiagInvnppArgs => |v, a| mapmaker_utils::run_invnpp(v, a);
    FilterPolynomialArgs => |v, a| polyfilter::run_polynomial(v, a);
    FilterPoly2dArgs => |v, a| polyfilter::run_poly2d(v, a);
    CovApplyDiagArgs => |v, a| mapmaker_utils::run_apply(v, a);
    AmpDotArgs => |v, a| pcg::run_dot(v, a);
    AmpAxpbyArgs => |_v, a| pcg::run_axpby(a);
    CompactExpandPointingArgs => |v, a| compact::run(v, a);
    FusedAccumulateArgs => |v, a| fused::run_accumulate(v, a);
    FusedProjectArgs => |v, a| fused::run_project(v, a);
    SimNoiseArgs => |v, a| noise::run(v, a);
    CovAccumTimestreamArgs => |v, a| cov_timestream::run(v, a);
    SolverFlagsArgs => |v, a| solver_flags::run(v, a);
}

/// Turn a data-dependent fault into the plugin error the host sees.
pub(crate) fn fault_error(kernel: &str, f: SampleFault) -> PluginError {
    PluginError::invalid(format!(
        "{kernel}: detector {} (interval {}), sample {}: {}",
        f.det, f.view, f.samp, f.message
    ))
}

/// `pix / n_pix_submap` and `pix % n_pix_submap` for `pix >= 0`, with a
/// shift and a mask when `n_pix_submap` is a power of two (same results).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SubmapDiv {
    n_pix_submap: i64,
    shift: Option<u32>,
}

impl SubmapDiv {
    pub(crate) fn new(n_pix_submap: i64) -> Self {
        debug_assert!(n_pix_submap > 0);
        let shift = (n_pix_submap & (n_pix_submap - 1) == 0).then(|| n_pix_submap.trailing_zeros());
        SubmapDiv {
            n_pix_submap,
            shift,
        }
    }

    /// `(submap, sub-pixel)` of a pixel `>= 0`.
    #[inline(always)]
    pub(crate) fn split(&self, pix: i64) -> (i64, i64) {
        match self.shift {
            Some(s) => (pix >> s, pix & (self.n_pix_submap - 1)),
            None => {
                let g = pix / self.n_pix_submap;
                (g, pix - g * self.n_pix_submap)
            }
        }
    }
}

/// The map a map kernel looks its pixels up in (`global2local` of
/// `n_local_submap` local submaps, submaps of `n_pix_submap` pixels),
/// checked with every pixel the kernel would look up: the table's entries
/// (`check::global2local`), then each pixel is in the map, else `kernel`'s
/// fault for the first sample (in detector, interval, sample order) whose
/// pixel [`locate`] refuses, over the detectors' rows of `pixels` (one per
/// entry of `pixel_index`, `n_samp` long) within `intervals`: negative
/// pixels, and the samples `flags` skips, are not looked up. Run before a
/// kernel adds into its output, so that a fault leaves the output
/// untouched (see the module's description). Returns the submap division
/// the kernel's lookups use.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_pixels(
    kernel: &'static str,
    n_samp: usize,
    intervals: &[SampleRange],
    pixel_index: &[i32],
    pixels: &[i64],
    global2local: &[i64],
    n_local_submap: u64,
    n_pix_submap: i64,
    flags: &FlagRule<'_>,
) -> Result<SubmapDiv, PluginError> {
    toast_accel::check::global2local(kernel, global2local, n_local_submap)?;
    let div = &SubmapDiv::new(n_pix_submap);
    for_each_chunk(n_samp, intervals, |segs| {
        for (det, &row) in pixel_index.iter().enumerate() {
            let base = row as usize * n_samp;
            for seg in segs {
                for (k, &p) in pixels[base + seg.first..base + seg.last].iter().enumerate() {
                    if p < 0 {
                        continue;
                    }
                    let s = seg.first + k;
                    if let Err(m) = locate(div, global2local, p) {
                        if !flags.skips(det, s) {
                            return Err(SampleFault::new(det, seg.view, s, m));
                        }
                    }
                }
            }
        }
        Ok(())
    })
    .map_err(|f| fault_error(kernel, f))?;
    Ok(*div)
}

/// The samples a map kernel skips by their flags (TOAST's rule): a
/// detector's row of `det_flags` (by `flag_index`) where the call uses
/// them, the shared flags where it uses them, each against its mask.
pub(crate) struct FlagRule<'a> {
    pub(crate) n_samp: usize,
    /// `det_flags`, `flag_index` and the mask, where used.
    pub(crate) det: Option<(&'a [u8], &'a [i32], u8)>,
    /// The shared flags and their mask, where used.
    pub(crate) shared: Option<(&'a [u8], u8)>,
}

impl FlagRule<'_> {
    /// No sample is skipped by flags (`scan_map`).
    pub(crate) const NONE: FlagRule<'static> = FlagRule {
        n_samp: 0,
        det: None,
        shared: None,
    };

    /// Whether sample `s` of detector `det` is flagged out.
    pub(crate) fn skips(&self, det: usize, s: usize) -> bool {
        self.det
            .is_some_and(|(f, idx, m)| f[idx[det] as usize * self.n_samp + s] & m != 0)
            || self.shared.is_some_and(|(f, m)| f[s] & m != 0)
    }
}

/// Locate pixel `pix >= 0` of a map: the local submap and sub-pixel, or the
/// reason it is not in the map.
#[inline(always)]
pub(crate) fn locate(
    div: &SubmapDiv,
    global2local: &[i64],
    pix: i64,
) -> Result<(usize, usize), String> {
    let (g, sub) = div.split(pix);
    match global2local.get(g as usize) {
        None => Err(format!(
            "pixel {pix} is beyond the map ({} submaps x {} pixels)",
            global2local.len(),
            div.n_pix_submap
        )),
        // Entries are validated to lie in [-1, n_local_submap).
        Some(&l) if l < 0 => Err(format!(
            "pixel {pix} is in submap {g}, which is not local to this map (global2local = {l})"
        )),
        Some(&l) => Ok((l as usize, sub as usize)),
    }
}
