//! The CUDA backend plugin of toast-rs: the shared device-kernel source of
//! `toast_accel::device_source`, compiled at run time with NVRTC for the
//! device's architecture, behind the C plugin ABI of
//! `toast-accel/include/toast_backend.h`.
//!
//! This crate is the CUDA [`toast_gpu::Driver`] (`driver`): loading the
//! driver and NVRTC, the device, its stream, memory, copies, module loading
//! and kernel launches. Everything else (the context the host holds, the
//! buffer pool and handle table, the kernels' validation, marshalling and
//! launch planning, the C entry points) is `toast-gpu`'s generic code, and
//! the plugin's table, header and entry symbol come from
//! [`toast_gpu::export_plugin!`].
//!
//! # Building needs no CUDA
//!
//! The driver is reached through `cudarc` with `dynamic-loading` (the
//! `cuda-12000` bindings: entry points every 12.x and 13.x driver has) and
//! NVRTC through `libloading` (`toast_accel::rtc::nvrtc`); nothing is
//! linked at build time and no toolkit is needed to build. cudarc panics when `libcuda` is
//! missing, so `init` first opens `libcuda.so.1` with a plain `dlopen`,
//! then NVRTC (`TOAST_NVRTC_LIB`, else `libnvrtc.so`, `.so.13`, `.so.12`,
//! `.so.11.2`), and only then lets cudarc load the driver. A missing
//! library, a failing `cuInit` or zero devices make `init` return
//! `ERR_UNAVAILABLE` with the reason ("no NVIDIA driver (libcuda.so.1): …",
//! "no NVRTC (libnvrtc.so): …", "no NVIDIA GPU: cuDeviceGetCount returned
//! 0"), which `toast-cli backends` lists and `toast-cli verify` prints
//! before skipping every case (exit status 3).
//!
//! # Device, stream, options
//!
//! `init` opens the device named by the plugin option `device=N` or
//! `TOAST_CUDA_DEVICE` (the option wins), else, in a process a launcher
//! started (`mpirun`, `srun`, ...), device `node-local rank % devices`,
//! else device 0; it retains the device's primary context and creates one
//! non-blocking stream. Transfers, memsets and kernels are issued on that
//! stream in order; every entry point makes the context current on the
//! calling thread first, and a context runs one call at a time. Calls are
//! synchronous at the ABI (host memory is only borrowed for the call): a
//! copy waits for the stream before returning; a kernel call queues its
//! launches and waits once, at its end or where it first reads a device
//! value, so a device fault is reported by the call that caused it, naming
//! the kernels it launched since its last wait (the option `sync=launch`
//! waits after every launch instead, naming the one at fault).
//!
//! # Compilation and the disk cache
//!
//! The first kernel call compiles `device_source::source(Target::Cuda)`
//! with NVRTC for the device's `sm_XY`, with `-fmad=false` (no fused
//! multiply-add: the arithmetic rounds as the CPU reference does) and
//! `-default-device`, and loads the cubin. The cubin is cached in
//! `$TOAST_CACHE_DIR`, else `$XDG_CACHE_HOME/toast-rs/` (else
//! `~/.cache/toast-rs/`) as
//! `cuda-<source hash>-<arch>-nvrtc<major>.<minor>.cubin`, so a later
//! process, or another run after an upgrade of either, reuses or rebuilds it
//! correctly (`TOAST_KERNEL_CACHE=0` disables the cache); an entry that is
//! cut, damaged or built for another NVRTC or architecture (each entry
//! carries its length, checksum and identity: `toast_accel::rtc::CacheKey`)
//! is discarded with a warning and compiled again. A compile failure
//! is `ERR_COMPILE` with the NVRTC log, the architecture and the kernel the
//! first error falls in. `toast-cli kernels compile --target cuda --arch
//! sm_80` runs the same compiler path without a GPU.
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
//! Each kernel first runs its `toast_accel::check::check_*` validator (the
//! same as every Rust backend), then resolves its array handles and checks
//! their buffers are large enough, uploads the small per-detector arrays
//! (kept in a small-argument cache, so a repeated call uploads nothing),
//! and launches the shared source's kernels on the grid it defines
//! (sample-in-interval × interval × detector). Data-dependent faults are
//! reported through the source's one-element error buffer and become
//! `ERR_INVALID_ARGUMENT` naming the detector and sample.

mod driver;

toast_gpu::export_plugin!(
    driver = driver::CudaDriver,
    name = "cuda",
    description = "CUDA backend: the shared device kernels compiled with NVRTC at run time",
);
