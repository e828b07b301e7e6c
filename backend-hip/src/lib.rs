//! The HIP backend plugin of toast-rs (AMD GPUs): the shared device-kernel
//! source of `toast_accel::device_source`, compiled at run time with hiprtc
//! for the device's `gfx` architecture, behind the C plugin ABI of
//! `toast-accel/include/toast_backend.h`.
//!
//! This crate is the HIP [`toast_gpu::Driver`] (`driver`), over the
//! runtime functions of [`ffi`] (in place of the CUDA backend's cudarc);
//! everything else is `toast-gpu`'s generic code, shared with the CUDA
//! backend, and the plugin's table, header and entry symbol come from
//! [`toast_gpu::export_plugin!`].
//!
//! # Building needs no ROCm
//!
//! The `hip-sys` crate needs ROCm headers and links `libamdhip64` at build
//! time, which breaks every build on a machine without ROCm. Instead [`ffi`]
//! declares the few HIP functions used (`hipInit`, `hipGetDeviceCount`,
//! `hipSetDevice`, `hipGetDeviceProperties`, `hipDeviceTotalMem`,
//! `hipRuntimeGetVersion`, `hipDeviceGetAttribute`,
//! `hipMemGetInfo`, `hipDeviceGetUuid` (optional), `hipMalloc`/`hipFree`, `hipMemcpyAsync`,
//! `hipMemsetAsync`, `hipStreamCreate`/`hipStreamSynchronize`,
//! `hipModuleLoadData`, `hipModuleGetFunction`, `hipModuleLaunchKernel`) and
//! the hiprtc ones, and loads them with `libloading` at run time. ROCm 5.x
//! keeps hiprtc inside `libamdhip64`; ROCm 6 ships `libhiprtc.so`: both are
//! tried (`TOAST_HIPRTC_LIB` names a file explicitly). A missing library,
//! `hipErrorNoDevice` or zero devices make `init` return `ERR_UNAVAILABLE`
//! with the reason ("libamdhip64.so not found …", "no AMD GPU:
//! hipGetDeviceCount returned 0"), which `toast-cli backends` lists and
//! `toast-cli verify` prints before skipping every case (exit status 3).
//!
//! # Device, stream, options
//!
//! `init` opens the device named by the plugin option `device=N` or
//! `TOAST_HIP_DEVICE` (the option wins), else, in a process a launcher
//! started, device `node-local rank % devices`, else device 0; it reads
//! its name and `gfx` architecture, and creates one stream; every entry
//! point selects the device on the calling thread first, and a context
//! runs one call at a time. Copies, memsets and kernels go to that stream
//! in order, and each call waits for it before returning (host memory is
//! only borrowed for the call): a kernel call queues its launches and
//! waits once, as in the CUDA backend (`sync=launch` waits after each).
//!
//! # Compilation and the disk cache
//!
//! The first kernel call compiles `device_source::source(Target::Hip)` with
//! hiprtc for the device's `gfxNNN` (`--offload-arch`, `-O3`,
//! `-ffp-contract=off` so that no multiply-add is fused and the arithmetic
//! rounds as the CPU reference does) and loads the code object. It is cached
//! in `$TOAST_CACHE_DIR`, else `$XDG_CACHE_HOME/toast-rs/` (else
//! `~/.cache/toast-rs/`) as
//! `hip-<source hash>-<arch>-hiprtc<major>.<minor>.co`
//! (`TOAST_KERNEL_CACHE=0` disables the cache); a cut, damaged or foreign
//! entry (see `toast_accel::rtc::CacheKey`) is discarded with a warning and
//! compiled again. A compile failure is
//! `ERR_COMPILE` with the hiprtc log, the architecture and the kernel the
//! first error falls in. `toast-cli kernels compile --target hip --arch
//! gfx90a` runs the same compiler path without a GPU.
//!
//! # Memory
//!
//! Buffers live in a size-class pool with a handle table
//! ([`toast_gpu::memory`]): handles are tagged counters, never device
//! addresses, so a foreign, made-up or freed handle is refused with
//! `ERR_INVALID_HANDLE`; an allocation the device cannot satisfy (after the
//! pool has released its cached blocks) is `ERR_OUT_OF_MEMORY` naming the
//! buffer and its size.
//!
//! # Kernels
//!
//! As in the CUDA backend: each kernel runs its `toast_accel::check`
//! validator, resolves and size-checks its array handles, uploads the small
//! per-detector arrays (cached between calls), and launches the shared source's kernels on the grid
//! it defines; data-dependent faults come back through the source's error
//! buffer as `ERR_INVALID_ARGUMENT` naming the detector and sample.

mod driver;
pub mod ffi;

toast_gpu::export_plugin!(
    driver = driver::HipDriver,
    name = "hip",
    description = "HIP backend: the shared device kernels compiled with hiprtc at run time",
);
