//! Every shipped TOAST reference case must pass bit for bit on the CPU (the
//! polynomial filters within their documented tolerance of TOAST's LAPACK,
//! the fused kernels' compact form and `sim_noise`, whose FFT is not
//! FFTW's, within theirs)
//! plugin, loaded as a real plugin (the cdylib, through the ABI), with one,
//! two and five threads (the suite of `toast_tests::conformance_suite!`,
//! the same test as every backend's), and through staged buffers.

use std::sync::Arc;
use toast_accel::abi::Kernel;
use toast_accel::host::conformance::{kernel_of, run_dir, CaseOutcome};
use toast_accel::host::Plugin;
use toast_testkit::plugins::load;
use toast_tests::{cases_dir, conformance_suite};

// The CPU is the reference: every case bit for bit (the filters within
// tolerance of TOAST's dgelss; the fused kernels' compact form and sim_noise,
// `toast_tests::NOISE_KERNELS`, within theirs), whatever the thread count.
conformance_suite!(
    all_cases_pass_with_one_thread: backend = "cpu", options = "threads=1",
    require = "", comparison = Exact, tolerant = [FilterPolynomial, FilterPoly2d],
);
conformance_suite!(
    all_cases_pass_with_two_threads: backend = "cpu", options = "threads=2",
    require = "", comparison = Exact, tolerant = [FilterPolynomial, FilterPoly2d],
);
// More threads than cores: a stress on the decomposition, not on speed.
conformance_suite!(
    all_cases_pass_with_many_threads: backend = "cpu", options = "threads=5",
    require = "", comparison = Exact, tolerant = [FilterPolynomial, FilterPoly2d],
);

#[test]
fn all_cases_pass_through_staged_buffers() {
    // The cpu plugin, presented as a backend that is not host-addressable:
    // the runner then stages every kernel array through alloc / copy /
    // free. The cpu plugin's handles are host addresses, so its kernels
    // still run, and the staging path of the runner is exercised for real.
    let loaded = load("cpu");
    let staged = Plugin {
        flags: loaded.flags & !toast_accel::abi::FLAG_HOST_ADDRESSABLE,
        ..loaded
    };
    let backend = Arc::new(staged).init("threads=2").expect("init");
    assert!(!backend.host_addressable());
    let results = run_dir(&backend, &cases_dir());
    let failures: Vec<String> = results
        .iter()
        .filter_map(|(p, r)| match r {
            Ok(CaseOutcome::Pass) => None,
            // The filters: within tolerance of TOAST's dgelss; the fused
            // kernels' compact form: rebuilt weights; sim_noise: another FFT
            // (FORMAT.md).
            Ok(CaseOutcome::PassTolerant { .. })
                if kernel_of(&p.file_stem().unwrap_or_default().to_string_lossy()).is_some_and(
                    |k| {
                        matches!(k, Kernel::FilterPolynomial | Kernel::FilterPoly2d)
                            || toast_tests::FUSED_KERNELS.contains(&k)
                            || toast_tests::NOISE_KERNELS.contains(&k)
                    },
                ) =>
            {
                None
            }
            Ok(o) => Some(format!("{}: {o}", p.display())),
            Err(e) => Some(e.to_string()),
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(results.len(), toast_tests::SHIPPED_CASES);
    let st = backend.stats().snapshot();
    assert!(st.h2d_calls > 0 && st.d2h_calls > 0, "{st:?}");
    assert_eq!(st.allocs, st.frees, "every staged buffer is freed: {st:?}");
}

/// A fault late in the data leaves the outputs the map kernels add into as
/// they were, with one thread and with several (each writes its outputs in
/// place: the host arrays are the kernel's).
#[test]
fn faults_leave_accumulated_outputs_untouched() {
    for options in ["threads=1", "threads=3"] {
        let b = Arc::new(load("cpu")).init(options).expect("init");
        toast_tests::assert_faults_leave_accumulated_outputs(&b);
    }
}
