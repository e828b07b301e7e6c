//! Every shipped TOAST reference case must pass on the CUDA and HIP plugins
//! running on the emulated drivers of `toast-gpu-emu` (no GPU needed): the
//! real plugins, real NVRTC / hiprtc compilation of the shared source, real
//! driver calls answered by the emulator, which runs the same `kernels.h`
//! compiled for the host. The emulator computes in the CPU's order, so every
//! case must pass **exactly** (not merely within the runner's tolerance for
//! device backends), except `stokes_weights_IQU`, whose trigonometry is the
//! device source's own correctly rounded functions (the same bits as on any
//! GPU, an ulp from glibc's where glibc errs), and the filters.
//!
//! One test, written once, instantiated per backend. Each instance runs
//! itself again in a child process with the emulator first on
//! `LD_LIBRARY_PATH` (`toast_testkit::emulated::rerun_self`).
//!
//! # When something is missing
//!
//! Without the emulator library next to the test executable, or without
//! the run-time compiler (NVRTC: `TOAST_NVRTC_LIB` or `libnvrtc.so`;
//! hiprtc: `TOAST_HIPRTC_LIB`, `libhiprtc.so` or `libamdhip64.so.5`), the
//! test prints `SKIPPED: emulated <backend>: <reason>` and passes, **only
//! when `TOAST_REQUIRE_EMULATED_GPU` is unset**; `.ci/run` and the CI jobs
//! set it, so there a missing piece is a failure.

use std::sync::Arc;
use std::time::Duration;
use toast_accel::abi::Kernel;
use toast_accel::host::conformance::Comparison;
use toast_testkit::emulated::{rerun_self, CHILD, REQUIRE};
use toast_testkit::plugins::{load, skip_unless_required};
use toast_testkit::process::text;
use toast_tests::assert_all_cases_pass;

/// In the parent: run `test` again on the emulated `backend` and require
/// it to pass. In the child: the conformance suite.
fn conformance(test: &str, backend: &str) {
    in_child(test, backend, suite);
}

/// In the parent: run `test` again on the emulated `backend` and require
/// it to pass. In the child: `body(backend)`.
fn in_child(test: &str, backend: &str, body: fn(&str)) {
    if std::env::var(CHILD).is_ok_and(|b| b == backend) {
        return body(backend);
    }
    match rerun_self(test, backend, Duration::from_secs(600)) {
        Ok(out) => {
            let log = text(&out);
            println!("{log}");
            assert!(out.status.success(), "emulated {backend}:\n{log}");
        }
        Err(why) => skip_unless_required(REQUIRE, format!("emulated {backend}: {why}")),
    }
}

fn suite(backend: &str) {
    let b = match Arc::new(load(backend)).init("") {
        Ok(b) => b,
        Err(e) => return skip_unless_required(REQUIRE, format!("emulated {backend}: {e}")),
    };
    let dev = b.device_info(0).expect("device_info");
    assert!(
        dev.name.contains("emulated"),
        "{backend} is not on the emulated driver: device `{}`",
        dev.name
    );
    // The emulated device has the host's CPUs as its compute units, read
    // as a GPU's are (CUDA's multiprocessor attribute, HIP's too).
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get().min(1024));
    assert_eq!(dev.compute_units as usize, cpus, "{backend}: compute units");
    // It emulates a discrete GPU, and says so as a GPU does (CUDA's
    // integrated attribute, HIP's too: ABI minor 9), unless
    // TOAST_EMU_INTEGRATED=1 makes it an integrated one.
    let want = match std::env::var("TOAST_EMU_INTEGRATED").as_deref() {
        Ok("1") => toast_accel::abi::DeviceMemoryKind::Host,
        _ => toast_accel::abi::DeviceMemoryKind::Own,
    };
    assert_eq!(dev.memory_kind, want, "{backend}: memory kind");
    // Exactly, but for stokes_weights_IQU, the filters and the offset
    // projection: the emulator runs the device source with the host's libm,
    // but stokes_weights_IQU uses the source's own correctly rounded
    // atan2/sin/cos (an ulp from glibc's where glibc errs above half an
    // ulp), the filters are within their tolerance of TOAST's LAPACK on
    // every backend, and template_offset_project_signal sums an amplitude's
    // samples by a block's fixed-shape tree (rounding, AMP_RTOL).
    assert_all_cases_pass(
        &b,
        Comparison::Tolerant,
        &[
            Kernel::StokesWeightsIqu,
            Kernel::FilterPolynomial,
            Kernel::FilterPoly2d,
            Kernel::TemplateOffsetProjectSignal,
        ],
    );
    println!(
        "emulated {backend}: {} cases passed (exactly, stokes_weights_IQU and the filters within tolerance) on `{}`",
        toast_tests::SHIPPED_CASES,
        dev.name
    );
}

macro_rules! emulated_conformance {
    ($($test:ident => $backend:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            conformance(stringify!($test), $backend);
        }
    )*};
}

emulated_conformance! {
    all_cases_pass_on_emulated_cuda => "cuda",
    all_cases_pass_on_emulated_hip => "hip",
}

/// `filter_poly2D` on the emulated `backend`, launched in chunks of 37
/// samples: the CPU's bits where masks change in bursts (the device
/// decomposes only at mask changes and chunk starts), in both workspace
/// layouts.
fn poly2d_bursts(backend: &str) {
    for options in [
        toast_tests::POLY2D_SMALL_CHUNKS.to_string(),
        format!("{};workspace=interleaved", toast_tests::POLY2D_SMALL_CHUNKS),
        String::new(),
    ] {
        let b = match Arc::new(load(backend)).init(&options) {
            Ok(b) => b,
            Err(e) => return skip_unless_required(REQUIRE, format!("emulated {backend}: {e}")),
        };
        toast_tests::assert_poly2d_bursts_match_cpu(&b);
    }
    println!("emulated {backend}: filter_poly2D in bursts and small chunks: the cpu's bits");
}

macro_rules! emulated_poly2d {
    ($($test:ident => $backend:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            in_child(stringify!($test), $backend, poly2d_bursts);
        }
    )*};
}

emulated_poly2d! {
    poly2d_bursts_match_the_cpu_on_emulated_cuda => "cuda",
    poly2d_bursts_match_the_cpu_on_emulated_hip => "hip",
}

/// [`toast_tests::assert_huge_step_matches_cpu`] on the emulated `backend`.
fn huge_step(backend: &str) {
    let b = match Arc::new(load(backend)).init("") {
        Ok(b) => b,
        Err(e) => return skip_unless_required(REQUIRE, format!("emulated {backend}: {e}")),
    };
    toast_tests::assert_huge_step_matches_cpu(&b);
    println!("emulated {backend}: a step length past the data: the cpu's amplitudes");
}

#[test]
fn a_huge_step_length_matches_the_cpu_on_emulated_cuda() {
    in_child(
        "a_huge_step_length_matches_the_cpu_on_emulated_cuda",
        "cuda",
        huge_step,
    );
}

#[test]
fn a_huge_step_length_matches_the_cpu_on_emulated_hip() {
    in_child(
        "a_huge_step_length_matches_the_cpu_on_emulated_hip",
        "hip",
        huge_step,
    );
}

/// [`toast_tests::assert_faults_leave_accumulated_outputs`] on the emulated
/// `backend`.
fn faults_leave_outputs(backend: &str) {
    let b = match Arc::new(load(backend)).init("") {
        Ok(b) => b,
        Err(e) => return skip_unless_required(REQUIRE, format!("emulated {backend}: {e}")),
    };
    toast_tests::assert_faults_leave_accumulated_outputs(&b);
    println!("emulated {backend}: failed calls left the host's outputs as they were");
}

#[test]
fn faults_leave_accumulated_outputs_untouched_on_emulated_cuda() {
    in_child(
        "faults_leave_accumulated_outputs_untouched_on_emulated_cuda",
        "cuda",
        faults_leave_outputs,
    );
}

#[test]
fn faults_leave_accumulated_outputs_untouched_on_emulated_hip() {
    in_child(
        "faults_leave_accumulated_outputs_untouched_on_emulated_hip",
        "hip",
        faults_leave_outputs,
    );
}
