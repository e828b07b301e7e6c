//! An emulated HIP runtime (`libamdhip64.so`) for toast-rs: exactly the HIP
//! entry points `backend-hip` resolves when it opens the library, with the
//! prototypes, error codes and `hipDeviceProp_t` of ROCm 5.x (the runtime
//! Debian ships, whose hiprtc the plugin compiles with), executed on the
//! host by `toast-gpu-emu` (see that crate's documentation for the design
//! and for where the emulation is not faithful).
//!
//! One device (`TOAST_EMU_DEVICES=N`: N, named `… #k`, each with its own UUID), "toast-rs emulated HIP device (host CPU)", architecture
//! `gfx90a` (so the plugin compiles for it with the real hiprtc), 16 GiB.
//! hiprtc is not part of this library: the plugin finds the real one
//! (`TOAST_HIPRTC_LIB`, `libhiprtc.so`, or ROCm 5's `libamdhip64.so.5`). A
//! dynamic shared-memory size or `extra` launch parameters are
//! `hipErrorNotSupported`. Set `TOAST_EMU_TRACE=1` to have every failing
//! call print its reason to stderr.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use toast_gpu_emu::api::{device, device_count, device_name, device_uuid, put, Runtime};
use toast_gpu_emu::{call, heap, image, EmuError, LIMITS};

/// `hipError_t`.
pub type HipError = c_int;

const HIP_SUCCESS: HipError = 0;
const HIP_ERROR_INVALID_VALUE: HipError = 1;
const HIP_ERROR_OUT_OF_MEMORY: HipError = 2;
const HIP_ERROR_NOT_INITIALIZED: HipError = 3;
const HIP_ERROR_INVALID_DEVICE_POINTER: HipError = 17;
const HIP_ERROR_INVALID_MEMCPY_DIRECTION: HipError = 21;
const HIP_ERROR_NO_DEVICE: HipError = 100;
const HIP_ERROR_INVALID_DEVICE: HipError = 101;
const HIP_ERROR_INVALID_IMAGE: HipError = 200;
const HIP_ERROR_INVALID_CONTEXT: HipError = 201;
const HIP_ERROR_INVALID_HANDLE: HipError = 400;
const HIP_ERROR_NOT_FOUND: HipError = 500;
const HIP_ERROR_ILLEGAL_ADDRESS: HipError = 700;
const HIP_ERROR_LAUNCH_FAILURE: HipError = 719;
const HIP_ERROR_NOT_SUPPORTED: HipError = 801;
const HIP_ERROR_UNKNOWN: HipError = 999;

/// Names and descriptions of the codes this library returns.
const ERRORS: &[(HipError, &CStr, &CStr)] = &[
    (HIP_SUCCESS, c"hipSuccess", c"no error"),
    (
        HIP_ERROR_INVALID_VALUE,
        c"hipErrorInvalidValue",
        c"invalid argument",
    ),
    (
        HIP_ERROR_OUT_OF_MEMORY,
        c"hipErrorOutOfMemory",
        c"out of memory",
    ),
    (
        HIP_ERROR_NOT_INITIALIZED,
        c"hipErrorNotInitialized",
        c"initialization error",
    ),
    (
        HIP_ERROR_INVALID_DEVICE_POINTER,
        c"hipErrorInvalidDevicePointer",
        c"invalid device pointer",
    ),
    (
        HIP_ERROR_INVALID_MEMCPY_DIRECTION,
        c"hipErrorInvalidMemcpyDirection",
        c"invalid copy direction for memcpy",
    ),
    (
        HIP_ERROR_NO_DEVICE,
        c"hipErrorNoDevice",
        c"no ROCm-capable device is detected",
    ),
    (
        HIP_ERROR_INVALID_DEVICE,
        c"hipErrorInvalidDevice",
        c"invalid device ordinal",
    ),
    (
        HIP_ERROR_INVALID_IMAGE,
        c"hipErrorInvalidImage",
        c"device kernel image is invalid",
    ),
    (
        HIP_ERROR_INVALID_CONTEXT,
        c"hipErrorInvalidContext",
        c"invalid device context",
    ),
    (
        HIP_ERROR_INVALID_HANDLE,
        c"hipErrorInvalidHandle",
        c"invalid resource handle",
    ),
    (
        HIP_ERROR_NOT_FOUND,
        c"hipErrorNotFound",
        c"named symbol not found",
    ),
    (
        HIP_ERROR_ILLEGAL_ADDRESS,
        c"hipErrorIllegalAddress",
        c"an illegal memory access was encountered",
    ),
    (
        HIP_ERROR_NOT_SUPPORTED,
        c"hipErrorNotSupported",
        c"operation not supported",
    ),
    (
        HIP_ERROR_LAUNCH_FAILURE,
        c"hipErrorLaunchFailure",
        c"unspecified launch failure",
    ),
    (HIP_ERROR_UNKNOWN, c"hipErrorUnknown", c"unknown error"),
];

/// The emulated device's name.
pub const DEVICE_NAME: &str = "toast-rs emulated HIP device (host CPU)";
/// Its `gcnArchName`.
pub const ARCH: &str = "gfx90a";

fn code(e: &EmuError) -> HipError {
    match e {
        EmuError::InvalidValue(_) => HIP_ERROR_INVALID_VALUE,
        EmuError::InvalidPointer(_) => HIP_ERROR_INVALID_DEVICE_POINTER,
        EmuError::OutOfMemory(_) => HIP_ERROR_OUT_OF_MEMORY,
        EmuError::IllegalAddress(_) => HIP_ERROR_ILLEGAL_ADDRESS,
        EmuError::InvalidHandle(_) => HIP_ERROR_INVALID_HANDLE,
        EmuError::InvalidImage(_) => HIP_ERROR_INVALID_IMAGE,
        EmuError::NotFound(_) => HIP_ERROR_NOT_FOUND,
        EmuError::InvalidDevice(_) => HIP_ERROR_INVALID_DEVICE,
        EmuError::NotInitialized(_) => HIP_ERROR_NOT_INITIALIZED,
        EmuError::InvalidContext(_) => HIP_ERROR_INVALID_CONTEXT,
        EmuError::NotSupported(_) => HIP_ERROR_NOT_SUPPORTED,
        EmuError::Internal(_) => HIP_ERROR_UNKNOWN,
        EmuError::Injected(_) | EmuError::LaunchFailed(_) => HIP_ERROR_LAUNCH_FAILURE,
    }
}

fn api(name: &str, f: impl FnOnce() -> Result<(), EmuError>) -> HipError {
    match call("hip", name, f) {
        Ok(()) => HIP_SUCCESS,
        Err(e) => code(&e),
    }
}

static RUNTIME: Runtime = Runtime::new();

/// ROCm 5.x's `hipDeviceProp_t` (`hip_runtime_api.h` of ROCm 5.2), up to
/// `gcnArchName`; the rest of its 792 bytes is left zero.
#[repr(C)]
#[derive(Debug)]
pub struct HipDeviceProp {
    name: [u8; 256],
    total_global_mem: usize,
    shared_mem_per_block: usize,
    regs_per_block: c_int,
    warp_size: c_int,
    max_threads_per_block: c_int,
    max_threads_dim: [c_int; 3],
    max_grid_size: [c_int; 3],
    clock_rate: c_int,
    memory_clock_rate: c_int,
    memory_bus_width: c_int,
    total_const_mem: usize,
    major: c_int,
    minor: c_int,
    multi_processor_count: c_int,
    l2_cache_size: c_int,
    max_threads_per_multi_processor: c_int,
    compute_mode: c_int,
    clock_instruction_rate: c_int,
    arch: u32,
    concurrent_kernels: c_int,
    pci_domain_id: c_int,
    pci_bus_id: c_int,
    pci_device_id: c_int,
    max_shared_memory_per_multi_processor: usize,
    is_multi_gpu_board: c_int,
    can_map_host_memory: c_int,
    gcn_arch: c_int,
    gcn_arch_name: [u8; 256],
    rest: [u8; 792 - 652],
}

const _: () = {
    assert!(std::mem::size_of::<HipDeviceProp>() == 792);
    assert!(std::mem::offset_of!(HipDeviceProp, total_global_mem) == 256);
    assert!(std::mem::offset_of!(HipDeviceProp, major) == 328);
    assert!(std::mem::offset_of!(HipDeviceProp, multi_processor_count) == 336);
    assert!(std::mem::offset_of!(HipDeviceProp, gcn_arch) == 392);
    assert!(std::mem::offset_of!(HipDeviceProp, gcn_arch_name) == 396);
};

fn properties(dev: c_int) -> HipDeviceProp {
    let text = |s: &str| {
        let mut b = [0u8; 256];
        b[..s.len()].copy_from_slice(s.as_bytes());
        b
    };
    HipDeviceProp {
        name: text(&device_name(DEVICE_NAME, dev)),
        total_global_mem: heap::total_memory() as usize,
        shared_mem_per_block: 0,
        regs_per_block: 0,
        warp_size: 64,
        max_threads_per_block: LIMITS.max_threads_per_block as c_int,
        max_threads_dim: LIMITS.max_block.map(|v| v as c_int),
        max_grid_size: LIMITS.max_grid.map(|v| v as c_int),
        clock_rate: 0,
        memory_clock_rate: 0,
        memory_bus_width: 0,
        total_const_mem: 0,
        major: 9,
        minor: 0,
        multi_processor_count: toast_gpu_emu::compute_units(),
        l2_cache_size: 0,
        max_threads_per_multi_processor: 0,
        compute_mode: 0,
        clock_instruction_rate: 0,
        arch: 0,
        concurrent_kernels: 0,
        pci_domain_id: 0,
        pci_bus_id: 0,
        pci_device_id: 0,
        max_shared_memory_per_multi_processor: 0,
        is_multi_gpu_board: 0,
        can_map_host_memory: 0,
        gcn_arch: 910,
        gcn_arch_name: text(ARCH),
        rest: [0; 792 - 652],
    }
}

/// `hipInit`.
///
/// # Safety
/// None beyond the C API's.
#[no_mangle]
pub unsafe extern "C" fn hipInit(flags: c_uint) -> HipError {
    api("hipInit", || {
        if flags != 0 {
            return Err(EmuError::InvalidValue(format!("flags {flags} (must be 0)")));
        }
        Ok(())
    })
}

/// `hipGetDeviceCount`: one device, or `TOAST_EMU_DEVICES`.
///
/// # Safety
/// `count` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn hipGetDeviceCount(count: *mut c_int) -> HipError {
    // SAFETY: the caller's contract.
    api("hipGetDeviceCount", || unsafe {
        put(count, device_count())
    })
}

/// `hipSetDevice`.
///
/// # Safety
/// None beyond the C API's.
#[no_mangle]
pub unsafe extern "C" fn hipSetDevice(dev: c_int) -> HipError {
    api("hipSetDevice", || device(dev))
}

/// `hipGetDeviceProperties` with ROCm 5.x's structure.
///
/// # Safety
/// `prop` is valid for a write of ROCm 5.x's `hipDeviceProp_t` (792 bytes).
#[no_mangle]
pub unsafe extern "C" fn hipGetDeviceProperties(prop: *mut HipDeviceProp, dev: c_int) -> HipError {
    api("hipGetDeviceProperties", || {
        device(dev)?;
        // SAFETY: the caller's contract.
        unsafe { put(prop, properties(dev)) }
    })
}

/// `hipRuntimeGetVersion`: ROCm 5.2's `HIP_VERSION` (the structures
/// emulated are ROCm 5.x's).
///
/// # Safety
/// `version` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn hipRuntimeGetVersion(version: *mut c_int) -> HipError {
    // SAFETY: the caller's contract.
    api("hipRuntimeGetVersion", || unsafe {
        put(version, 50_221_153)
    })
}

/// `hipDeviceGetAttribute`: integrated (attribute 16,
/// `hipDeviceAttributeIntegrated`: `TOAST_EMU_INTEGRATED`) and the
/// multiprocessor count (attribute 63,
/// `hipDeviceAttributeMultiprocessorCount`); any other attribute is
/// `hipErrorInvalidValue`, not emulated.
///
/// # Safety
/// `value` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn hipDeviceGetAttribute(
    value: *mut c_int,
    attr: c_int,
    dev: c_int,
) -> HipError {
    api("hipDeviceGetAttribute", || {
        device(dev)?;
        let v = match attr {
            16 => toast_gpu_emu::api::integrated(),
            63 => toast_gpu_emu::compute_units(),
            _ => {
                return Err(EmuError::InvalidValue(format!(
                    "device attribute {attr} is not emulated"
                )))
            }
        };
        // SAFETY: the caller's contract.
        unsafe { put(value, v) }
    })
}

/// `hipDeviceGetUuid`: [`toast_gpu_emu::api::device_uuid`].
///
/// # Safety
/// `uuid` is valid for a write of 16 bytes.
#[no_mangle]
pub unsafe extern "C" fn hipDeviceGetUuid(uuid: *mut [u8; 16], dev: c_int) -> HipError {
    api("hipDeviceGetUuid", || {
        device(dev)?;
        // SAFETY: the caller's contract.
        unsafe { put(uuid, device_uuid("hip", dev)) }
    })
}

/// `hipDeviceTotalMem`.
///
/// # Safety
/// `bytes` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn hipDeviceTotalMem(bytes: *mut usize, dev: c_int) -> HipError {
    api("hipDeviceTotalMem", || {
        device(dev)?;
        // SAFETY: the caller's contract.
        unsafe { put(bytes, heap::total_memory() as usize) }
    })
}

/// `hipMemGetInfo`.
///
/// # Safety
/// `free` and `total` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> HipError {
    api("hipMemGetInfo", || {
        let (f, t) = heap::info();
        // SAFETY: the caller's contract.
        unsafe {
            put(free, f as usize)?;
            put(total, t as usize)
        }
    })
}

/// `hipMalloc` (zero bytes gives a null pointer and success, as in HIP).
///
/// # Safety
/// `ptr` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn hipMalloc(ptr: *mut *mut c_void, bytes: usize) -> HipError {
    api("hipMalloc", || {
        let p = if bytes == 0 {
            0
        } else {
            heap::alloc(bytes as u64)?
        };
        // SAFETY: the caller's contract.
        unsafe { put(ptr, p as *mut c_void) }
    })
}

/// `hipFree` (null is a no-op, as in HIP).
///
/// # Safety
/// None beyond the C API's.
#[no_mangle]
pub unsafe extern "C" fn hipFree(ptr: *mut c_void) -> HipError {
    api("hipFree", || {
        if ptr.is_null() {
            return Ok(());
        }
        heap::free(ptr as u64)
    })
}

/// `hipMemcpyAsync`, completed before returning: host-to-device (1),
/// device-to-host (2), device-to-device (3), or inferred (4) from which
/// pointers are device memory; host-to-host (0) copies host memory.
///
/// # Safety
/// The host side(s) of the copy are valid for `bytes` bytes.
#[no_mangle]
pub unsafe extern "C" fn hipMemcpyAsync(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: c_int,
    s: *mut c_void,
) -> HipError {
    api("hipMemcpyAsync", || {
        RUNTIME.stream(s)?;
        let n = bytes as u64;
        let kind = match kind {
            4 => match (heap::contains(dst as u64), heap::contains(src as u64)) {
                (false, false) => 0,
                (true, false) => 1,
                (false, true) => 2,
                (true, true) => 3,
            },
            k => k,
        };
        match kind {
            0 => {
                if bytes > 0 && (dst.is_null() || src.is_null()) {
                    return Err(EmuError::InvalidValue("null host pointer".into()));
                }
                // SAFETY: both host ranges are valid (the caller's
                // contract); `copy` allows overlap.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
                Ok(())
            }
            // SAFETY: the host source is readable (the caller's contract).
            1 => unsafe { heap::copy_to_device(dst as u64, src as *const u8, n) },
            // SAFETY: the host destination is writable (the caller's
            // contract).
            2 => unsafe { heap::copy_to_host(dst as *mut u8, src as u64, n) },
            3 => heap::copy_on_device(dst as u64, src as u64, n),
            k => Err(EmuError::InvalidValue(format!("copy direction {k}"))),
        }
    })
}

/// `hipMemsetAsync`, completed before returning.
///
/// # Safety
/// None beyond the C API's.
#[no_mangle]
pub unsafe extern "C" fn hipMemsetAsync(
    dst: *mut c_void,
    value: c_int,
    bytes: usize,
    s: *mut c_void,
) -> HipError {
    api("hipMemsetAsync", || {
        RUNTIME.stream(s)?;
        heap::fill(dst as u64, value as u8, bytes as u64)
    })
}

/// `hipStreamCreate`.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn hipStreamCreate(out: *mut *mut c_void) -> HipError {
    api("hipStreamCreate", || {
        // SAFETY: the caller's contract.
        unsafe { put(out, RUNTIME.create_stream()) }
    })
}

/// `hipStreamSynchronize`: work is done when it is issued, so this checks
/// the stream only.
///
/// # Safety
/// None beyond the C API's.
#[no_mangle]
pub unsafe extern "C" fn hipStreamSynchronize(s: *mut c_void) -> HipError {
    api("hipStreamSynchronize", || RUNTIME.stream(s))
}

/// `hipModuleLoadData`: an AMD code object or an offload bundle holding
/// one, whose symbols are read (the code is not run).
///
/// # Safety
/// `image` is a complete code object or bundle; `module` is valid for a
/// write.
#[no_mangle]
pub unsafe extern "C" fn hipModuleLoadData(
    module: *mut *mut c_void,
    image: *const c_void,
) -> HipError {
    api("hipModuleLoadData", || {
        // SAFETY: the caller's contract (both pointers).
        unsafe { put(module, RUNTIME.load_module(image, image::read_hip)?) }
    })
}

/// `hipModuleGetFunction`: the host build of kernel `name`, which the
/// module must define.
///
/// # Safety
/// `name` is a NUL-terminated string; `f` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn hipModuleGetFunction(
    f: *mut *mut c_void,
    module: *mut c_void,
    name: *const c_char,
) -> HipError {
    api("hipModuleGetFunction", || {
        // SAFETY: the caller's contract (both pointers).
        unsafe { put(f, RUNTIME.function(module, name)?) }
    })
}

/// `hipModuleLaunchKernel` (grid in blocks), run to completion before
/// returning.
///
/// # Safety
/// `params` holds one pointer per kernel parameter, each to a value of the
/// parameter's type, and the kernel's accesses stay inside the buffers
/// passed (the runtime's contract).
#[no_mangle]
#[allow(clippy::too_many_arguments)] // hip_runtime_api.h's prototype
pub unsafe extern "C" fn hipModuleLaunchKernel(
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
) -> HipError {
    api("hipModuleLaunchKernel", || {
        // SAFETY: the caller's contract.
        unsafe { RUNTIME.launch(f, [gx, gy, gz], [bx, by, bz], shared_mem, s, params, extra) }
    })
}

fn error_text(e: HipError, name: bool) -> *const c_char {
    toast_gpu_emu::api::error_text(ERRORS, e, name)
        .or_else(|| toast_gpu_emu::api::error_text(ERRORS, HIP_ERROR_UNKNOWN, name))
        .map_or(std::ptr::null(), CStr::as_ptr)
}

/// `hipGetErrorString`: a static description ("unknown error" for a code
/// this library never returns).
#[no_mangle]
pub extern "C" fn hipGetErrorString(e: HipError) -> *const c_char {
    error_text(e, false)
}

/// `hipGetErrorName`: the enumerator's name.
#[no_mangle]
pub extern "C" fn hipGetErrorName(e: HipError) -> *const c_char {
    error_text(e, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_and_memory() {
        // SAFETY: valid out pointers, static strings.
        unsafe {
            let mut p = std::mem::MaybeUninit::<HipDeviceProp>::uninit();
            assert_eq!(hipGetDeviceProperties(p.as_mut_ptr(), 0), HIP_SUCCESS);
            let p = p.assume_init();
            assert!(p.name.starts_with(DEVICE_NAME.as_bytes()));
            assert!(p.gcn_arch_name.starts_with(b"gfx90a\0"));
            assert_eq!(hipSetDevice(1), HIP_ERROR_INVALID_DEVICE);
            let mut d = std::ptr::null_mut();
            assert_eq!(hipMalloc(&mut d, 0), HIP_SUCCESS);
            assert!(d.is_null());
            assert_eq!(hipMalloc(&mut d, 64), HIP_SUCCESS);
            let src = [3u8; 64];
            let mut back = [0u8; 64];
            let s = std::ptr::null_mut();
            assert_eq!(
                hipMemcpyAsync(d, src.as_ptr() as *const c_void, 64, 4, s),
                HIP_SUCCESS
            );
            assert_eq!(
                hipMemcpyAsync(back.as_mut_ptr() as *mut c_void, d, 64, 2, s),
                HIP_SUCCESS
            );
            assert_eq!(back, src);
            assert_eq!(
                hipMemcpyAsync(back.as_mut_ptr() as *mut c_void, d, 65, 2, s),
                HIP_ERROR_INVALID_VALUE
            );
            assert_eq!(
                hipMemsetAsync(d, 0, 64, 0x1234 as *mut c_void),
                HIP_ERROR_INVALID_HANDLE
            );
            assert_eq!(hipFree(d), HIP_SUCCESS);
            assert_eq!(hipFree(d), HIP_ERROR_INVALID_DEVICE_POINTER);
            assert_eq!(
                CStr::from_ptr(hipGetErrorName(HIP_ERROR_NOT_FOUND)),
                c"hipErrorNotFound"
            );
            assert_eq!(CStr::from_ptr(hipGetErrorString(-5)), c"unknown error");
            let mut m = std::ptr::null_mut();
            assert_eq!(
                hipModuleLoadData(&mut m, c"junk".as_ptr() as *const c_void),
                HIP_ERROR_INVALID_IMAGE
            );
        }
    }
}
