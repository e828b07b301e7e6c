//! The few HIP runtime functions this backend calls, loaded from
//! `libamdhip64` with `libloading` at run time (no ROCm needed to build).
//!
//! Only functions whose C prototypes have been stable since ROCm 4.2 are
//! used. `hipDeviceProp_t` changed layout in ROCm 6 (`R0600`), so the
//! device name and `gcnArchName` are read from the properties buffer by
//! position-independent means: `name` is the first field in every layout,
//! and the architecture is the first `gfx…` string in the structure.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use toast_gpu::DeviceMemoryKind;

pub(crate) type HipError = c_int;
pub(crate) const HIP_SUCCESS: HipError = 0;
pub(crate) const HIP_ERROR_OUT_OF_MEMORY: HipError = 2;
pub(crate) const HIP_ERROR_NO_DEVICE: HipError = 100;
pub(crate) const HIP_ERROR_INVALID_DEVICE: HipError = 101;
/// The kernel faults after which the device is unusable for the process
/// (hip_runtime_api.h: `hipErrorIllegalAddress`, `hipErrorLaunchTimeOut`,
/// `hipErrorAssert`, `hipErrorLaunchFailure`), as CUDA's sticky errors.
pub(crate) const HIP_STICKY_ERRORS: [HipError; 4] = [700, 702, 710, 719];
pub(crate) const HIP_MEMCPY_HOST_TO_DEVICE: c_int = 1;
pub(crate) const HIP_MEMCPY_DEVICE_TO_HOST: c_int = 2;
/// `hipDeviceAttributeMultiprocessorCount`: its position in
/// `hipDeviceAttribute_t` (counted from `hipDeviceAttributeCudaCompatibleBegin
/// = 0`), 63 in the headers of ROCm 5.x and 6.x alike (their enumerations
/// list the same 63 attributes (values 0 to 62) before it, in the same order). ROCm 4.x
/// numbered the enumeration otherwise: it is read only from a runtime of
/// [`HIP_VERSION_5`] or later.
pub(crate) const HIP_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 63;
/// `hipDeviceAttributeIntegrated` ("Device is integrated GPU": an APU,
/// whose allocations take the host's memory): 16, its position in the same
/// enumeration, one of the 63 attributes before the multiprocessor count
/// (ROCm 5 and later alike).
pub(crate) const HIP_DEVICE_ATTRIBUTE_INTEGRATED: c_int = 16;
/// `HIP_VERSION` of ROCm 5.0 (`major * 10000000 + minor * 100000 + patch`),
/// as `hipRuntimeGetVersion` reports it.
pub(crate) const HIP_VERSION_5: c_int = 50_000_000;

/// The HIP runtime library names tried, in order.
pub const HIP_NAMES: &[&str] = &["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"];

/// The HIP runtime's entry points.
#[derive(Debug)]
pub(crate) struct Hip {
    _lib: libloading::Library,
    pub(crate) origin: String,
    pub(crate) init: unsafe extern "C" fn(c_uint) -> HipError,
    pub(crate) get_device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    pub(crate) set_device: unsafe extern "C" fn(c_int) -> HipError,
    pub(crate) get_device_properties: unsafe extern "C" fn(*mut c_void, c_int) -> HipError,
    pub(crate) device_total_mem: unsafe extern "C" fn(*mut usize, c_int) -> HipError,
    /// `hipRuntimeGetVersion(int* version)`.
    pub(crate) runtime_get_version: unsafe extern "C" fn(*mut c_int) -> HipError,
    /// `hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attr, int device)`.
    pub(crate) device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> HipError,
    pub(crate) mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> HipError,
    /// `hipDeviceGetUuid(hipUUID* uuid, hipDevice_t device)` (ROCm 5.2 and
    /// later; `None` in an older runtime).
    pub(crate) device_get_uuid: Option<unsafe extern "C" fn(*mut [u8; 16], c_int) -> HipError>,
    pub(crate) malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    pub(crate) free: unsafe extern "C" fn(*mut c_void) -> HipError,
    pub(crate) memcpy_async:
        unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, *mut c_void) -> HipError,
    pub(crate) memset_async:
        unsafe extern "C" fn(*mut c_void, c_int, usize, *mut c_void) -> HipError,
    pub(crate) stream_create: unsafe extern "C" fn(*mut *mut c_void) -> HipError,
    pub(crate) stream_synchronize: unsafe extern "C" fn(*mut c_void) -> HipError,
    pub(crate) module_load_data: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> HipError,
    pub(crate) module_get_function:
        unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> HipError,
    #[allow(clippy::type_complexity)]
    pub(crate) module_launch_kernel: unsafe extern "C" fn(
        *mut c_void,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipError,
    get_error_string: unsafe extern "C" fn(HipError) -> *const c_char,
}

fn sym<T: Copy>(lib: &libloading::Library, origin: &str, name: &str) -> Result<T, String> {
    // SAFETY: every caller names T as the C prototype of `name` in the HIP
    // or hiprtc headers.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("{origin} lacks {name}: {e}"))
}

fn open_first(names: &[&str]) -> Result<(libloading::Library, String), String> {
    let mut errs = Vec::new();
    for n in names {
        // SAFETY: loading the library runs its initialisers only; it stays
        // open as long as the returned handle lives.
        match unsafe { libloading::Library::new(*n) } {
            Ok(l) => return Ok((l, n.to_string())),
            Err(e) => errs.push(toast_accel::rtc::dl_error(&e)),
        }
    }
    Err(errs.join("; "))
}

impl Hip {
    /// Open the HIP runtime.
    pub(crate) fn load() -> Result<Hip, String> {
        let (lib, origin) = open_first(HIP_NAMES)
            .map_err(|e| format!("libamdhip64.so not found (no ROCm HIP runtime): {e}"))?;
        let o = origin.as_str();
        let props = sym(&lib, o, "hipGetDevicePropertiesR0600")
            .or_else(|_| sym(&lib, o, "hipGetDeviceProperties"))?;
        Ok(Hip {
            init: sym(&lib, o, "hipInit")?,
            get_device_count: sym(&lib, o, "hipGetDeviceCount")?,
            set_device: sym(&lib, o, "hipSetDevice")?,
            get_device_properties: props,
            device_total_mem: sym(&lib, o, "hipDeviceTotalMem")?,
            runtime_get_version: sym(&lib, o, "hipRuntimeGetVersion")?,
            device_get_attribute: sym(&lib, o, "hipDeviceGetAttribute")?,
            mem_get_info: sym(&lib, o, "hipMemGetInfo")?,
            device_get_uuid: sym(&lib, o, "hipDeviceGetUuid").ok(),
            malloc: sym(&lib, o, "hipMalloc")?,
            free: sym(&lib, o, "hipFree")?,
            memcpy_async: sym(&lib, o, "hipMemcpyAsync")?,
            memset_async: sym(&lib, o, "hipMemsetAsync")?,
            stream_create: sym(&lib, o, "hipStreamCreate")?,
            stream_synchronize: sym(&lib, o, "hipStreamSynchronize")?,
            module_load_data: sym(&lib, o, "hipModuleLoadData")?,
            module_get_function: sym(&lib, o, "hipModuleGetFunction")?,
            module_launch_kernel: sym(&lib, o, "hipModuleLaunchKernel")?,
            get_error_string: sym(&lib, o, "hipGetErrorString")?,
            origin,
            _lib: lib,
        })
    }

    /// `hipGetErrorString(e) (e)`.
    pub(crate) fn error_string(&self, e: HipError) -> String {
        // SAFETY: returns a static NUL-terminated string or null.
        let p = unsafe { (self.get_error_string)(e) };
        if p.is_null() {
            format!("hipError {e}")
        } else {
            // SAFETY: non-null, NUL-terminated, static.
            format!("{} ({e})", unsafe { CStr::from_ptr(p) }.to_string_lossy())
        }
    }

    /// The attribute `attribute` (a `hipDeviceAttribute_t` value, as this
    /// crate's constants number them) of device `ordinal`, from a runtime
    /// of ROCm 5 or later (whose attribute numbering is known); `None`
    /// where the runtime is older or does not answer. The attributes read
    /// are informational (`device_info`), not a reason to fail.
    pub(crate) fn attribute(&self, ordinal: c_int, attribute: c_int) -> Option<c_int> {
        let mut version: c_int = 0;
        // SAFETY: valid out pointer.
        let r = unsafe { (self.runtime_get_version)(&mut version) };
        if r != HIP_SUCCESS || version < HIP_VERSION_5 {
            return None;
        }
        let mut value: c_int = 0;
        // SAFETY: valid out pointer; an attribute of the runtime's
        // enumeration (ROCm 5 or later), a device index the caller checked.
        let r = unsafe { (self.device_get_attribute)(&mut value, attribute, ordinal) };
        (r == HIP_SUCCESS).then_some(value)
    }

    /// The multiprocessors (compute units) of device `ordinal`; 0,
    /// "unknown" as the ABI allows, where the runtime does not say.
    pub(crate) fn multiprocessors(&self, ordinal: c_int) -> u32 {
        self.attribute(ordinal, HIP_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .and_then(|units| u32::try_from(units).ok())
            .unwrap_or(0)
    }

    /// Whose memory device `ordinal`'s allocations take: the host's on an
    /// integrated GPU (an APU); unknown where the runtime does not say.
    pub(crate) fn memory_kind(&self, ordinal: c_int) -> DeviceMemoryKind {
        match self.attribute(ordinal, HIP_DEVICE_ATTRIBUTE_INTEGRATED) {
            Some(1) => DeviceMemoryKind::Host,
            Some(0) => DeviceMemoryKind::Own,
            _ => DeviceMemoryKind::Unknown,
        }
    }

    /// The UUID of device `ordinal`, the same whatever
    /// `HIP_VISIBLE_DEVICES` makes its ordinal; `None` where the runtime
    /// cannot tell (informational: it counts the processes that share the
    /// device).
    pub(crate) fn uuid(&self, ordinal: c_int) -> Option<[u8; 16]> {
        let get = self.device_get_uuid?;
        let mut id = [0u8; 16];
        // SAFETY: a 16-byte out buffer (`hipUUID`); a device index the
        // caller checked.
        let r = unsafe { get(&mut id, ordinal) };
        (r == HIP_SUCCESS).then_some(id)
    }

    /// Name and `gfx` architecture of device `ordinal`.
    pub(crate) fn device_name_arch(&self, ordinal: c_int) -> Result<(String, String), HipError> {
        // Larger than any hipDeviceProp_t layout (about 1.5 KiB in ROCm 6).
        let mut buf = vec![0u8; 16384];
        // SAFETY: the buffer is larger than the structure written.
        let r = unsafe { (self.get_device_properties)(buf.as_mut_ptr() as *mut c_void, ordinal) };
        if r != HIP_SUCCESS {
            return Err(r);
        }
        let cstr = |b: &[u8]| {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            String::from_utf8_lossy(&b[..end]).into_owned()
        };
        let name = cstr(&buf[..256]);
        let arch = buf[256..]
            .windows(4)
            .position(|w| w[..3] == *b"gfx" && w[3].is_ascii_alphanumeric())
            .map(|i| cstr(&buf[256 + i..]))
            .map(|s| s.split(':').next().unwrap_or_default().to_string())
            .unwrap_or_default();
        Ok((name, arch))
    }
}
