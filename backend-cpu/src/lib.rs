//! The CPU backend plugin of toast-rs: every kernel of the kernel table in
//! Rust (TOAST's compiled kernels, the PCG solver's vector kernels and the
//! map-maker's fused kernels, `kernels/compact.rs` and `kernels/fused.rs`),
//! parallelised with rayon, behind the C plugin ABI of
//! `toast-accel/include/toast_backend.h`.
//!
//! # Shape of the plugin
//!
//! The library exports one symbol, [`toast_backend_entry`], which returns a
//! static [`BackendHeader`] (magic, ABI version, table size, the
//! `FLAG_HOST_ADDRESSABLE` capability, name `cpu`) pointing at a static
//! [`BackendTable`] with every entry filled; its kernel slots come from the
//! kernel table (`toast_accel::backend_table!`): each is the one generic
//! `kernel_entry::<A>` (resolve, validate with `toast_accel::check`, run on
//! the pool), and each kernel's math is an impl of `kernels::CpuKernel`.
//! Every exported function runs its
//! body inside [`toast_accel::plugin_support::guard`], which catches panics and turns
//! a failure into a status code plus a thread-local message (`last_error`);
//! nothing unwinds across the C boundary.
//!
//! `init` parses the options string (`threads=N`; the environment variable
//! `TOAST_CPU_THREADS` is read first and the option wins over it). With a
//! thread count the context owns a dedicated rayon pool and every kernel runs
//! inside it; without one (or with 0) the rayon global pool is used. The
//! host's log callback is kept and receives one debug line at `init`.
//!
//! # Memory
//!
//! The backend is host-addressable: kernel arrays are host addresses, and the
//! "device" buffers of `alloc` are host allocations (zeroed, 64-byte aligned)
//! whose address is the handle. A registry of live handles lets `free`,
//! `copy_*` and `reset` refuse unknown, foreign or already-freed handles
//! (`ERR_INVALID_HANDLE`) and ranges outside a buffer (`ERR_INVALID_ARGUMENT`).
//! An allocation failure is `ERR_OUT_OF_MEMORY` naming the buffer and size;
//! the process never aborts on it.
//!
//! # Validation
//!
//! Each kernel first calls its `toast_accel::check::check_*` function, shared
//! with every Rust backend, which checks every length, shape, index array,
//! interval, `nside`, offset-template layout, etc. against the argument
//! struct alone, before any memory is touched. The kernel then checks what
//! only the data can tell, with cheap compares inside its loops: a pixel
//! beyond the map or in a submap that is not local, a quaternion that gives
//! no pixel. Such a fault names the detector (its position in the index
//! arrays), the interval and the sample; when several parallel tasks meet
//! faults, the one a sequential run meets first is reported, so the message
//! is deterministic. Outputs may be partly updated when a call fails. The
//! kernels also refuse misaligned or null arrays and an output array that
//! overlaps another argument (which would make Rust slices alias).
//!
//! # Parallel decomposition and determinism
//!
//! TOAST forks one OpenMP region per (detector, interval). Here:
//!
//! * kernels that write per-sample outputs (`pointing_detector`,
//!   `pixels_healpix`, `stokes_weights_*`, `scan_map`, `noise_weight`,
//!   `template_offset_add_to_signal`) split the sample axis into chunks (about
//!   eight per thread); a task walks all detectors, and for each the pieces of
//!   all intervals inside its chunk, in order. Every output element is owned
//!   by one task and updated in TOAST's detector → interval → sample order,
//!   so results are identical for any thread count, even with two detectors
//!   sharing an output row or overlapping intervals (which TOAST processes
//!   twice, as we do);
//! * `build_noise_weighted` splits the map's sub-pixel axis into one range per
//!   thread, as TOAST does; each task scans everything and accumulates only
//!   its sub-pixels, so each `zmap` element sums in detector → interval →
//!   sample order;
//! * `template_offset_project_signal` gives each task a range of amplitudes
//!   of one (detector, view) and sums each amplitude's samples in sample
//!   order, starting from its current value (TOAST's `omp atomic` order with
//!   one thread). Detectors whose amplitude blocks overlap run one after the
//!   other;
//! * `cov_accum_diag_invnpp` gives every pixel one owning task (blocks of
//!   1024 flat pixels dealt round robin); each task scans every sample and
//!   accumulates those of its pixels, in sample order. With one thread it is
//!   one pass; each pass asks for the cache line of the pixel 16 samples
//!   ahead (the scatter into a map of hundreds of MB is bound by cache and
//!   TLB misses). `cov_accum_diag_hits` does the same with one thread; with
//!   more it splits the samples between the tasks and increments atomically
//!   (integer counts: the same result in any order, and on a fault the one
//!   pass's, the tasks after the first bad sample taking theirs back);
//! * `filter_polynomial` runs disjoint scans in parallel (overlapping ones in
//!   order), and fits a scan's Legendre normal matrix and its first signal's
//!   right-hand side in one pass;
//! * `template_offset_apply_diag_precond` is element-wise over chunks; a short
//!   call (`CpuKernel::inline`, below 2^17 amplitudes) runs on the
//!   calling thread, which offers half of it to one pool thread
//!   (`par::split_in_two`): an awake pool thread takes it at once, a sleeping
//!   one costs only the offer (the caller then does both halves), so a short
//!   call never waits for a wake-up, which costs more than the call.
//!
//! The pool's hand-over (the caller sleeps until a pool thread has run the
//! kernel) costs tens of microseconds, which a call of milliseconds does not
//! notice.
//!
//! Streams that the hardware prefetchers leave to stall are asked for ahead
//! in software (a prefetch changes no result): `pixels_healpix`' quaternions
//! (it works in blocks of 4 samples: rotations, then `atan2` calls, then
//! pixels), `noise_weight`'s detector data, the covariance kernels' pixels,
//! `scan_map`'s map values (16 samples ahead: its gather was latency-bound).
//! `noise_weight` also scales with AVX-512F or AVX2 when the CPU has them
//! (detected at run time; the build targets baseline x86-64).
//!
//! # Bit-exactness
//!
//! Every floating-point expression follows the operation order of TOAST
//! 3.0.6's C++ (`_libtoast/*.cpp`), without FMA contraction (Rust never
//! contracts), with `f64::atan2`, `sin`, `cos` calling the platform libm
//! (glibc, as TOAST) and `sqrt` the correctly rounded instruction. Quaternion
//! rotations keep their multiplications by 0 and 1 so signed zeros and NaNs
//! propagate as in C. Integer conversions of doubles reproduce x86-64's
//! `cvttsd2si` (NaN or out of range gives `i64::MIN`) and the integer
//! arithmetic after it wraps, as the compiled C does, so the HEALPix pixel of
//! a degenerate direction is TOAST's. Instructions chosen at run time
//! (`noise_weight`'s vectors) compute the same IEEE operation per element.
//! On glibc every reference case of TOAST 3.0.6 is reproduced bit for bit.

use std::ffi::{c_char, c_void};
use toast_accel::abi::{self, BackendHeader, BackendTable, HostApi, Status};
use toast_accel::plugin_support::{self, guard, kernel_args, PluginError};

mod arrays;
mod context;
mod kernels;
/// The CPU noise stream of `sim_noise` (toast-ops' tests compare it with
/// TOAST's streams).
pub use kernels::noise;
mod memory;
mod par;

use context::CpuContext;
use kernels::CpuKernel;

static NAME: &[u8] = b"cpu\0";
static VERSION: &[u8] = concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes();
static DESCRIPTION: &[u8] = b"CPU backend: every kernel of the table in Rust with rayon\0";

static TABLE: BackendTable = toast_accel::backend_table! {
    init: Some(init),
    shutdown: Some(shutdown),
    last_error: Some(last_error),
    device_count: Some(device_count),
    device_info: Some(device_info),
    alloc: Some(alloc),
    free: Some(free),
    copy_to_device: Some(copy_to_device),
    copy_to_host: Some(copy_to_host),
    reset: Some(reset),
    synchronize: Some(synchronize);
    kernels = kernel_entry
};

static HEADER: BackendHeader = BackendHeader {
    magic: abi::MAGIC,
    abi_major: abi::ABI_MAJOR,
    abi_minor: abi::ABI_MINOR,
    table_size: std::mem::size_of::<BackendTable>() as u32,
    flags: abi::FLAG_HOST_ADDRESSABLE,
    name: NAME.as_ptr() as *const c_char,
    version: VERSION.as_ptr() as *const c_char,
    description: DESCRIPTION.as_ptr() as *const c_char,
    table: &TABLE,
};

/// The plugin's entry symbol: a pointer to its static header.
#[no_mangle]
pub extern "C" fn toast_backend_entry() -> *const BackendHeader {
    &HEADER
}

/// The context behind a `ctx` pointer.
///
/// # Safety
/// `ctx` is null or a pointer `init` returned and `shutdown` has not freed.
unsafe fn ctx_ref<'a>(ctx: *mut c_void) -> Result<&'a CpuContext, PluginError> {
    if ctx.is_null() {
        return Err(PluginError::invalid("null backend context"));
    }
    // SAFETY: by the caller's contract, a live `CpuContext` made by `init`.
    Ok(unsafe { &*(ctx as *const CpuContext) })
}

unsafe extern "C" fn init(host: *const HostApi, ctx: *mut *mut c_void) -> Status {
    guard(|| {
        if ctx.is_null() {
            return Err(PluginError::invalid("init: null ctx out pointer"));
        }
        // SAFETY: the host passes a valid (or null) HostApi.
        let c = unsafe { CpuContext::new(host)? };
        // SAFETY: non-null out pointer.
        unsafe { *ctx = Box::into_raw(Box::new(c)) as *mut c_void };
        Ok(())
    })
}

unsafe extern "C" fn shutdown(ctx: *mut c_void) {
    let _ = guard(|| {
        if !ctx.is_null() {
            // SAFETY: `ctx` came from `Box::into_raw` in `init` and the host
            // calls shutdown once; dropping it frees its buffers and pool.
            drop(unsafe { Box::from_raw(ctx as *mut CpuContext) });
        }
        Ok(())
    });
}

unsafe extern "C" fn last_error() -> *const c_char {
    plugin_support::last_error_ptr()
}

unsafe extern "C" fn device_count(_ctx: *mut c_void, count: *mut u32) -> Status {
    guard(|| {
        if count.is_null() {
            return Err(PluginError::invalid("device_count: null out pointer"));
        }
        // SAFETY: non-null out pointer from the host.
        unsafe { *count = 1 };
        Ok(())
    })
}

unsafe extern "C" fn device_info(
    ctx: *mut c_void,
    index: u32,
    info: *mut abi::DeviceInfo,
) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref(ctx)? };
        if index != 0 {
            return Err(PluginError::invalid(format!(
                "device_info: device index {index} does not exist (the cpu backend has 1 device)"
            )));
        }
        if info.is_null() {
            return Err(PluginError::invalid("device_info: null out pointer"));
        }
        let name = context::cpu_name();
        let mut out = abi::DeviceInfo {
            name: [0; 128],
            total_memory: 0,
            free_memory: 0,
            compute_units: c.threads() as u32,
            peak_held_mib: 0,
            // The kernels run on the host's arrays.
            memory_kind: abi::DEVICE_MEMORY_HOST,
            reserved: 0,
            // The host itself: no device shared by processes to tell apart.
            uuid: [0; 16],
        };
        for (d, &b) in out.name.iter_mut().zip(name.as_bytes().iter().take(127)) {
            *d = b as c_char;
        }
        (out.total_memory, out.free_memory) = context::meminfo();
        // SAFETY: non-null out pointer from the host, to the struct of the
        // host's minor (the ABI contract), of which this writes no more.
        unsafe { out.write_for_host(info, c.host_abi_minor) };
        Ok(())
    })
}

unsafe extern "C" fn alloc(
    ctx: *mut c_void,
    bytes: u64,
    name: *const c_char,
    handle: *mut u64,
) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref(ctx)? };
        if handle.is_null() {
            return Err(PluginError::invalid("alloc: null handle out pointer"));
        }
        let name = if name.is_null() {
            "(unnamed)".to_string()
        } else {
            // SAFETY: NUL-terminated by the ABI.
            unsafe { std::ffi::CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        };
        let h = c.registry.alloc(bytes, &name)?;
        // SAFETY: non-null out pointer from the host.
        unsafe { *handle = h };
        Ok(())
    })
}

unsafe extern "C" fn free(ctx: *mut c_void, handle: u64) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        unsafe { ctx_ref(ctx)? }.registry.free(handle)
    })
}

unsafe extern "C" fn copy_to_device(
    ctx: *mut c_void,
    handle: u64,
    offset: u64,
    src: *const c_void,
    bytes: u64,
) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        unsafe { ctx_ref(ctx)? }
            .registry
            .copy_to_device(handle, offset, src as *const u8, bytes)
    })
}

unsafe extern "C" fn copy_to_host(
    ctx: *mut c_void,
    handle: u64,
    offset: u64,
    dst: *mut c_void,
    bytes: u64,
) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        unsafe { ctx_ref(ctx)? }
            .registry
            .copy_to_host(handle, offset, dst as *mut u8, bytes)
    })
}

unsafe extern "C" fn reset(ctx: *mut c_void, handle: u64, offset: u64, bytes: u64) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        unsafe { ctx_ref(ctx)? }
            .registry
            .reset(handle, offset, bytes)
    })
}

unsafe extern "C" fn synchronize(ctx: *mut c_void) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx. Kernels are synchronous: nothing to wait for.
        unsafe { ctx_ref(ctx)? };
        Ok(())
    })
}

/// Moves a kernel's argument struct (which holds raw host pointers) onto the
/// pool's thread.
struct AssertSend<T>(T);

// SAFETY: the argument struct's pointers are valid for the whole call (ABI
// contract) and the calling thread blocks in `install` until the kernel
// returns, so using them from a pool thread is as safe as from the caller.
unsafe impl<T> Send for AssertSend<T> {}

impl<T> AssertSend<T> {
    fn into_inner(self) -> T {
        self.0
    }
}

/// The entry of every kernel (the table instantiates it per argument
/// struct): resolve the context and the arguments, validate them, then run
/// the kernel's math ([`CpuKernel::run`]) on the context's pool, or on
/// this thread when the call is small ([`CpuKernel::inline`]).
unsafe extern "C" fn kernel_entry<A: CpuKernel>(ctx: *mut c_void, args: *const A) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref(ctx)? };
        // SAFETY: ABI contract on args: a valid struct whose host pointers
        // are valid for the lengths it declares, for the call.
        let (a, v) = unsafe { kernel_args(args)? };
        if A::inline(a) {
            // SAFETY: validated above; arrays are host memory (we are
            // host-addressable) of the validated lengths. The kernel runs
            // on this thread, at most with one pool thread taking half of
            // it (CpuKernel::inline's contract).
            return c.inline(|| unsafe { A::run(&v, a) });
        }
        let job = AssertSend((v, a));
        c.install(move || {
            let (v, a) = job.into_inner();
            // SAFETY: validated above; arrays are host memory (we are
            // host-addressable) of the validated lengths.
            unsafe { A::run(&v, a) }
        })
    })
}
