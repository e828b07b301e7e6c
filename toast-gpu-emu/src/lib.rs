//! Host emulation of the GPU APIs the toast-rs CUDA and HIP plugins call, so
//! that their host code (cudarc calls, NVRTC / hiprtc compilation, parameter
//! packing, the memory pool, launch planning) runs for real on a machine
//! without a GPU, in CI.
//!
//! # The design
//!
//! Two shared libraries stand in for the vendors' ones, each exporting the
//! entry points its plugin resolves, with the vendor's C prototypes and
//! error codes:
//!
//! - `toast-emu-cuda` (`libtoast_emu_cuda.so`, soname `libcuda.so.1`): the
//!   CUDA driver API calls of `backend-cuda` (through cudarc 0.19, which
//!   resolves each symbol on its first call);
//! - `toast-emu-hip` (`libtoast_emu_hip.so`, soname `libamdhip64.so`): the
//!   HIP runtime calls of `backend-hip` (which resolves its whole list when
//!   it opens the library), with the ROCm 5.x `hipDeviceProp_t`.
//!
//! `scripts/emulated-gpu.sh` links them as `libcuda.so.1` / `libcuda.so`
//! and `libamdhip64.so` into `target/emulated-gpu/{cuda,hip}/` and puts those
//! directories first on `LD_LIBRARY_PATH`; the plugins are unchanged. This
//! crate is what both share:
//!
//! - [`kernels`]: the device source, `toast-accel/device/kernels.h`, compiled
//!   for the host by the build script behind `prelude_host.h` (C11,
//!   `-ffp-contract=off`; grid indices in thread-local variables; real
//!   atomics), and a launcher per kernel that unpacks `kernelParams` and
//!   loops over the grid. The kernel list comes from the preprocessed source
//!   (never a hand-written list), so a kernel added to `kernels.h` is
//!   emulated with no change here.
//! - [`heap`]: device memory as host allocations, with a table that every
//!   copy, fill, free and kernel pointer argument is checked against.
//! - [`image`]: the compiled module is checked to be what the real compiler
//!   makes (cubin, PTX, AMD code object or offload bundle), and a function
//!   is found only if the module defines it, then resolved to the host
//!   build of the kernel of that name.
//! - [`api`]: what both APIs' entry points share (streams, modules and
//!   launches of a [`api::Runtime`], out-pointer writes, the one device);
//!   [`Handles`]: streams and modules as opaque handles checked on use.
//!
//! Written in Rust (the kernels alone in C, as they must be): the API
//! surface is mostly bookkeeping and validation, where Rust's checked
//! arithmetic, collections and panics caught at the boundary keep a bad
//! call an error code rather than a crash, under the workspace's lints.
//!
//! # Where the emulation is not faithful
//!
//! - **Execution order.** By default a launch runs its threads one after
//!   another, block by block (x fastest, then y, then z), thread x fastest
//!   within a block, on the calling thread: deterministic, and
//!   `build_noise_weighted`'s atomic sums come out in the CPU's order.
//!   `TOAST_EMU_THREADS=N` runs contiguous runs of blocks on N host threads
//!   instead: the atomics (real `__atomic` compare-and-swap loops) contend,
//!   sums lose their order as on a device, and two blocks writing the same
//!   element (a launch-planning bug) become visible; threads within a block
//!   still run one after another. A kernel that reaches a block barrier
//!   (`BLOCK_BARRIER`, the polynomial filters' one-block-per-fit kernels)
//!   runs each thread of a block on its own fiber (the `fibers` module:
//!   `corosensei` coroutines), in thread order up to the barrier, round
//!   after round, so the barrier and block-shared arrays work as on a
//!   device; threads of one block that reach different barriers fail the
//!   launch (`LAUNCH_FAILED`) with a message naming the block. Either way there are no warps: no
//!   lock-step execution, no divergence cost, no warp intrinsics (the
//!   kernels use none), and a race the device's scheduling would expose may
//!   go unseen.
//! - **Memory.** Block-shared arrays (`BLOCK_SHARED`, static size) are
//!   thread-local arrays of the host thread running the block; dynamic
//!   shared memory is `NOT_SUPPORTED` (the kernels use none); no memory
//!   model beyond
//!   sequential execution. Pointer arguments are checked to lie in a live
//!   allocation, but accesses inside a kernel are not bounds-checked: an
//!   out-of-bounds access reads or writes host memory (a device would fault
//!   or silently corrupt too). The emulated device has 16 GiB (or
//!   `TOAST_EMU_MEMORY`: see "Fault injection" below); allocations
//!   are 256-byte aligned and filled with `0xA5` bytes.
//! - **Streams.** Everything runs synchronously at the call (an `…Async`
//!   copy has completed when it returns); stream handles are checked, never
//!   queued on. Overlap of copies and kernels is never exercised.
//! - **Arithmetic.** The host's libm (glibc) computes what the device source
//!   takes from libm, as the CPU backend's does, where a device has its own
//!   (a few ulps apart): results match the CPU bit for bit where a device
//!   would match within the conformance runner's tolerance. The exception
//!   is `stokes_weights_IQU`, whose trigonometry is the source's own
//!   correctly rounded `toast_atan2`/`toast_sin`/`toast_cos`: the bits any
//!   GPU gives, an ulp from glibc's where glibc errs above half an ulp. x86-64 arithmetic has no
//!   fused multiply-add without contraction, like NVRTC's `-fmad=false`;
//!   subnormals are kept, as in double precision on the devices.
//! - **Device code.** The module's binary is checked and its symbols read,
//!   never executed: a miscompilation by NVRTC or hiprtc, or a bug only in
//!   device code generation, is not caught here.
//!
//! # Fault injection
//!
//! Device faults happen half-way through a run on a real GPU (a launch that
//! fails, a copy that faults, an allocation that does not fit); the
//! emulators make them on demand, so the plugins' and the host's handling
//! of each is tested ([`faults`]):
//!
//! - `TOAST_EMU_FAIL=KIND:N` makes the `N`th call (1-based) of one kind fail:
//!   `alloc` (`cuMemAlloc`, `hipMalloc`: out of memory), `copy` (the
//!   copies and fills), `launch` (`cuLaunchKernel`, `hipModuleLaunchKernel`)
//!   or `sync` (`cuStreamSynchronize`, `hipStreamSynchronize`); the last
//!   three fail as a device fault does (`CUDA_ERROR_LAUNCH_FAILED`,
//!   `hipErrorLaunchFailure`). Only that call fails; with `KIND:N+` every
//!   later call of the kind fails too (an exhausted device stays so: a
//!   single failed allocation is absorbed by the plugins' memory pool,
//!   which releases its cached blocks and retries).
//! - `TOAST_EMU_COUNTS=FILE` writes the number of calls of each kind made
//!   so far to `FILE` (`alloc N` lines) after every counted call: how a test
//!   learns the range of `N` to sweep.
//! - `TOAST_EMU_MEMORY=BYTES` sets the emulated device's memory (default
//!   16 GiB; `K`, `M`, `G` suffixes are powers of 1024).
//! - `TOAST_EMU_DEVICES=N` (1 to 16) reports N devices, named `… #k`, that
//!   share the one heap: enough to show which device a process chose (the
//!   plugins spread the ranks of a node over its devices).
//! - `TOAST_EMU_INTEGRATED=1` makes the device say it is integrated (its
//!   memory the host's, as an APU's: CUDA's `CU_DEVICE_ATTRIBUTE_INTEGRATED`,
//!   HIP's `hipDeviceAttributeIntegrated`); by default it is a discrete GPU.
//!
//! A malformed value is reported on standard error once and ignored.
//!
//! Only a real GPU exercises the vendor driver itself, device code
//! generation, concurrency inside a launch and asynchronous streams.

pub mod api;
pub mod faults;
mod fibers;
pub mod heap;
pub mod image;
pub mod kernels;

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Why an emulated call failed, with a message for `TOAST_EMU_TRACE`; each
/// API maps the variant to its own error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmuError {
    /// A bad argument (`CUDA_ERROR_INVALID_VALUE`, `hipErrorInvalidValue`).
    InvalidValue(String),
    /// Out of device memory.
    OutOfMemory(String),
    /// An address that is not device memory.
    InvalidPointer(String),
    /// A kernel argument that is not device memory (a device would fault).
    IllegalAddress(String),
    /// A handle (stream, module, function) that is not live.
    InvalidHandle(String),
    /// A module image of no known format.
    InvalidImage(String),
    /// A name the module does not define.
    NotFound(String),
    /// A device index that does not exist.
    InvalidDevice(String),
    /// The API was used before its initialisation call.
    NotInitialized(String),
    /// No current context on this thread (CUDA).
    InvalidContext(String),
    /// A feature the emulator does not provide.
    NotSupported(String),
    /// A panic inside the emulator (a bug here).
    Internal(String),
    /// A device fault injected by `TOAST_EMU_FAIL` ([`faults`]).
    Injected(String),
    /// A kernel that misbehaved as a device cannot report otherwise (the
    /// threads of a block reaching different barriers): a launch failure.
    LaunchFailed(String),
}

impl EmuError {
    /// The message.
    pub fn message(&self) -> &str {
        match self {
            EmuError::InvalidValue(m)
            | EmuError::OutOfMemory(m)
            | EmuError::InvalidPointer(m)
            | EmuError::IllegalAddress(m)
            | EmuError::InvalidHandle(m)
            | EmuError::InvalidImage(m)
            | EmuError::NotFound(m)
            | EmuError::InvalidDevice(m)
            | EmuError::NotInitialized(m)
            | EmuError::InvalidContext(m)
            | EmuError::NotSupported(m)
            | EmuError::Internal(m)
            | EmuError::Injected(m)
            | EmuError::LaunchFailed(m) => m,
        }
    }
}

/// Run one API call: its result, or `EmuError::Internal` if it panicked
/// (a panic never crosses the C boundary). A failure is printed to stderr
/// when `TOAST_EMU_TRACE` is set, prefixed with the library and the call.
pub fn call(
    api: &str,
    name: &str,
    f: impl FnOnce() -> Result<(), EmuError>,
) -> Result<(), EmuError> {
    let r = faults::before_call(name).and_then(|()| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(EmuError::Internal(format!("panic: {msg}")))
        })
    });
    if let Err(e) = &r {
        if std::env::var_os("TOAST_EMU_TRACE").is_some_and(|v| !v.is_empty()) {
            eprintln!("toast-gpu-emu {api}: {name}: {e:?}");
        }
    }
    r
}

/// Opaque handles of one kind (streams, modules) with what each holds: a
/// handle is a non-zero counter with the kind's tag in its high bits,
/// never an address, so a foreign or released handle is refused.
#[derive(Debug)]
pub struct Handles<T> {
    tag: u64,
    live: Mutex<(u64, BTreeMap<u64, T>)>,
}

impl<T: Clone> Handles<T> {
    /// An empty set whose handles carry `tag` (the high 16 bits).
    pub const fn new(tag: u16) -> Self {
        Handles {
            tag: (tag as u64) << 48,
            live: Mutex::new((0, BTreeMap::new())),
        }
    }

    /// A new handle holding `v`.
    pub fn insert(&self, v: T) -> u64 {
        let mut g = self.live.lock().unwrap_or_else(|p| p.into_inner());
        g.0 += 1;
        let h = self.tag | g.0;
        g.1.insert(h, v);
        h
    }

    /// What handle `h` holds, if it is live.
    pub fn get(&self, h: u64) -> Option<T> {
        let g = self.live.lock().unwrap_or_else(|p| p.into_inner());
        g.1.get(&h).cloned()
    }

    /// Release `h`; whether it was live.
    pub fn remove(&self, h: u64) -> bool {
        let mut g = self.live.lock().unwrap_or_else(|p| p.into_inner());
        g.1.remove(&h).is_some()
    }
}

/// The emulated device's launch limits (those of a CUDA sm_80 device; the
/// HIP library uses the same).
pub const LIMITS: kernels::Limits = kernels::Limits {
    max_threads_per_block: 1024,
    max_block: [1024, 1024, 64],
    max_grid: [i32::MAX as u32, 65535, 65535],
};

/// Compute units the emulated device reports: the host's CPUs.
pub fn compute_units() -> i32 {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(1024) as i32)
}

/// Copy `name` into a C buffer of `len` bytes, NUL-terminated and cut to fit.
///
/// # Safety
/// `buf` is writable for `len` bytes.
pub unsafe fn write_c_string(buf: *mut std::ffi::c_char, len: usize, name: &str) {
    if buf.is_null() || len == 0 {
        return;
    }
    let n = name.len().min(len - 1);
    // SAFETY: `n + 1 <= len` bytes of `buf` are written (the caller's
    // contract); `name` has at least `n` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(name.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_tagged_and_checked() {
        let h: Handles<u32> = Handles::new(0x5eed);
        let a = h.insert(7);
        assert_eq!(a >> 48, 0x5eed);
        assert_eq!(h.get(a), Some(7));
        assert_eq!(h.get(a + 1), None);
        assert!(h.remove(a) && !h.remove(a));
    }

    #[test]
    fn panics_become_internal_errors() {
        let r = call("test", "boom", || panic!("boom"));
        assert_eq!(r, Err(EmuError::Internal("panic: boom".into())));
    }
}
