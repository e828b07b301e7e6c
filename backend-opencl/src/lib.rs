//! The OpenCL backend plugin of toast-rs: the shared device-kernel source of
//! `toast_accel::device_source`, compiled at run time by the OpenCL C
//! compiler, behind the C plugin ABI of `toast-accel/include/toast_backend.h`.
//!
//! This crate is the OpenCL [`toast_gpu::Driver`] and nothing else: which
//! device ([`device`]: platform and device selection, the requirements, the
//! OpenCL context and programs) and the raw operations on it ([`driver`]:
//! the backend context's own queue, buffers, copies, fills, compiling and
//! loading the program, launches).
//! Everything else (the context the host holds, options, the disk cache of
//! compiled code, the buffer pool and handle table, the kernels' validation,
//! marshalling and launch planning, the C entry points) is `toast-gpu`'s
//! generic code, shared with CUDA and HIP, and the plugin's table, header
//! and entry symbol come from [`toast_gpu::export_plugin!`]. So OpenCL on
//! PoCL (OpenCL on the CPU) runs, in CI, the same host code as the CUDA and
//! HIP plugins.
//!
//! # Building and loading
//!
//! The `opencl3` crate is used with its default `dynamic` feature: libOpenCL
//! (the ICD loader, `libOpenCL.so.1`, or the paths in `OPENCL_DYLIB_PATH`)
//! is opened at run time, so building needs no OpenCL SDK or library. When
//! it is absent, `init` fails with `ERR_UNAVAILABLE` "no OpenCL runtime
//! (libOpenCL.so.1)"; with no platform or no device, or a device without
//! `cl_khr_fp64` and `cl_khr_int64_base_atomics` (double precision, and the
//! 64-bit compare-and-swap of the atomic helpers), it is unavailable with
//! that reason. `toast-cli backends` shows it.
//!
//! # Device selection
//!
//! The plugin option `device=SEL` (which wins) or the environment variable
//! `TOAST_OPENCL_DEVICE=SEL`: `SEL` is `N` (the N-th suitable device from
//! 0, over all platforms in `clinfo -l` order: the index CUDA's and HIP's
//! `device=N` take), `P:D` (platform and device indices, as `clinfo -l`
//! lists them) or a case-insensitive substring of the device name
//! ([`device::Selector`]). Without a selector the first device with
//! both extensions is used, or, in a process a launcher started, the
//! suitable device `node-local rank % count`. The OpenCL context is made
//! once per device and process and shared by every backend context on that
//! device, as are the programs built on it and their kernel objects
//! (setting a kernel's arguments and enqueueing it happen under one lock
//! per device). Each
//! backend context has its own in-order queue, as a CUDA or HIP context has
//! its own stream: its waits see only its own commands, so a failed command
//! is reported by the context that queued it.
//!
//! # Compilation and the disk cache
//!
//! The first kernel call builds `device_source::source(Target::OpenCl)`
//! (its prelude turns FP contraction off, so no compiler flag is needed) and
//! keeps the program; a failed build is `ERR_COMPILE` with the compiler's
//! build log, the device, the source hash and the kernel the first error
//! falls in. The program binary is cached by `toast-gpu` in the shared
//! kernel cache (`$TOAST_CACHE_DIR`, else `$XDG_CACHE_HOME/toast-rs`, else
//! `~/.cache/toast-rs`) as `opencl-<source hash>-<key>.bin`, the key a hash
//! of the device name, platform and driver version; `TOAST_OPENCL_CACHE=0`
//! (or `TOAST_KERNEL_CACHE=0` for every backend) turns it off. Each entry
//! carries its length, a checksum and the device, platform and driver it
//! was built for (`toast_accel::rtc::CacheKey`), and is written atomically:
//! a cut, damaged or foreign entry is discarded with a warning before the
//! runtime sees it (PoCL crashed on a truncated binary), and a binary the
//! runtime refuses is too; either is rebuilt from source.
//!
//! # Memory
//!
//! A buffer ([`driver::Mem`]) is an OpenCL memory object; kernels receive
//! the object itself (`clSetKernelArg`), a null object for an absent array,
//! and take whole buffers, so no offset is passed. Allocation is lazy in
//! OpenCL, so `alloc` fills every new buffer with zeros at once
//! (`Driver::ZEROES_ON_ALLOC`): that zeroes it, as every backend's buffers
//! are, and makes a failed allocation `ERR_OUT_OF_MEMORY` naming the buffer
//! and its size at `alloc`, as does a request above the device's
//! `CL_DEVICE_MAX_MEM_ALLOC_SIZE` (`Driver::max_allocation`, which also caps
//! the pool's size classes). OpenCL cannot tell the free memory, so
//! `device_info` reports it as 0 ("unknown"). Handles, the pool, foreign or
//! freed handles (`ERR_INVALID_HANDLE`) are `toast_gpu::memory`'s.
//!
//! # Launches and accuracy
//!
//! `toast-gpu` plans launches on the source's grid (sample-in-interval ×
//! interval × detector, blocks of 128 along dimension 0). OpenCL takes a
//! global size, which is blocks × threads along dimension 0 (a multiple of
//! the local size, as OpenCL 1.2 requires) and the block counts along 1 and
//! 2; the local size is 128 × 1 × 1 when the kernel allows groups that
//! large on the device (`CL_KERNEL_WORK_GROUP_SIZE`,
//! `CL_DEVICE_MAX_WORK_ITEM_SIZES`), else the implementation picks one.
//! Results differ from the CPU backend only by the device's
//! `atan2`/`sin`/`cos` (a few ulps; pixel indices can then differ at
//! directions on a pixel boundary) and by the order of the atomic sums of
//! `build_noise_weighted`; the conformance runner compares this backend in
//! its tolerant mode (`toast_accel::host::conformance`).

pub mod device;
pub mod driver;

toast_gpu::export_plugin!(
    driver = driver::OpenClDriver,
    name = "opencl",
    description = "OpenCL backend: the shared device kernels compiled by the OpenCL runtime (run-time libOpenCL)",
);
