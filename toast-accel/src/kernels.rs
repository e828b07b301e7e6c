//! The kernel table: every kernel of the plugin ABI declared once, in
//! [`toast_kernels!`](crate::toast_kernels), and what follows from it.
//!
//! # Why a macro table
//!
//! A kernel has a few facts that many places need: its slot in the
//! plugin's function table, its [`Kernel`] variant and
//! TOAST's registry name, its argument struct (and the C name of that
//! struct), its validator and what the validator returns, which fields of
//! the struct are kernel arrays and whether the kernel writes them, its
//! entry points in the device source, and its conformance case type. The
//! places that need them are in several crates (the ABI mirror, the host,
//! the CPU and GPU plugins, the test device, the conformance runner), and
//! most of what they need is *items* (struct fields, enum variants, trait
//! impls, a function table literal), which only a macro or a build script
//! can produce. A build script would generate text for one crate; a
//! `macro_rules!` table with callbacks is expanded where each item lives, in
//! any crate, with no generated files, and the compiler checks every use.
//! A trait alone ([`KernelArgs`]) carries the per-kernel facts into generic
//! code, but cannot declare the table's fields or the enum; so the table
//! is a macro and it implements the trait.
//!
//! # What follows from the table
//!
//! Expanded in this crate:
//! * [`abi::BackendTable`](crate::abi::BackendTable)'s kernel slots, in table
//!   order after the lifecycle and memory entries, and
//!   [`BackendTable::EMPTY`](crate::abi::BackendTable::EMPTY);
//! * [`abi::Kernel`](crate::abi::Kernel): the variants, `ALL`, `name`,
//!   `from_name`, `in_table`, `c_args`;
//! * [`KernelArgs`] for every argument struct: the kernel, its table entry,
//!   its validator, its arrays;
//! * [`device_source::KERNEL_NAMES`](crate::device_source::KERNEL_NAMES);
//! * [`backend_table!`](crate::backend_table): a plugin's whole function
//!   table from its lifecycle functions and one generic kernel entry
//!   (the CPU plugin, `toast-gpu`, the test device);
//! * with `host`, the conformance runner's case enum.
//!
//! What stays per kernel is what truly differs: the argument struct
//! (`abi.rs` and the C header, checked against each other by
//! `tests/abi_layout.rs`, which also checks the header's kernel slots
//! against this table), its validator (`check.rs`), the CPU math
//! (`backend-cpu`, an impl of its `CpuKernel`), the device source
//! (`device/kernels.h`) and its marshalling (`toast-gpu`, an impl of its
//! `DeviceKernel`), the conformance case type, and the safe dispatched
//! call in `toast-ops`. `docs/adding-a-kernel.md` lists the steps.
//!
//! # The row grammar
//!
//! ```text
//! slot => Variant {
//!     name: "toast_registry_name",
//!     args: ArgsStruct = c_args_struct_name,
//!     check: check_function -> ValidatedType,
//!     arrays: [field: In | Out | InPlace, ...],
//!     device: ["toast_device_entry", ...],
//!     case: ConformanceCaseType,
//! }
//! ```
//!
//! `__kernel_rows!` alone parses this grammar; a callback receives each row
//! as a flat tuple and matches the fields it needs (see the callbacks in
//! `abi.rs` and `host/conformance/mod.rs`).

use crate::abi::{Array, BackendTable, Kernel, KernelFn};
use crate::check::ArgError;

/// The kernel table. Invoked as `toast_kernels!((path::to::callback) extra
/// tokens)`, it expands to `path::to::callback! { [extra tokens] rows }`
/// with one row per kernel, in ABI table order, each row in the compact
/// form of [`__kernel_rows!`](crate::__kernel_rows). Append new kernels at
/// the end (the function table only grows at the end).
#[macro_export]
macro_rules! toast_kernels {
    (($($callback:tt)*) $($extra:tt)*) => {
        $crate::__kernel_rows! {
            ($($callback)*) [$($extra)*]
            pointing_detector => PointingDetector {
                name: "pointing_detector",
                args: PointingDetectorArgs = toast_pointing_detector_args,
                check: check_pointing_detector -> $crate::check::PointingDetector<'a>,
                arrays: [boresight: In, shared_flags: In, quats: Out],
                device: ["toast_pointing_detector"],
                case: PointingDetectorCase,
            }
            pixels_healpix => PixelsHealpix {
                name: "pixels_healpix",
                args: PixelsHealpixArgs = toast_pixels_healpix_args,
                check: check_pixels_healpix -> $crate::check::PixelsHealpix<'a>,
                arrays: [quats: In, shared_flags: In, pixels: Out, hit_submaps: Out],
                device: ["toast_pixels_healpix_i64", "toast_pixels_healpix_i32"],
                case: PixelsHealpixCase,
            }
            stokes_weights_i => StokesWeightsI {
                name: "stokes_weights_I",
                args: StokesWeightsIArgs = toast_stokes_weights_i_args,
                check: check_stokes_weights_i -> $crate::check::StokesWeightsI<'a>,
                arrays: [weights: Out],
                device: ["toast_stokes_weights_i"],
                case: StokesWeightsICase,
            }
            stokes_weights_iqu => StokesWeightsIqu {
                name: "stokes_weights_IQU",
                args: StokesWeightsIquArgs = toast_stokes_weights_iqu_args,
                check: check_stokes_weights_iqu -> $crate::check::StokesWeightsIqu<'a>,
                arrays: [quats: In, hwp: In, weights: Out],
                device: ["toast_stokes_weights_iqu"],
                case: StokesWeightsIquCase,
            }
            scan_map => ScanMap {
                name: "scan_map",
                args: ScanMapArgs = toast_scan_map_args,
                check: check_scan_map -> $crate::check::ScanMap<'a>,
                arrays: [global2local: In, mapdata: In, pixels: In, weights: In, det_data: Out],
                device: ["toast_scan_map_f64", "toast_scan_map_f32", "toast_scan_map_i64", "toast_scan_map_i32"],
                case: ScanMapCase,
            }
            build_noise_weighted => BuildNoiseWeighted {
                name: "build_noise_weighted",
                args: BuildNoiseWeightedArgs = toast_build_noise_weighted_args,
                check: check_build_noise_weighted -> $crate::check::BuildNoiseWeighted<'a>,
                arrays: [global2local: In, pixels: In, weights: In, det_data: In, det_flags: In,
                         shared_flags: In, zmap: Out],
                device: ["toast_build_noise_weighted"],
                case: BuildNoiseWeightedCase,
            }
            noise_weight => NoiseWeight {
                name: "noise_weight",
                args: NoiseWeightArgs = toast_noise_weight_args,
                check: check_noise_weight -> $crate::check::NoiseWeight<'a>,
                arrays: [det_data: Out],
                device: ["toast_noise_weight"],
                case: NoiseWeightCase,
            }
            template_offset_add_to_signal => TemplateOffsetAddToSignal {
                name: "template_offset_add_to_signal",
                args: TemplateOffsetAddArgs = toast_template_offset_add_args,
                check: check_template_offset_add -> $crate::check::TemplateOffsetAdd<'a>,
                arrays: [amplitudes: In, amplitude_flags: In, det_data: Out],
                device: ["toast_template_offset_add_to_signal"],
                case: TemplateOffsetAddToSignalCase,
            }
            template_offset_project_signal => TemplateOffsetProjectSignal {
                name: "template_offset_project_signal",
                args: TemplateOffsetProjectArgs = toast_template_offset_project_args,
                check: check_template_offset_project -> $crate::check::TemplateOffsetProject<'a>,
                arrays: [det_data: In, flag_data: In, amplitudes: Out, amplitude_flags: In],
                device: ["toast_template_offset_project_signal"],
                case: TemplateOffsetProjectSignalCase,
            }
            template_offset_apply_diag_precond => TemplateOffsetApplyDiagPrecond {
                name: "template_offset_apply_diag_precond",
                args: TemplateOffsetPrecondArgs = toast_template_offset_precond_args,
                check: check_template_offset_precond -> usize,
                arrays: [offset_var: In, amplitudes_in: InPlace, amplitude_flags: In,
                         amplitudes_out: Out],
                device: ["toast_template_offset_apply_diag_precond"],
                case: TemplateOffsetApplyDiagPrecondCase,
            }
            cov_accum_diag_hits => CovAccumDiagHits {
                name: "cov_accum_diag_hits",
                args: CovAccumDiagHitsArgs = toast_cov_accum_diag_hits_args,
                check: check_cov_accum_diag_hits -> $crate::check::CovAccum,
                arrays: [submap: In, subpix: In, hits: Out],
                device: ["toast_cov_accum_diag_hits"],
                case: CovAccumDiagHitsCase,
            }
            cov_accum_diag_invnpp => CovAccumDiagInvnpp {
                name: "cov_accum_diag_invnpp",
                args: CovAccumDiagInvnppArgs = toast_cov_accum_diag_invnpp_args,
                check: check_cov_accum_diag_invnpp -> $crate::check::CovAccum,
                arrays: [submap: In, subpix: In, weights: In, invnpp: Out],
                device: ["toast_cov_accum_diag_invnpp"],
                case: CovAccumDiagInvnppCase,
            }
            filter_polynomial => FilterPolynomial {
                name: "filter_polynomial",
                args: FilterPolynomialArgs = toast_filter_polynomial_args,
                check: check_filter_polynomial -> $crate::check::FilterPolynomial<'a>,
                arrays: [flags: In, signals: Out],
                device: ["toast_filter_polynomial"],
                case: FilterPolynomialCase,
            }
            filter_poly2d => FilterPoly2d {
                name: "filter_poly2D",
                args: FilterPoly2dArgs = toast_filter_poly2d_args,
                check: check_filter_poly2d -> $crate::check::FilterPoly2d<'a>,
                arrays: [signals: In, masks: In, coeff: Out],
                device: ["toast_filter_poly2d_heads", "toast_filter_poly2d",
                         "toast_filter_poly2d_solve"],
                case: FilterPoly2dCase,
            }
            cov_apply_diag => CovApplyDiag {
                name: "cov_apply_diag",
                args: CovApplyDiagArgs = toast_cov_apply_diag_args,
                check: check_cov_apply_diag -> $crate::check::CovApply,
                arrays: [mat: In, vec: Out],
                device: ["toast_cov_apply_diag"],
                case: CovApplyDiagCase,
            }
            amp_dot => AmpDot {
                name: "amp_dot",
                args: AmpDotArgs = toast_amp_dot_args,
                check: check_amp_dot -> $crate::check::AmpDot,
                arrays: [a: In, b: In, flags: In, partials: Out],
                device: ["toast_amp_dot"],
                case: AmpDotCase,
            }
            amp_axpby => AmpAxpby {
                name: "amp_axpby",
                args: AmpAxpbyArgs = toast_amp_axpby_args,
                check: check_amp_axpby -> usize,
                arrays: [x: In, y: Out],
                device: ["toast_amp_axpby"],
                case: AmpAxpbyCase,
            }
            compact_expand_pointing => CompactExpandPointing {
                name: "compact_expand_pointing",
                args: CompactExpandPointingArgs = toast_compact_expand_pointing_args,
                check: check_compact_expand_pointing -> $crate::check::CompactExpandPointing<'a>,
                arrays: [compact: In, boresight: In, pointing_flags: In, hwp: In, pixels: Out,
                         weights: Out],
                device: ["toast_compact_expand_pointing"],
                case: CompactExpandPointingCase,
            }
            fused_accumulate => FusedAccumulate {
                name: "fused_accumulate",
                args: FusedAccumulateArgs = toast_fused_accumulate_args,
                check: check_fused_accumulate -> $crate::check::Fused<'a>,
                arrays: [global2local: In, compact: In, boresight: In, pointing_flags: In, hwp: In,
                         pixels: In, weights: In, det_data: In, det_flags: In, shared_flags: In,
                         amplitudes: In, amplitude_flags: In, zmap: Out],
                device: ["toast_fused_accumulate"],
                case: FusedAccumulateCase,
            }
            fused_project => FusedProject {
                name: "fused_project",
                args: FusedProjectArgs = toast_fused_project_args,
                check: check_fused_project -> $crate::check::Fused<'a>,
                arrays: [global2local: In, compact: In, boresight: In, pointing_flags: In, hwp: In,
                         pixels: In, weights: In, det_data: In, det_flags: In, mapdata: In,
                         amplitudes: In, amplitude_flags: In, amplitudes_out: Out],
                device: ["toast_fused_project"],
                case: FusedProjectCase,
            }
            sim_noise => SimNoise {
                name: "sim_noise",
                args: SimNoiseArgs = toast_sim_noise_args,
                check: check_sim_noise -> $crate::check::SimNoise<'a>,
                arrays: [det_data: Out],
                device: ["toast_sim_noise_twiddles", "toast_sim_noise_spectrum",
                         "toast_sim_noise_pack",
                         "toast_sim_noise_fft_stage", "toast_sim_noise_partial",
                         "toast_sim_noise_mean", "toast_sim_noise_add"],
                case: SimNoiseCase,
            }
            cov_accum_timestream => CovAccumTimestream {
                name: "cov_accum_timestream",
                args: CovAccumTimestreamArgs = toast_cov_accum_timestream_args,
                check: check_cov_accum_timestream -> $crate::check::CovAccumTimestream<'a>,
                arrays: [global2local: In, pixels: In, weights: In, det_flags: In,
                         shared_flags: In, hits: Out, invnpp: Out],
                device: ["toast_cov_accum_timestream"],
                case: CovAccumTimestreamCase,
            }
            solver_flags => SolverFlags {
                name: "solver_flags",
                args: SolverFlagsArgs = toast_solver_flags_args,
                check: check_solver_flags -> $crate::check::SolverFlags<'a>,
                arrays: [global2local: In, det_flags: In, shared_flags: In, pixels: In,
                         pixel_mask: In, flags: Out, counts: Out],
                device: ["toast_solver_flags_gaps", "toast_solver_flags"],
                case: SolverFlagsCase,
            }
        }
    };
}

/// Parses the rows of [`toast_kernels!`](crate::toast_kernels) (the only
/// place that knows the row grammar) and hands them to the callback as one
/// parenthesised tuple per kernel:
///
/// ```text
/// (slot Variant "name" ArgsStruct c_args_name [array Dir, ...] ["device", ...]
///  CaseType check_function (ValidatedType))
/// ```
///
/// so a callback matches the leading fields it needs and ignores the rest
/// with `$($rest:tt)*`.
#[doc(hidden)]
#[macro_export]
macro_rules! __kernel_rows {
    (
        ($($callback:tt)*) [$($extra:tt)*]
        $($slot:ident => $variant:ident {
            name: $name:literal,
            args: $args:ident = $c_args:ident,
            check: $check:ident -> $valid:ty,
            arrays: [$($arr:ident : $dir:ident),* $(,)?],
            device: [$($dev:literal),* $(,)?],
            case: $case:ident $(,)?
        })*
    ) => {
        $($callback)*! {
            [$($extra)*]
            $(($slot $variant $name $args $c_args [$($arr $dir),*] [$($dev),*] $case $check ($valid)))*
        }
    };
}

/// A plugin's function table (a constant expression, for a `static`): the
/// lifecycle and memory entries as `field: value` pairs, then
/// `kernels = f` where `f` is one function generic over the argument struct
/// (`unsafe extern "C" fn f<A: ...>(ctx: *mut c_void, args: *const A) ->
/// Status`), instantiated for every kernel of the table by type inference.
/// A field left out is a compile error; a kernel the plugin lacks needs its
/// own table (fill it by hand from [`BackendTable::EMPTY`]).
///
/// ```ignore
/// static TABLE: BackendTable = toast_accel::backend_table! {
///     init: Some(init), shutdown: Some(shutdown), /* … */ synchronize: Some(sync);
///     kernels = kernel_entry
/// };
/// ```
#[macro_export]
macro_rules! backend_table {
    ($($field:ident : $value:expr),* $(,)? ; kernels = $entry:expr $(,)?) => {
        $crate::toast_kernels!(($crate::__backend_table) [$($field: $value),*] $entry)
    };
}

/// The callback of [`backend_table!`]: the struct literal.
#[doc(hidden)]
#[macro_export]
macro_rules! __backend_table {
    ([[$($field:ident : $value:expr),*] $entry:expr] $(($slot:ident $($rest:tt)*))*) => {
        $crate::abi::BackendTable {
            $($field: $value,)*
            $($slot: ::std::option::Option::Some($entry),)*
        }
    };
}

/// How a kernel uses one of its array arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrayDir {
    /// Read only.
    In,
    /// Written (and possibly read): never the same buffer as another array
    /// argument, as the device source declares its arrays `restrict`.
    Out,
    /// Read by an element-wise kernel that writes each element after
    /// reading it: may be the same buffer as the `Out` array (in place).
    InPlace,
}

/// The argument struct of one kernel, with the facts of its table row: a
/// generic entry point (`fn entry<A: KernelArgs>`) knows from it which
/// kernel it is, how to validate, and where the arrays are.
pub trait KernelArgs: Sized + Copy + 'static {
    /// The kernel.
    const KERNEL: Kernel;
    /// What the validator returns: the checked view of the arguments.
    type Valid<'a>;
    /// The kernel's entry in `table` (`None`: not implemented there).
    fn entry(table: &BackendTable) -> Option<KernelFn<Self>>;
    /// The kernel's validator (`toast_accel::check`), which every backend
    /// runs first.
    ///
    /// # Safety
    /// The host pointers of the struct are valid for the lengths it
    /// declares (the ABI contract of a kernel call), for `'a`.
    unsafe fn check<'a>(&self) -> Result<Self::Valid<'a>, ArgError>;
    /// The kernel arrays, by field name, in declaration order.
    fn arrays(&self) -> Vec<(&'static str, ArrayDir, Array)>;
    /// The kernel arrays, mutable (to translate handles, as a test device
    /// does).
    fn arrays_mut(&mut self) -> Vec<(&'static str, ArrayDir, &mut Array)>;
}

/// The first output array that is the same buffer as another (present)
/// array argument: `(output, other)`; an `InPlace` input may share the
/// output's buffer.
pub fn aliased_output<A: KernelArgs>(args: &A) -> Option<(&'static str, &'static str)> {
    let arrays: Vec<_> = args
        .arrays()
        .into_iter()
        .filter(|(_, _, a)| a.len > 0)
        .collect();
    for (i, (out, dir, a)) in arrays.iter().enumerate() {
        if *dir != ArrayDir::Out {
            continue;
        }
        let clash = arrays.iter().enumerate().find(|(j, (_, d, b))| {
            *j != i && b.ptr == a.ptr && (*d == ArrayDir::Out || *d == ArrayDir::In)
        });
        if let Some((_, (other, _, _))) = clash {
            return Some((out, other));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{self, SampleRanges};

    #[test]
    fn outputs_may_not_alias_except_in_place_inputs() {
        let arr = |ptr| Array { ptr, len: 4 };
        let mut a = abi::TemplateOffsetPrecondArgs {
            n_amp: 4,
            offset_var: arr(1),
            amplitudes_in: arr(2),
            amplitude_flags: arr(3),
            amplitudes_out: arr(2),
        };
        assert_eq!(aliased_output(&a), None, "in place is allowed");
        a.offset_var = arr(2);
        assert_eq!(aliased_output(&a), Some(("amplitudes_out", "offset_var")));
        a.offset_var = Array::ABSENT;
        assert_eq!(aliased_output(&a), None, "absent arrays alias nothing");
        let p = abi::PixelsHealpixArgs {
            n_det: 0,
            n_samp: 0,
            quat_index: std::ptr::null(),
            pixel_index: std::ptr::null(),
            intervals: SampleRanges {
                ptr: std::ptr::null(),
                len: 0,
            },
            quats: arr(1),
            shared_flags: Array::ABSENT,
            pixels: arr(5),
            hit_submaps: arr(5),
            nside: 1,
            n_pix_submap: 1,
            shared_flag_mask: 0,
            nest: 0,
            pixels_i32: 0,
            reserved: [0; 5],
        };
        assert_eq!(aliased_output(&p), Some(("pixels", "hit_submaps")));
    }

    #[test]
    fn the_table_is_consistent() {
        assert_eq!(Kernel::ALL.len(), 23);
        for (i, k) in Kernel::ALL.iter().enumerate() {
            assert_eq!(Kernel::from_name(k.name()), Some(*k));
            assert_eq!(*k as usize, i, "variants in table order");
        }
        assert_eq!(
            abi::PointingDetectorArgs::KERNEL.c_args(),
            "toast_pointing_detector_args"
        );
        let names: Vec<&str> = crate::device_source::KERNEL_NAMES.to_vec();
        assert_eq!(names.len(), 36);
        assert_eq!(names[5], "toast_scan_map_f64");
        assert!(Kernel::ALL
            .iter()
            .all(|k| !k.in_table(&BackendTable::EMPTY)));
    }
}
