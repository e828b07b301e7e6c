//! The single device-kernel source shared by the GPU plugins (CUDA, HIP,
//! OpenCL), available without the `host` feature.
//!
//! The kernels of the table are written once, in `toast-accel/device/kernels.h`, in a
//! C subset that NVRTC, hiprtc and the OpenCL C compiler (1.2 and 3.0) all
//! accept. A short per-target prelude (`device/prelude_{cuda,hip,opencl}.h`)
//! defines what differs between targets, as the LLVM OpenMP device runtime
//! does:
//!
//! * `KERNEL` (`extern "C" __global__` / `__kernel`), `GLOBAL` (empty /
//!   `__global`), `RESTRICT`, `DEVICE_FN` (helper-function qualifiers);
//! * the integer types `i64`, `u64`, `i32`, `u8` and `I64_MIN`;
//! * the grid indices `GID0` (sample), `GID1` (interval), `GID2` (detector);
//! * `atomic_add_f64` (native `atomicAdd(double*)` on CUDA sm_60+ and HIP; a
//!   compare-and-swap loop on 64-bit integers, `atom_cmpxchg` with
//!   `cl_khr_int64_base_atomics`, in OpenCL) and `atomic_min_u64` (the
//!   data-dependent error buffer);
//! * FP contraction: `#pragma OPENCL FP_CONTRACT OFF` in OpenCL; NVRTC must
//!   be given `-fmad=false` and hiprtc `-ffp-contract=off`
//!   ([`COMPILE_FLAGS`]), so `a*b+c` is never fused and the arithmetic
//!   order matches the CPU reference.
//!
//! A fourth prelude, `device/prelude_host.h`, is not a [`Target`]: the
//! emulated GPU drivers (`toast-gpu-emu`) compile the same kernels with it
//! for the host at build time (C11, `-ffp-contract=off`, thread-local grid
//! indices, `__atomic` atomics), so the CUDA and HIP plugins run without a
//! GPU.
//!
//! [`source`] returns the prelude followed by the kernels, ready for the
//! target's run-time compiler; [`source_hash`] is a stable 64-bit FNV-1a
//! hash of that text (the same on every platform and build) for on-disk
//! caches of compiled programs.
//!
//! # Launch shape
//!
//! Per-sample kernels take `det0, det_end, iv0, iv_end` and run on a 3-D
//! grid: dimension 0 is the sample offset inside an interval (up to the
//! longest interval, rounded up to the work-group size), dimension 1 the
//! interval `iv0 + GID1`, dimension 2 the detector `det0 + GID2`; threads
//! past their interval's end return at once (TOAST's offload layout). The
//! intervals are a device array of `(first, last)` `i64` pairs; the small
//! per-detector arrays (index arrays, calibration, focal-plane quaternions,
//! amplitude offsets) are small device arrays. A host splits a call into
//! several launches (one detector, or one interval, at a time) when two
//! grid points would write the same element (duplicate output rows,
//! overlapping intervals), so each launch writes every element once.
//! `template_offset_project_signal`'s dimension 0 is the amplitude inside a
//! view, and `template_offset_apply_diag_precond` is 1-D over amplitudes.
//! `scan_map` has one kernel per map dtype ([`scan_map_kernel`]).
//!
//! # Determinism and accuracy
//!
//! Every kernel but `build_noise_weighted` writes each output element from
//! one thread in the CPU's operation order (`template_offset_project_signal`
//! gives each amplitude one thread that sums its samples in sample order),
//! so with contraction off they differ from the CPU only through the
//! device's `atan2`, `sin`, `cos` (a few ulps from glibc's; `sqrt` and
//! division are correctly rounded). Pixel indices are exact: a HEALPix
//! pixel can change with the last bit of `phi`, so `pixels_healpix` does not
//! use the device's `atan2` (PoCL's is one ulp off glibc's for z = 2/3 at
//! phi = 3pi/4) but `toast_atan2`, a correctly rounded double-double atan2
//! in `kernels.h` (see `tests/data/toast-kernels/FORMAT.md`, *Boundary
//! directions*); only `stokes_weights_IQU`'s floating-point weights carry
//! the device's trigonometry. `build_noise_weighted` accumulates into
//! `zmap` with atomics, so its summation order, and the last bits of its
//! sums, are not deterministic on a GPU.
//!
//! # Data-dependent errors
//!
//! A pixel beyond the map or in a non-local submap, or a quaternion without
//! a valid pixel, is never used to index memory: the thread stores the key
//! `(det << 44) | sample` into a one-element `u64` error buffer with
//! `atomic_min_u64` and returns. The host initialises the buffer to
//! `u64::MAX` and turns the smallest key ([`decode_error_key`]) into an
//! `ERR_INVALID_ARGUMENT` message naming the detector and the sample.

/// A device compiler target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// CUDA, compiled by NVRTC.
    Cuda,
    /// HIP, compiled by hiprtc.
    Hip,
    /// OpenCL C 1.2 / 3.0.
    OpenCl,
}

impl Target {
    /// The target's name: `cuda`, `hip` or `opencl`.
    pub fn name(self) -> &'static str {
        match self {
            Target::Cuda => "cuda",
            Target::Hip => "hip",
            Target::OpenCl => "opencl",
        }
    }

    /// The target's prelude text.
    pub fn prelude(self) -> &'static str {
        match self {
            Target::Cuda => PRELUDE_CUDA,
            Target::Hip => PRELUDE_HIP,
            Target::OpenCl => PRELUDE_OPENCL,
        }
    }
}

/// The kernels, common to every target.
pub const KERNELS: &str = include_str!("../device/kernels.h");
/// The CUDA prelude.
pub const PRELUDE_CUDA: &str = include_str!("../device/prelude_cuda.h");
/// The HIP prelude.
pub const PRELUDE_HIP: &str = include_str!("../device/prelude_hip.h");
/// The OpenCL prelude.
pub const PRELUDE_OPENCL: &str = include_str!("../device/prelude_opencl.h");

/// Compiler flags each target needs for CPU-matching arithmetic (no FP
/// contraction). OpenCL needs none: its prelude has `FP_CONTRACT OFF`.
pub const fn compile_flags(target: Target) -> &'static [&'static str] {
    match target {
        Target::Cuda => &["-fmad=false"],
        Target::Hip => &["-ffp-contract=off"],
        Target::OpenCl => &[],
    }
}

/// [`compile_flags`] for every target, for documentation and tools.
pub const COMPILE_FLAGS: [(Target, &[&str]); 3] = [
    (Target::Cuda, compile_flags(Target::Cuda)),
    (Target::Hip, compile_flags(Target::Hip)),
    (Target::OpenCl, compile_flags(Target::OpenCl)),
];

/// The full source for `target`: its prelude, then the kernels.
pub fn source(target: Target) -> String {
    let p = target.prelude();
    let mut s = String::with_capacity(p.len() + KERNELS.len() + 64);
    s.push_str(p);
    s.push_str("\n#line 1 \"kernels.h\"\n");
    s.push_str(KERNELS);
    s
}

/// A stable 64-bit FNV-1a hash of [`source`]`(target)`, for caches.
pub fn source_hash(target: Target) -> u64 {
    fnv1a(source(target).as_bytes())
}

/// 64-bit FNV-1a.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The device kernel names (entry points), in ABI table order (from the
/// kernel table, `crate::kernels`); `scan_map` has one per map dtype, see
/// [`scan_map_kernel`].
pub use crate::abi::DEVICE_KERNEL_NAMES as KERNEL_NAMES;

/// The `scan_map` entry point for a `TOAST_DTYPE_*` map dtype.
pub fn scan_map_kernel(dtype: i32) -> Option<&'static str> {
    match dtype {
        crate::abi::DTYPE_F64 => Some("toast_scan_map_f64"),
        crate::abi::DTYPE_F32 => Some("toast_scan_map_f32"),
        crate::abi::DTYPE_I64 => Some("toast_scan_map_i64"),
        crate::abi::DTYPE_I32 => Some("toast_scan_map_i32"),
        _ => None,
    }
}

/// Bits of a data-dependent error key that hold the sample.
pub const ERROR_KEY_SAMPLE_BITS: u32 = 44;

/// The "no error" value of the error buffer.
pub const NO_ERROR: u64 = u64::MAX;

/// `(detector, sample)` of an error key, or `None` for [`NO_ERROR`].
pub fn decode_error_key(key: u64) -> Option<(u64, u64)> {
    (key != NO_ERROR).then_some((
        key >> ERROR_KEY_SAMPLE_BITS,
        key & ((1u64 << ERROR_KEY_SAMPLE_BITS) - 1),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_has_its_prelude_and_every_kernel() {
        for t in [Target::Cuda, Target::Hip, Target::OpenCl] {
            let s = source(t);
            assert!(s.starts_with(t.prelude()));
            for k in KERNEL_NAMES {
                assert!(
                    s.contains(&format!(" {k}(")) || s.contains(&format!("({k},")),
                    "{k}"
                );
            }
        }
        assert!(PRELUDE_OPENCL.contains("FP_CONTRACT OFF"));
    }

    #[test]
    fn hash_is_stable_and_per_target() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(source_hash(Target::Cuda), source_hash(Target::OpenCl));
        assert_eq!(source_hash(Target::Hip), source_hash(Target::Hip));
    }

    #[test]
    fn error_keys_round_trip() {
        assert_eq!(decode_error_key(NO_ERROR), None);
        assert_eq!(decode_error_key((3 << 44) | 17), Some((3, 17)));
    }
}
