//! Test support shared by the integration tests of several toast-rs crates.
//!
//! What more than one crate's tests need, written once:
//!
//! * [`fakedev`]: a backend that is **not** host-addressable. Its buffers are
//!   opaque handles into memory it owns, and its kernels translate the
//!   handles and forward to the CPU plugin. It stands in for a GPU: a kernel
//!   given a host address instead of a handle fails ("unknown handle"), so a
//!   test passes only if every array was staged or copied. The staged path
//!   of pipelines is tested this way on any machine.
//! * [`plugins`]: a registry with the CPU plugin (registered from its rlib
//!   entry point, with an explicit thread count) and `fakedev`, an execution
//!   context over it, and the lookup of a plugin's shared library built by
//!   cargo next to the test executable.
//! * [`scan`]: a synthetic satellite-like scan (a boresight on great circles
//!   about a precessing spin axis, detector pairs at several angles with
//!   different NETs), a random sky, and the pointing and scanning operators
//!   set up for them.
//! * [`process`]: running the project's binaries from tests: scratch
//!   directories, captured output, runs with a deadline (a hang fails the
//!   test), and `mpirun` as the MPI tests need it.
//! * [`maps`]: the largest relative difference per field of two map files.
//! * [`emulated`]: the emulated CUDA and HIP drivers (`toast-gpu-emu`) under
//!   the vendors' library names, and a test run again in a child process on
//!   them (the dynamic loader reads `LD_LIBRARY_PATH` only at start).
//! * [`hostile`]: what the property tests of the readers share: mutations
//!   of valid files (bytes flipped, cut, spliced, numbers replaced by absurd
//!   ones) as proptest strategies, and an allocator that records the
//!   largest allocation a call makes.
//!
//! # Why dev-only
//!
//! The crate is `publish = false` and is used only as a
//! `[dev-dependencies]` entry. It depends on `toast-ops` and on the CPU
//! plugin, so a normal dependency on it from `toast-ops` would be a cycle;
//! a dev-dependency is not (cargo builds the tests after the library). Its
//! code panics on failure (`unwrap`, `expect`) as test code does, which has
//! no place in a library that a program links.

pub mod emulated;
pub mod fakedev;
pub mod hostile;
pub mod maps;
pub mod plugins;
pub mod process;
pub mod scan;

/// The TOAST reference cases shipped in the repository
/// (`tests/data/toast-kernels/cases`, described by its `FORMAT.md`).
pub fn shipped_cases_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/toast-kernels/cases")
}

/// How many reference cases [`shipped_cases_dir`] holds: the 61 kernel cases
/// (9 of them the PCG solver's `amp_dot` and `amp_axpby`, numpy references;
/// 4 `stokes_weights_IQU` at the seams of its angles), the 13 cases of the
/// map-maker's fused kernels (`compact_expand_pointing`, `fused_accumulate`,
/// `fused_project`; TOAST's unfused sequence, FORMAT.md section 17), the 4
/// of `sim_noise` (TOAST's `tod_sim_noise_timestream`, section 18), 4 of
/// `cov_accum_timestream` (TOAST's `BuildHitMap` and
/// `BuildInverseCovariance`, section 19), 4 of `solver_flags` (TOAST's
/// map-maker solver flags and `ScanMask`, section 20) and the 61
/// boundary-direction cases
/// (`pointing_detector_boundary` and
/// `pixels_healpix_boundary_{nest,ring}_nside{1..2^29}`). Every test that
/// runs the whole directory expects this many.
pub const SHIPPED_CASES: usize = 147;
