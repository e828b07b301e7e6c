//! Workspace-level integration tests live in `tests/tests/`; this library
//! holds what several of them share: the conformance suite, written once and
//! instantiated per backend ([`conformance_suite!`]).

use std::sync::Arc;
use toast_accel::abi::Kernel;
use toast_accel::host::conformance::{kernel_of, run_dir, CaseOutcome, Comparison};
use toast_accel::host::{AccelError, Backend};
use toast_testkit::plugins::{load, skip_unless_required};

pub use toast_testkit::{shipped_cases_dir as cases_dir, SHIPPED_CASES};

/// The plugin `name` (loaded from its shared library, through the ABI),
/// initialised with `options`; or `None`, after printing `SKIPPED: reason`,
/// when it is unavailable here and the environment variable `require` is
/// unset (CI sets it, so there an absent backend fails); an empty `require`
/// means the backend is always required (the CPU). Any other failure to
/// initialise fails the test.
pub fn backend_or_skip(name: &str, options: &str, require: &str) -> Option<Backend> {
    match Arc::new(load(name)).init(options) {
        Ok(b) => Some(b),
        Err(e) => {
            assert!(
                !require.is_empty(),
                "the {name} backend must be available: {e}"
            );
            skip_unless_required(require, &e);
            assert!(
                matches!(e, AccelError::Unavailable { .. }),
                "an absent {name} backend must be `unavailable`, got: {e}"
            );
            None
        }
    }
}

/// The map-maker's fused kernels (ABI minor 4): their compact-form cases
/// pass within `FUSED_COMPACT_RTOL` on every backend (the rebuilt weights
/// are a few ulp from TOAST's), so every suite lists them as tolerant.
pub const FUSED_KERNELS: [Kernel; 3] = [
    Kernel::CompactExpandPointing,
    Kernel::FusedAccumulate,
    Kernel::FusedProject,
];

/// `sim_noise` (ABI minor 5): TOAST's inverse FFT is FFTW's, ours another
/// (realfft on the CPU, a Stockham FFT on a device), so its cases pass
/// within `NOISE_RTOL` on every backend, and every suite lists it as
/// tolerant.
pub const NOISE_KERNELS: [Kernel; 1] = [Kernel::SimNoise];

/// Every shipped case passes on `b`, in the comparison the runner uses for
/// it (`expected`: exact for host backends, tolerant for devices), only the
/// kernels in `tolerant` needing the tolerance; a device backend's staged
/// buffers are all freed.
pub fn assert_all_cases_pass(b: &Backend, expected: Comparison, tolerant: &[Kernel]) {
    assert_eq!(Comparison::for_backend(b), expected, "{}", b.name());
    let results = run_dir(b, &cases_dir());
    assert_eq!(results.len(), SHIPPED_CASES);
    let mut failures = Vec::new();
    for (path, r) in &results {
        match r {
            Ok(CaseOutcome::Pass) => {}
            Ok(o @ CaseOutcome::PassTolerant { .. }) => {
                let n = path.file_stem().unwrap_or_default().to_string_lossy();
                if !kernel_of(&n).is_some_and(|k| {
                    tolerant.contains(&k)
                        || FUSED_KERNELS.contains(&k)
                        || NOISE_KERNELS.contains(&k)
                }) {
                    failures.push(format!("{}: needed the tolerance: {o}", path.display()));
                }
            }
            Ok(o) => failures.push(format!("{}: {o}", path.display())),
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(
        failures.is_empty(),
        "[{}] failures:\n{}",
        b.name(),
        failures.join("\n")
    );
    if !b.host_addressable() {
        let st = b.stats().snapshot();
        assert!(st.h2d_calls > 0 && st.d2h_calls > 0, "{st:?}");
        assert_eq!(st.allocs, st.frees, "every staged buffer is freed: {st:?}");
    }
}

/// One conformance test for one backend: `test_name: backend = "NAME",
/// options = "…", require = "ENV_VAR" (or "" for always),
/// comparison = Exact | Tolerant, tolerant = [Kernel, …]`. The same test for every backend; a backend that
/// is unavailable is skipped with its reason unless `require` is set.
#[macro_export]
macro_rules! conformance_suite {
    ($test:ident: backend = $name:literal, options = $options:literal, require = $require:literal,
     comparison = $cmp:ident, tolerant = [$($kernel:ident),* $(,)?] $(,)?) => {
        #[test]
        fn $test() {
            let Some(b) = $crate::backend_or_skip($name, $options, $require) else {
                return;
            };
            $crate::assert_all_cases_pass(
                &b,
                ::toast_accel::host::conformance::Comparison::$cmp,
                &[$(::toast_accel::abi::Kernel::$kernel),*],
            );
        }
    };
}
