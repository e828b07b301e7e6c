//! The OpenCL backend plugin of toast-rs: TOAST's ten kernels from the
//! single device-kernel source (`toast_accel::device_source`, compiled at run
//! time by the OpenCL C compiler), behind the C plugin ABI of
//! `toast-accel/include/toast_backend.h`. Its layout mirrors the CPU plugin
//! (`backend-cpu`), file for file: `lib.rs` (header, table, entries),
//! `context.rs` (runtime, device, program), `memory.rs` (buffers) and
//! `kernels/*.rs` (one file per kernel family).
//!
//! # Building and loading
//!
//! The `opencl3` crate is used with its default `dynamic` feature: libOpenCL
//! (the ICD loader, `libOpenCL.so.1`, or the paths in `OPENCL_DYLIB_PATH`)
//! is opened at run time, so building needs no OpenCL SDK or library. When
//! it is absent, `init` fails with `ERR_UNAVAILABLE` "no OpenCL runtime
//! (libOpenCL.so.1)"; with no platform or no device, or a device without
//! `cl_khr_fp64` and `cl_khr_int64_base_atomics`, it is unavailable with
//! that reason. `toast-cli backends` shows it.
//!
//! # Device selection
//!
//! The plugin option `device=SEL` (which wins) or the environment variable
//! `TOAST_OPENCL_DEVICE=SEL`: `SEL` is `P:D` (platform and device indices,
//! as `clinfo -l` lists them) or a case-insensitive substring of the device
//! name. Without a selector the first device with double precision and
//! 64-bit atomics is used. The OpenCL context, queue and program are made
//! once per device and process (shared by every backend context on that
//! device), with every kernel object created then. The compiled program is
//! also cached on disk, keyed by the source hash, device name, platform and
//! driver version, in `$TOAST_CACHE_DIR/opencl` (else
//! `$XDG_CACHE_HOME/toast-rs/opencl`, else `~/.cache/toast-rs/opencl`;
//! `TOAST_OPENCL_CACHE=0` disables it); an unreadable or stale binary is
//! ignored and rebuilt from source. A compile failure is `ERR_COMPILE` with
//! the compiler's build log, the kernel names and the source hash.
//!
//! # Memory
//!
//! The backend is not host-addressable: kernel arrays are buffer handles
//! from `alloc`, which are ids in a handle table (`memory.rs`), so a handle
//! from another backend or one already freed is refused with
//! `ERR_INVALID_HANDLE`, never dereferenced. Buffers are zeroed at `alloc`;
//! an allocation failure is `ERR_OUT_OF_MEMORY` naming the buffer and size.
//! The small per-detector arrays and the intervals, which the ABI passes as
//! host memory, are uploaded per call as temporary device arrays (a few
//! bytes per detector). Transfers are counted on the host side
//! (`toast_accel::host::TransferStats`, printed by `toast-cli verify`).
//!
//! # Validation and faults
//!
//! Each kernel first runs its `toast_accel::check::check_*` function, as
//! every Rust backend does, and checks `global2local` on a host copy.
//! Data-dependent faults (a pixel beyond the map or in a non-local submap, a
//! quaternion with no valid pixel) are recorded on the device as the
//! smallest (detector, sample) key and reported as `ERR_INVALID_ARGUMENT`
//! naming the detector, interval and sample; nothing is written out of
//! bounds. An output array that is the same buffer as another argument is
//! refused (the device kernels declare their arrays `restrict`), except the
//! in-place `template_offset_apply_diag_precond`.
//!
//! # Launches and accuracy
//!
//! See `toast_accel::device_source` for the grid (detector x interval x
//! sample, early return past each interval's end). A call whose detectors
//! share an output row, or whose intervals overlap, is split into one
//! launch per (detector, interval), in TOAST's order. Calls are synchronous.
//! FP contraction is off, so results differ from the CPU backend only by
//! the device's `atan2`/`sin`/`cos` (a few ulps; pixel indices can then
//! differ at directions on a pixel boundary) and by the order of the atomic
//! sums of `build_noise_weighted`; the conformance runner compares this
//! backend in its tolerant mode (`toast_accel::host::conformance`).

use std::ffi::{c_char, c_void};
use toast_accel::abi::{self, BackendHeader, BackendTable, HostApi, Status};
use toast_accel::check;
use toast_accel::plugin_support::{self, guard, PluginError};

mod context;
mod kernels;
mod memory;

use context::OpenClContext;

static NAME: &[u8] = b"opencl\0";
static VERSION: &[u8] = concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes();
static DESCRIPTION: &[u8] =
    b"OpenCL backend: the ten TOAST kernels from the shared device source (run-time libOpenCL)\0";

static TABLE: BackendTable = BackendTable {
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
    synchronize: Some(synchronize),
    pointing_detector: Some(pointing_detector),
    pixels_healpix: Some(pixels_healpix),
    stokes_weights_i: Some(stokes_weights_i),
    stokes_weights_iqu: Some(stokes_weights_iqu),
    scan_map: Some(scan_map),
    build_noise_weighted: Some(build_noise_weighted),
    noise_weight: Some(noise_weight),
    template_offset_add_to_signal: Some(template_offset_add_to_signal),
    template_offset_project_signal: Some(template_offset_project_signal),
    template_offset_apply_diag_precond: Some(template_offset_apply_diag_precond),
};

static HEADER: BackendHeader = BackendHeader {
    magic: abi::MAGIC,
    abi_major: abi::ABI_MAJOR,
    abi_minor: abi::ABI_MINOR,
    table_size: std::mem::size_of::<BackendTable>() as u32,
    flags: 0,
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
unsafe fn ctx_ref<'a>(ctx: *mut c_void) -> Result<&'a OpenClContext, PluginError> {
    if ctx.is_null() {
        return Err(PluginError::invalid("null backend context"));
    }
    // SAFETY: by the caller's contract, a live `OpenClContext` made by `init`.
    Ok(unsafe { &*(ctx as *const OpenClContext) })
}

/// The argument struct behind a kernel's `args` pointer.
///
/// # Safety
/// `p` is null or points to a valid `A`.
unsafe fn args_ref<'a, A>(kernel: &str, p: *const A) -> Result<&'a A, PluginError> {
    if p.is_null() {
        return Err(PluginError::invalid(format!(
            "{kernel}: null argument struct"
        )));
    }
    // SAFETY: non-null and valid by the caller's contract.
    Ok(unsafe { &*p })
}

unsafe extern "C" fn init(host: *const HostApi, ctx: *mut *mut c_void) -> Status {
    guard(|| {
        if ctx.is_null() {
            return Err(PluginError::invalid("init: null ctx out pointer"));
        }
        // SAFETY: the host passes a valid (or null) HostApi.
        let c = unsafe { OpenClContext::new(host)? };
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
            drop(unsafe { Box::from_raw(ctx as *mut OpenClContext) });
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
                "device_info: device index {index} does not exist (the opencl backend uses 1 device)"
            )));
        }
        if info.is_null() {
            return Err(PluginError::invalid("device_info: null out pointer"));
        }
        let name = &c.dev.name;
        let mut out = abi::DeviceInfo {
            name: [0; 128],
            total_memory: c.dev.global_mem,
            free_memory: 0,
            compute_units: c.dev.compute_units,
            reserved: 0,
        };
        for (d, &b) in out.name.iter_mut().zip(name.as_bytes().iter().take(127)) {
            *d = b as c_char;
        }
        // SAFETY: non-null out pointer from the host.
        unsafe { *info = out };
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
        let h = c.registry.alloc(&c.dev, bytes, &name)?;
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
        let c = unsafe { ctx_ref(ctx)? };
        // SAFETY: `src` is valid for `bytes` bytes (ABI contract).
        unsafe {
            c.registry
                .copy_to_device(&c.dev, handle, offset, src as *const u8, bytes)
        }
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
        let c = unsafe { ctx_ref(ctx)? };
        // SAFETY: `dst` is valid for `bytes` bytes (ABI contract).
        unsafe {
            c.registry
                .copy_to_host(&c.dev, handle, offset, dst as *mut u8, bytes)
        }
    })
}

unsafe extern "C" fn reset(ctx: *mut c_void, handle: u64, offset: u64, bytes: u64) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref(ctx)? };
        c.registry.reset(&c.dev, handle, offset, bytes)
    })
}

unsafe extern "C" fn synchronize(ctx: *mut c_void) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref(ctx)? };
        c.dev.queue.finish().map_err(|e| {
            PluginError::new(
                abi::ERR_DEVICE,
                format!("synchronize: {}", context::cl_error(e)),
            )
        })
    })
}

/// Define an exported kernel entry: resolve ctx and args, run the check,
/// then the kernel.
macro_rules! kernel_entry {
    ($fn:ident, $args:ty, $name:literal, |$v:ident, $a:ident| $check:expr, $run:expr) => {
        unsafe extern "C" fn $fn(ctx: *mut c_void, args: *const $args) -> Status {
            guard(|| {
                // SAFETY: ABI contract on ctx.
                let c = unsafe { ctx_ref(ctx)? };
                // SAFETY: ABI contract on args.
                let $a: &$args = unsafe { args_ref($name, args)? };
                // SAFETY: the host pointers of the struct are valid for the
                // lengths it declares (ABI contract).
                let $v = unsafe { $check }?;
                $run(c)
            })
        }
    };
}

kernel_entry!(
    pointing_detector,
    abi::PointingDetectorArgs,
    "pointing_detector",
    |v, a| check::check_pointing_detector(a),
    |c| kernels::pointing::run(c, &v, a)
);
kernel_entry!(
    pixels_healpix,
    abi::PixelsHealpixArgs,
    "pixels_healpix",
    |v, a| check::check_pixels_healpix(a),
    |c| kernels::healpix::run(c, &v, a)
);
kernel_entry!(
    stokes_weights_i,
    abi::StokesWeightsIArgs,
    "stokes_weights_I",
    |v, a| check::check_stokes_weights_i(a),
    |c| kernels::stokes::run_i(c, &v, a)
);
kernel_entry!(
    stokes_weights_iqu,
    abi::StokesWeightsIquArgs,
    "stokes_weights_IQU",
    |v, a| check::check_stokes_weights_iqu(a),
    |c| kernels::stokes::run_iqu(c, &v, a)
);
kernel_entry!(
    scan_map,
    abi::ScanMapArgs,
    "scan_map",
    |v, a| check::check_scan_map(a),
    |c| kernels::scan_map::run(c, &v, a)
);
kernel_entry!(
    build_noise_weighted,
    abi::BuildNoiseWeightedArgs,
    "build_noise_weighted",
    |v, a| check::check_build_noise_weighted(a),
    |c| kernels::mapmaker::run(c, &v, a)
);
kernel_entry!(
    noise_weight,
    abi::NoiseWeightArgs,
    "noise_weight",
    |v, a| check::check_noise_weight(a),
    |c| kernels::weight::run(c, &v, a)
);
kernel_entry!(
    template_offset_add_to_signal,
    abi::TemplateOffsetAddArgs,
    "template_offset_add_to_signal",
    |v, a| check::check_template_offset_add(a),
    |c| kernels::template_offset::run_add(c, &v, a)
);
kernel_entry!(
    template_offset_project_signal,
    abi::TemplateOffsetProjectArgs,
    "template_offset_project_signal",
    |v, a| check::check_template_offset_project(a),
    |c| kernels::template_offset::run_project(c, &v, a)
);
kernel_entry!(
    template_offset_apply_diag_precond,
    abi::TemplateOffsetPrecondArgs,
    "template_offset_apply_diag_precond",
    |_v, a| check::check_template_offset_precond(a),
    |c| kernels::template_offset::run_precond(c, a)
);
