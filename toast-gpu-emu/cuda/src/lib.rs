//! An emulated CUDA driver (`libcuda.so.1`) for toast-rs: exactly the driver
//! API entry points `backend-cuda` calls (through cudarc 0.19, which
//! resolves each symbol on first use), with cuda.h's prototypes, `_v2` names
//! and error codes, executed on the host by `toast-gpu-emu` (see that
//! crate's documentation for the design and for where the emulation is not
//! faithful); plus `cuGetExportTable`, which NVRTC 12 resolves when it opens
//! `libcuda.so.1` during a compilation (it crashes if the symbol is
//! missing; the emulator returns `CUDA_ERROR_NOT_SUPPORTED`, which NVRTC
//! accepts).
//!
//! One device (`TOAST_EMU_DEVICES=N`: N, named `… #k`, each with its own UUID), "toast-rs emulated CUDA device (host CPU)", compute
//! capability 8.0 (so the plugin compiles for `sm_80` with the real NVRTC),
//! 16 GiB, one primary context. As in the real driver, every call but the
//! error strings needs `cuInit` first, and memory, stream, module and launch
//! calls need a current context on the calling thread
//! (`CUDA_ERROR_INVALID_CONTEXT` otherwise). A device attribute the
//! emulator does not model, a dynamic shared-memory size or `extra` launch
//! parameters are `CUDA_ERROR_NOT_SUPPORTED`. Set `TOAST_EMU_TRACE=1` to
//! have every failing call print its reason to stderr.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use toast_gpu_emu::api::{device, device_count, device_name, device_uuid, put, Runtime};
use toast_gpu_emu::{call, heap, image, EmuError, LIMITS};

/// `CUresult`.
pub type CuResult = c_int;
/// `CUdevice`.
pub type CuDevice = c_int;
/// `CUdeviceptr`.
pub type CuDevicePtr = u64;

const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
const CUDA_ERROR_NOT_INITIALIZED: CuResult = 3;
const CUDA_ERROR_NO_DEVICE: CuResult = 100;
const CUDA_ERROR_INVALID_DEVICE: CuResult = 101;
const CUDA_ERROR_INVALID_IMAGE: CuResult = 200;
const CUDA_ERROR_INVALID_CONTEXT: CuResult = 201;
const CUDA_ERROR_INVALID_HANDLE: CuResult = 400;
const CUDA_ERROR_NOT_FOUND: CuResult = 500;
const CUDA_ERROR_ILLEGAL_ADDRESS: CuResult = 700;
const CUDA_ERROR_LAUNCH_FAILED: CuResult = 719;
const CUDA_ERROR_NOT_SUPPORTED: CuResult = 801;
const CUDA_ERROR_UNKNOWN: CuResult = 999;

/// Names and descriptions of the codes this library returns (and of
/// `CUDA_ERROR_NO_DEVICE`, for completeness), as the real driver words them.
const ERRORS: &[(CuResult, &CStr, &CStr)] = &[
    (CUDA_SUCCESS, c"CUDA_SUCCESS", c"no error"),
    (
        CUDA_ERROR_INVALID_VALUE,
        c"CUDA_ERROR_INVALID_VALUE",
        c"invalid argument",
    ),
    (
        CUDA_ERROR_OUT_OF_MEMORY,
        c"CUDA_ERROR_OUT_OF_MEMORY",
        c"out of memory",
    ),
    (
        CUDA_ERROR_NOT_INITIALIZED,
        c"CUDA_ERROR_NOT_INITIALIZED",
        c"initialization error",
    ),
    (
        CUDA_ERROR_NO_DEVICE,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (
        CUDA_ERROR_INVALID_DEVICE,
        c"CUDA_ERROR_INVALID_DEVICE",
        c"invalid device ordinal",
    ),
    (
        CUDA_ERROR_INVALID_IMAGE,
        c"CUDA_ERROR_INVALID_IMAGE",
        c"device kernel image is invalid",
    ),
    (
        CUDA_ERROR_INVALID_CONTEXT,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        CUDA_ERROR_INVALID_HANDLE,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (
        CUDA_ERROR_NOT_FOUND,
        c"CUDA_ERROR_NOT_FOUND",
        c"named symbol not found",
    ),
    (
        CUDA_ERROR_ILLEGAL_ADDRESS,
        c"CUDA_ERROR_ILLEGAL_ADDRESS",
        c"an illegal memory access was encountered",
    ),
    (
        CUDA_ERROR_NOT_SUPPORTED,
        c"CUDA_ERROR_NOT_SUPPORTED",
        c"operation not supported",
    ),
    (
        CUDA_ERROR_LAUNCH_FAILED,
        c"CUDA_ERROR_LAUNCH_FAILED",
        c"unspecified launch failure",
    ),
    (CUDA_ERROR_UNKNOWN, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

/// The emulated device's name, as `cuDeviceGetName` gives it.
pub const DEVICE_NAME: &str = "toast-rs emulated CUDA device (host CPU)";
/// Compute capability (major, minor).
pub const COMPUTE_CAPABILITY: (c_int, c_int) = (8, 0);

fn code(e: &EmuError) -> CuResult {
    match e {
        EmuError::InvalidValue(_) | EmuError::InvalidPointer(_) => CUDA_ERROR_INVALID_VALUE,
        EmuError::OutOfMemory(_) => CUDA_ERROR_OUT_OF_MEMORY,
        EmuError::IllegalAddress(_) => CUDA_ERROR_ILLEGAL_ADDRESS,
        EmuError::InvalidHandle(_) => CUDA_ERROR_INVALID_HANDLE,
        EmuError::InvalidImage(_) => CUDA_ERROR_INVALID_IMAGE,
        EmuError::NotFound(_) => CUDA_ERROR_NOT_FOUND,
        EmuError::InvalidDevice(_) => CUDA_ERROR_INVALID_DEVICE,
        EmuError::NotInitialized(_) => CUDA_ERROR_NOT_INITIALIZED,
        EmuError::InvalidContext(_) => CUDA_ERROR_INVALID_CONTEXT,
        EmuError::NotSupported(_) => CUDA_ERROR_NOT_SUPPORTED,
        EmuError::Internal(_) => CUDA_ERROR_UNKNOWN,
        EmuError::Injected(_) | EmuError::LaunchFailed(_) => CUDA_ERROR_LAUNCH_FAILED,
    }
}

/// Run an entry point: `CUDA_SUCCESS` or its error's code.
fn api(name: &str, f: impl FnOnce() -> Result<(), EmuError>) -> CuResult {
    match call("cuda", name, f) {
        Ok(()) => CUDA_SUCCESS,
        Err(e) => code(&e),
    }
}

static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// The primary context: its address is the `CUcontext` handed out.
static PRIMARY: u8 = 0;

thread_local! {
    /// Whether the primary context is current on this thread.
    static CURRENT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

static RUNTIME: Runtime = Runtime::new();

fn initialized() -> Result<(), EmuError> {
    if INITIALIZED.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(EmuError::NotInitialized(
            "cuInit has not been called".into(),
        ))
    }
}

fn context() -> Result<(), EmuError> {
    initialized()?;
    if CURRENT.with(|c| c.get()) {
        Ok(())
    } else {
        Err(EmuError::InvalidContext(
            "no context is current on this thread".into(),
        ))
    }
}

/// `cuInit`.
///
/// # Safety
/// None beyond the C API's.
#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CuResult {
    api("cuInit", || {
        if flags != 0 {
            return Err(EmuError::InvalidValue(format!("flags {flags} (must be 0)")));
        }
        INITIALIZED.store(true, Ordering::Release);
        Ok(())
    })
}

/// `cuGetExportTable`, the driver's private interface: none is provided
/// (`CUDA_ERROR_NOT_SUPPORTED`, and a null table). NVRTC 12 opens
/// `libcuda.so.1` when it compiles and resolves this symbol; with the
/// symbol absent, it crashes.
///
/// # Safety
/// `table` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    _id: *const c_void,
) -> CuResult {
    api("cuGetExportTable", || {
        if !table.is_null() {
            // SAFETY: non-null and writable (the caller's contract).
            unsafe { table.write(std::ptr::null()) };
        }
        Err(EmuError::NotSupported(
            "the driver's private export tables are not emulated".into(),
        ))
    })
}

/// `cuDeviceGetCount`: one device, or `TOAST_EMU_DEVICES`.
///
/// # Safety
/// `count` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    api("cuDeviceGetCount", || {
        initialized()?;
        // SAFETY: the caller's contract.
        unsafe { put(count, device_count()) }
    })
}

/// `cuDeviceGet`.
///
/// # Safety
/// `dev` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut CuDevice, ordinal: c_int) -> CuResult {
    api("cuDeviceGet", || {
        initialized()?;
        device(ordinal)?;
        // SAFETY: the caller's contract.
        unsafe { put(dev, ordinal) }
    })
}

/// `cuDeviceGetName`.
///
/// # Safety
/// `name` is writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CuDevice) -> CuResult {
    api("cuDeviceGetName", || {
        initialized()?;
        device(dev)?;
        if name.is_null() || len <= 0 {
            return Err(EmuError::InvalidValue("no name buffer".into()));
        }
        // SAFETY: `len` writable bytes (the caller's contract).
        unsafe {
            toast_gpu_emu::write_c_string(name, len as usize, &device_name(DEVICE_NAME, dev))
        };
        Ok(())
    })
}

/// `cuDeviceGetUuid_v2`: [`toast_gpu_emu::api::device_uuid`].
///
/// # Safety
/// `uuid` is valid for a write of 16 bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CuDevice) -> CuResult {
    api("cuDeviceGetUuid_v2", || {
        initialized()?;
        device(dev)?;
        // SAFETY: the caller's contract.
        unsafe { put(uuid, device_uuid("cuda", dev)) }
    })
}

/// `cuDeviceGetAttribute`: the launch limits, warp size, SM count (the
/// host's CPUs), integrated (`TOAST_EMU_INTEGRATED`) and compute
/// capability; other attributes are `CUDA_ERROR_NOT_SUPPORTED`.
///
/// # Safety
/// `value` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attrib: c_int,
    dev: CuDevice,
) -> CuResult {
    api("cuDeviceGetAttribute", || {
        initialized()?;
        device(dev)?;
        let v = match attrib {
            1 => LIMITS.max_threads_per_block as c_int,
            2..=4 => LIMITS.max_block[(attrib - 2) as usize] as c_int,
            5..=7 => LIMITS.max_grid[(attrib - 5) as usize] as c_int,
            10 => 32,
            16 => toast_gpu_emu::compute_units(),
            18 => toast_gpu_emu::api::integrated(),
            75 => COMPUTE_CAPABILITY.0,
            76 => COMPUTE_CAPABILITY.1,
            _ => {
                return Err(EmuError::NotSupported(format!(
                    "device attribute {attrib} is not emulated"
                )))
            }
        };
        // SAFETY: the caller's contract.
        unsafe { put(value, v) }
    })
}

/// `cuDeviceTotalMem_v2`.
///
/// # Safety
/// `bytes` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CuDevice) -> CuResult {
    api("cuDeviceTotalMem_v2", || {
        initialized()?;
        device(dev)?;
        // SAFETY: the caller's contract.
        unsafe { put(bytes, heap::total_memory() as usize) }
    })
}

/// `cuDevicePrimaryCtxRetain`: the one primary context.
///
/// # Safety
/// `ctx` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(
    ctx: *mut *mut c_void,
    dev: CuDevice,
) -> CuResult {
    api("cuDevicePrimaryCtxRetain", || {
        initialized()?;
        device(dev)?;
        // SAFETY: the caller's contract.
        unsafe { put(ctx, &PRIMARY as *const u8 as *mut c_void) }
    })
}

/// `cuCtxSetCurrent`: the primary context, or null to unbind.
///
/// # Safety
/// None beyond the C API's.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> CuResult {
    api("cuCtxSetCurrent", || {
        initialized()?;
        let primary = std::ptr::eq(ctx as *const u8, &PRIMARY);
        if !ctx.is_null() && !primary {
            return Err(EmuError::InvalidContext(format!("context {ctx:p}")));
        }
        CURRENT.with(|c| c.set(primary));
        Ok(())
    })
}

/// `cuStreamCreate` (flags `CU_STREAM_DEFAULT` or `CU_STREAM_NON_BLOCKING`).
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(out: *mut *mut c_void, flags: c_uint) -> CuResult {
    api("cuStreamCreate", || {
        context()?;
        if flags > 1 {
            return Err(EmuError::InvalidValue(format!("stream flags {flags}")));
        }
        // SAFETY: the caller's contract.
        unsafe { put(out, RUNTIME.create_stream()) }
    })
}

/// `cuStreamSynchronize`: work is done when it is issued, so this checks
/// the stream only.
///
/// # Safety
/// None beyond the C API's.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(s: *mut c_void) -> CuResult {
    api("cuStreamSynchronize", || {
        context()?;
        RUNTIME.stream(s)
    })
}

/// `cuMemGetInfo_v2`.
///
/// # Safety
/// `free` and `total` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    api("cuMemGetInfo_v2", || {
        context()?;
        let (f, t) = heap::info();
        // SAFETY: the caller's contract.
        unsafe {
            put(free, f as usize)?;
            put(total, t as usize)
        }
    })
}

/// `cuMemAlloc_v2` (zero bytes is `CUDA_ERROR_INVALID_VALUE`, as in CUDA).
///
/// # Safety
/// `dptr` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CuDevicePtr, bytes: usize) -> CuResult {
    api("cuMemAlloc_v2", || {
        context()?;
        if dptr.is_null() || bytes == 0 {
            return Err(EmuError::InvalidValue(format!(
                "allocation of {bytes} bytes"
            )));
        }
        let p = heap::alloc(bytes as u64)?;
        // SAFETY: the caller's contract.
        unsafe { put(dptr, p) }
    })
}

/// `cuMemFree_v2`.
///
/// # Safety
/// None beyond the C API's.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CuDevicePtr) -> CuResult {
    api("cuMemFree_v2", || {
        context()?;
        heap::free(dptr)
    })
}

/// `cuMemcpyHtoDAsync_v2`, completed before returning.
///
/// # Safety
/// `src` is readable for `bytes` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CuDevicePtr,
    src: *const c_void,
    bytes: usize,
    s: *mut c_void,
) -> CuResult {
    api("cuMemcpyHtoDAsync_v2", || {
        context()?;
        RUNTIME.stream(s)?;
        // SAFETY: the caller's contract.
        unsafe { heap::copy_to_device(dst, src as *const u8, bytes as u64) }
    })
}

/// `cuMemcpyDtoHAsync_v2`, completed before returning.
///
/// # Safety
/// `dst` is writable for `bytes` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CuDevicePtr,
    bytes: usize,
    s: *mut c_void,
) -> CuResult {
    api("cuMemcpyDtoHAsync_v2", || {
        context()?;
        RUNTIME.stream(s)?;
        // SAFETY: the caller's contract.
        unsafe { heap::copy_to_host(dst as *mut u8, src, bytes as u64) }
    })
}

/// `cuMemsetD8Async`, completed before returning.
///
/// # Safety
/// None beyond the C API's.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(
    dst: CuDevicePtr,
    value: u8,
    n: usize,
    s: *mut c_void,
) -> CuResult {
    api("cuMemsetD8Async", || {
        context()?;
        RUNTIME.stream(s)?;
        heap::fill(dst, value, n as u64)
    })
}

/// `cuModuleLoadData`: a cubin or PTX, whose symbols are read (the code is
/// not run: `cuModuleGetFunction` resolves to the host build).
///
/// # Safety
/// `image` is a complete cubin or NUL-terminated PTX; `module` is valid for
/// a write.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(
    module: *mut *mut c_void,
    image: *const c_void,
) -> CuResult {
    api("cuModuleLoadData", || {
        context()?;
        // SAFETY: the caller's contract (both pointers).
        unsafe { put(module, RUNTIME.load_module(image, image::read_cuda)?) }
    })
}

/// `cuModuleGetFunction`: the host build of kernel `name`, which the module
/// must define.
///
/// # Safety
/// `name` is a NUL-terminated string; `f` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut *mut c_void,
    module: *mut c_void,
    name: *const c_char,
) -> CuResult {
    api("cuModuleGetFunction", || {
        context()?;
        // SAFETY: the caller's contract (both pointers).
        unsafe { put(f, RUNTIME.function(module, name)?) }
    })
}

/// `cuLaunchKernel`, run to completion before returning.
///
/// # Safety
/// `params` holds one pointer per kernel parameter, each to a value of the
/// parameter's type, and the kernel's accesses stay inside the buffers
/// passed (the driver API's contract).
#[no_mangle]
#[allow(clippy::too_many_arguments)] // cuda.h's prototype
pub unsafe extern "C" fn cuLaunchKernel(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared_mem: c_uint,
    s: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    api("cuLaunchKernel", || {
        context()?;
        // SAFETY: the caller's contract.
        unsafe { RUNTIME.launch(f, [gx, gy, gz], [bx, by, bz], shared_mem, s, params, extra) }
    })
}

/// Look up `e` in [`ERRORS`] and store its name or description.
///
/// # Safety
/// `out` is valid for a write.
unsafe fn error_text(e: CuResult, out: *mut *const c_char, name: bool) -> CuResult {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let (p, r) = match toast_gpu_emu::api::error_text(ERRORS, e, name) {
        Some(t) => (t.as_ptr(), CUDA_SUCCESS),
        None => (std::ptr::null(), CUDA_ERROR_INVALID_VALUE),
    };
    // SAFETY: non-null and writable (the caller's contract).
    unsafe { out.write(p) };
    r
}

/// `cuGetErrorString`: a static description (unknown codes:
/// `CUDA_ERROR_INVALID_VALUE` and null, as in CUDA).
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(e: CuResult, out: *mut *const c_char) -> CuResult {
    // SAFETY: the caller's contract.
    unsafe { error_text(e, out, false) }
}

/// `cuGetErrorName`: the enumerator's name.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(e: CuResult, out: *mut *const c_char) -> CuResult {
    // SAFETY: the caller's contract.
    unsafe { error_text(e, out, true) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_strings() {
        let mut p = std::ptr::null();
        // SAFETY: valid out pointer; the strings are static.
        unsafe {
            assert_eq!(cuGetErrorName(CUDA_ERROR_NOT_FOUND, &mut p), CUDA_SUCCESS);
            assert_eq!(CStr::from_ptr(p), c"CUDA_ERROR_NOT_FOUND");
            assert_eq!(cuGetErrorString(12345, &mut p), CUDA_ERROR_INVALID_VALUE);
            assert!(p.is_null());
        }
    }

    #[test]
    fn calls_before_init_and_without_a_context_are_refused() {
        let mut p = 0u64;
        // SAFETY: valid out pointers throughout.
        unsafe {
            if !INITIALIZED.load(Ordering::Acquire) {
                assert_eq!(cuMemAlloc_v2(&mut p, 8), CUDA_ERROR_NOT_INITIALIZED);
            }
            assert_eq!(cuInit(0), CUDA_SUCCESS);
            assert_eq!(cuMemAlloc_v2(&mut p, 8), CUDA_ERROR_INVALID_CONTEXT);
            let mut ctx = std::ptr::null_mut();
            assert_eq!(cuDevicePrimaryCtxRetain(&mut ctx, 0), CUDA_SUCCESS);
            assert_eq!(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
            assert_eq!(cuMemAlloc_v2(&mut p, 0), CUDA_ERROR_INVALID_VALUE);
            assert_eq!(cuMemAlloc_v2(&mut p, 8), CUDA_SUCCESS);
            assert_eq!(
                cuMemsetD8Async(p, 0, 9, std::ptr::null_mut()),
                CUDA_ERROR_INVALID_VALUE
            );
            assert_eq!(cuMemFree_v2(p), CUDA_SUCCESS);
            assert_eq!(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
            let mut v = 0;
            assert_eq!(cuDeviceGetAttribute(&mut v, 75, 0), CUDA_SUCCESS);
            assert_eq!(v, 8);
            assert_eq!(cuDeviceGetAttribute(&mut v, 18, 0), CUDA_SUCCESS);
            assert_eq!(v, toast_gpu_emu::api::integrated());
            assert_eq!(
                cuDeviceGetAttribute(&mut v, 9999, 0),
                CUDA_ERROR_NOT_SUPPORTED
            );
            assert_eq!(cuDeviceGet(&mut v, 1), CUDA_ERROR_INVALID_DEVICE);
            let mut m = std::ptr::null_mut();
            assert_eq!(
                cuModuleLoadData(&mut m, c"junk".as_ptr() as *const c_void),
                CUDA_ERROR_INVALID_IMAGE
            );
            let ptx = c".version 8.0\n.target sm_80\n.visible .entry toast_noise_weight(\n)\n{}\n";
            assert_eq!(
                cuModuleLoadData(&mut m, ptx.as_ptr() as *const c_void),
                CUDA_SUCCESS
            );
            let mut f = std::ptr::null_mut();
            assert_eq!(
                cuModuleGetFunction(&mut f, m, c"toast_noise_weight".as_ptr()),
                CUDA_SUCCESS
            );
            assert_eq!(
                cuModuleGetFunction(&mut f, m, c"toast_pixels_healpix_i64".as_ptr()),
                CUDA_ERROR_NOT_FOUND
            );
            let bad = std::ptr::null_mut();
            assert_eq!(
                cuLaunchKernel(
                    bad,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut()
                ),
                CUDA_ERROR_INVALID_HANDLE
            );
        }
    }
}
