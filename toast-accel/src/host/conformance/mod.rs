//! The conformance runner: replays TOAST 3.0.6's reference cases (one `.npz`
//! file per case, see `tests/data/toast-kernels/FORMAT.md`) on a backend and
//! compares its outputs with TOAST's, bit for bit.
//!
//! * [`load_case`] reads a file, identifies the kernel from the file name
//!   (the longest known kernel name that prefixes it) and extracts every
//!   field that kernel needs with its dtype and shape checked, so a corrupt,
//!   truncated or incomplete file is a [`CaseError`] naming the file and the
//!   field, never a panic. Sizes a file claims are checked before anything
//!   is allocated from them: each array's `.npy` header (shape × element
//!   size) must match the bytes its zip entry holds
//!   ([`CaseError::ClaimedSize`]), and a case's arrays hold at most
//!   [`MAX_CASE_BYTES`] together ([`CaseError::TooLarge`]).
//! * [`run_case`] runs the kernel through [`ArrayArg`](crate::host::ArrayArg) (so a backend that is
//!   not host-addressable gets its arrays staged) and compares every output.
//!   TOAST's "disabled by length" conventions (flags of length 1, a dummy
//!   HWP array, `det_flags` of shape (1, 1)) become absent arrays, and the
//!   template-offset cases replay their per-detector `call_*` arrays in
//!   order, one detector per call, as TOAST's `OffsetTemplate` does.
//! * Comparison ([`Comparison`]) is exact for backends that claim
//!   bit-exactness: f64 and f32 by bits, except that two NaNs match. Device
//!   backends are compared in the documented tolerant mode below.
//!
//! # Tolerance policy (device backends)
//!
//! The CPU backend reproduces TOAST bit for bit (same libm, same operation
//! order) and is always compared exactly. A backend that is not
//! host-addressable runs the device source, whose `stokes_weights_IQU` uses
//! its own correctly rounded `atan2`/`sin`/`cos` (the same bits on every
//! device, but an ulp from glibc's where glibc is off by more than half an
//! ulp), and whose `build_noise_weighted` sums with atomics in a
//! scheduling-dependent order. [`Comparison::for_backend`]
//! compares those in [`Comparison::Tolerant`] mode, which relaxes exactly
//! two outputs and nothing else:
//!
//! * `stokes_weights_IQU` `weights` (trigonometry of the pointing) and
//!   `build_noise_weighted` `zmap` (atomic accumulation): an element
//!   matches when its bits match, or when both values are finite and
//!   `|got - want| <= rtol * max|want|` over the field, with `rtol` =
//!   [`TRIG_RTOL`] (1e-14) for the weights and [`ACCUM_RTOL`] (1e-13) for
//!   zmap (a
//!   norm-wise relative bound: the error of `cos(x)` near a zero of the
//!   cosine is relative to the field's scale, not to the tiny element).
//!   NaN must meet NaN and infinities must be identical (the same NaN
//!   pattern). A case that passes only thanks to the tolerance is reported
//!   as [`CaseOutcome::PassTolerant`] with the count and the largest
//!   norm-wise difference, never silently as an exact pass;
//! * everything else (pointing quaternions, pixel indices, hit maps,
//!   `scan_map`, `noise_weight`, the template kernels) stays exact. In
//!   particular pixel indices must be identical: a device whose trigonometry
//!   moves a direction lying on a pixel boundary (FORMAT.md's special
//!   directions) across it fails the case, with the index reported, rather
//!   than being excused. (PoCL reproduces every reference pixel exactly.)
//! * [`run_dir`] runs every `.npz` of a directory, sorted by file name.
//!
//! # Layout
//!
//! * `case.rs`: reading a case file and each kernel's fields
//!   ([`load_case`], [`Case`], [`CaseData`] and the per-kernel case types);
//! * `run.rs`: running a case's kernel on a backend ([`run_case`]), one
//!   `run` method per kernel;
//! * `compare.rs`: exact and tolerant comparison and the outcome of a case
//!   ([`Comparison`], [`CaseOutcome`]);
//! * here: the table of kernels (below) and [`run_dir`].

mod case;
mod compare;
mod run;

pub use case::{
    kernel_of, load_case, AmpAxpbyCase, AmpDotCase, Arr, BuildNoiseWeightedCase, Case, CaseError,
    CompactExpandPointingCase, CovAccumDiagHitsCase, CovAccumDiagInvnppCase,
    CovAccumTimestreamCase, CovApplyDiagCase, FilterPoly2dCase, FilterPolynomialCase,
    FusedAccumulateCase, FusedCase, FusedPassFields, FusedProjectCase, MapData, NoiseWeightCase,
    PixelsHealpixCase, PointingDetectorCase, ScanMapCase, SimNoiseCase, SolverFlagsCase,
    StokesWeightsICase, StokesWeightsIquCase, TemplateOffsetAddToSignalCase,
    TemplateOffsetApplyDiagPrecondCase, TemplateOffsetProjectSignalCase, CASE_FILE_SLACK_BYTES,
    MAX_CASE_BYTES,
};
pub use compare::{
    CaseOutcome, Comparison, ACCUM_RTOL, AMP_RTOL, FUSED_COMPACT_RTOL, NOISE_RTOL, POLY2D_RTOL,
    POLYNOMIAL_RTOL, TRIG_RTOL,
};
pub use run::{run_case, run_case_with};

use super::Backend;
use crate::abi::Kernel;
use case::Fields;
use std::path::{Path, PathBuf};

/// Declares [`CaseData`], one variant per kernel of the kernel table
/// (`crate::kernels`), and its dispatch to each case type's `load` (in
/// `case.rs`) and `run` (in `run.rs`).
macro_rules! kernel_cases {
    (
        []
        $(($slot:ident $kernel:ident $name:literal $args:ident $c_args:ident [$($arr:tt)*]
           [$($dev:tt)*] $case:ident $($rest:tt)*))*
    ) => {
        /// The typed contents of a case, per kernel (the variant is named
        /// after the [`Kernel`]).
        #[derive(Debug, Clone, PartialEq)]
        pub enum CaseData {
            $(
                #[doc = concat!("A [`Kernel::", stringify!($kernel), "`] case.")]
                $kernel($case),
            )*
        }

        impl CaseData {
            /// Take the fields of `kernel`'s cases out of a file, checked.
            fn load(kernel: Kernel, fields: &mut Fields) -> Result<CaseData, CaseError> {
                Ok(match kernel {
                    $(Kernel::$kernel => CaseData::$kernel($case::load(fields)?),)*
                })
            }

            /// Run the kernel on `backend` and compare its outputs
            /// (`Err`: the case ended early, with that outcome).
            fn run(&self, backend: &Backend, cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
                match self {
                    $(CaseData::$kernel(c) => c.run(backend, cmp),)*
                }
            }
        }
    };
}

// The kernels the runner knows: those of the kernel table; adding a kernel
// means writing its case type (named in its row) with a `load` (case.rs) and
// a `run` (run.rs).
crate::toast_kernels!((kernel_cases));

/// Run every `.npz` case of `dir`, sorted by file name, in the backend's
/// default [`Comparison`].
pub fn run_dir(backend: &Backend, dir: &Path) -> Vec<(PathBuf, Result<CaseOutcome, CaseError>)> {
    run_dir_with(backend, dir, Comparison::for_backend(backend))
}

/// [`run_dir`] with an explicit comparison mode.
pub fn run_dir_with(
    backend: &Backend,
    dir: &Path,
    cmp: Comparison,
) -> Vec<(PathBuf, Result<CaseOutcome, CaseError>)> {
    let mut results = Vec::new();
    let Ok(()) = run_dir_each(backend, dir, cmp, |p, r| {
        results.push((p, r));
        Ok::<(), std::convert::Infallible>(())
    });
    results
}

/// [`run_dir_with`], handing each case's result to `report` as soon as it
/// is known, in the same order: a report written as it goes shows every
/// case that ran, even if a later one takes the process down. Stops at the
/// first error `report` returns, and returns it.
pub fn run_dir_each<E>(
    backend: &Backend,
    dir: &Path,
    cmp: Comparison,
    report: impl FnMut(PathBuf, Result<CaseOutcome, CaseError>) -> Result<(), E>,
) -> Result<(), E> {
    each_case(
        dir,
        |p| load_case(p).map(|c| run_case_with(backend, &c, cmp)),
        report,
    )
}

/// `run` on every `.npz` file of `dir`, sorted by file name, each on its
/// own, its result handed to `report` before the next runs: a case that
/// panics is a [`CaseError::Panicked`] with the panic's message, and the
/// next case runs.
fn each_case<E>(
    dir: &Path,
    run: impl Fn(&Path) -> Result<CaseOutcome, CaseError>,
    mut report: impl FnMut(PathBuf, Result<CaseOutcome, CaseError>) -> Result<(), E>,
) -> Result<(), E> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            // Every `.npz` name, whatever it names: one that is not a
            // readable regular file (a FIFO, a directory) is reported as
            // an error of its own, never left out of the count.
            .filter(|p| p.extension().is_some_and(|x| x == "npz"))
            .collect(),
        Err(e) => {
            return report(
                dir.to_path_buf(),
                Err(CaseError::Read {
                    file: dir.to_path_buf(),
                    reason: format!("cannot list the directory: {e}"),
                }),
            )
        }
    };
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    for p in files {
        // Unwind safety: a panicking case's partial state (its arrays, a
        // half-staged buffer) is dropped or left to the backend, which
        // every later case uses only through its checked entry points.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&p))).unwrap_or_else(
            |payload| {
                Err(CaseError::Panicked {
                    file: p.clone(),
                    message: crate::plugin_support::panic_message(&*payload),
                })
            },
        );
        report(p, r)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A case that panics is a failure with the panic's message, and the
    /// cases after it still run.
    #[test]
    fn a_panicking_case_fails_alone() {
        let dir = std::env::temp_dir().join(format!("toast-each-case-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["a.npz", "b.npz", "c.npz", "notes.txt"] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        let ran = std::cell::RefCell::new(Vec::new());
        let mut results = Vec::new();
        let Ok(()) = each_case(
            &dir,
            |p| {
                let name = p.file_stem().unwrap().to_string_lossy().into_owned();
                ran.borrow_mut().push(name.clone());
                if name == "b" {
                    let v: Vec<u8> = Vec::new();
                    panic!("index {} out of range in the adapter", v.len() + 7);
                }
                Ok(CaseOutcome::Pass)
            },
            |p, r| {
                // Each result is reported before the next case runs.
                assert_eq!(ran.borrow().len(), results.len() + 1);
                results.push((p, r));
                Ok::<(), std::convert::Infallible>(())
            },
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(*ran.borrow(), ["a", "b", "c"]);
        assert_eq!(results.len(), 3);
        assert!(matches!(results[0].1, Ok(CaseOutcome::Pass)));
        assert!(matches!(results[2].1, Ok(CaseOutcome::Pass)));
        match &results[1].1 {
            Err(e @ CaseError::Panicked { message, .. }) => {
                assert_eq!(message, "index 7 out of range in the adapter");
                let text = e.to_string();
                assert!(text.contains("b.npz: the case panicked: index 7"), "{text}");
            }
            other => panic!("{other:?}"),
        }
    }
}
