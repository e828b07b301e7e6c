//! What the CUDA and HIP entry points have in common, written once: the one
//! device, out-pointer writes, and the streams, modules and launches of a
//! [`Runtime`]. Each API library keeps only its prototypes, its error codes
//! and the rules that differ (CUDA's `cuInit` and current context).

use crate::image::Image;
use crate::{kernels, EmuError, Handles, LIMITS};
use std::ffi::{c_char, c_int, c_void, CStr};

/// Store `v` through the out pointer `p`.
///
/// # Safety
/// `p` is null or valid for a write of `T`.
pub unsafe fn put<T>(p: *mut T, v: T) -> Result<(), EmuError> {
    if p.is_null() {
        return Err(EmuError::InvalidValue("null output pointer".into()));
    }
    // SAFETY: non-null and writable (the caller's contract).
    unsafe { p.write(v) };
    Ok(())
}

/// How many devices the emulator reports: `TOAST_EMU_DEVICES` (1 to 16),
/// default 1. They share the one emulated heap (host memory); what differs
/// is their ordinal and name, which is what a test of device selection
/// (MPI ranks spread over a node's devices) looks at.
pub fn device_count() -> c_int {
    std::env::var("TOAST_EMU_DEVICES")
        .ok()
        .and_then(|v| v.trim().parse::<c_int>().ok())
        .filter(|n| (1..=16).contains(n))
        .unwrap_or(1)
}

/// Whether the emulated device says it is integrated (its memory the
/// host's, as an APU's): `TOAST_EMU_INTEGRATED=1`. By default it emulates a
/// discrete GPU (0), whose memory the host counts apart from its own, as
/// the tests of device runs measure it (outside the emulated heap).
pub fn integrated() -> c_int {
    let set = std::env::var("TOAST_EMU_INTEGRATED").is_ok_and(|v| v.trim() == "1");
    c_int::from(set)
}

/// Device `dev` exists (`0 <= dev < device_count()`).
pub fn device(dev: c_int) -> Result<(), EmuError> {
    let n = device_count();
    if (0..n).contains(&dev) {
        Ok(())
    } else {
        Err(EmuError::InvalidDevice(format!(
            "device {dev} ({n} device(s); TOAST_EMU_DEVICES sets how many)"
        )))
    }
}

/// The name of device `dev`: `base`, and ` #dev` when there are several.
pub fn device_name(base: &str, dev: c_int) -> String {
    if device_count() > 1 {
        format!("{base} #{dev}")
    } else {
        base.to_string()
    }
}

/// The UUID of device `dev` of the API `api` (`cuda`, `hip`): `toastemu`,
/// the API's name and the ordinal, so that the devices of one process
/// differ and every process names device `dev` the same, as the UUIDs of a
/// node's GPUs do.
pub fn device_uuid(api: &str, dev: c_int) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(b"toastemu");
    for (d, s) in id[8..12].iter_mut().zip(api.bytes()) {
        *d = s;
    }
    id[12..].copy_from_slice(&dev.to_le_bytes());
    id
}

/// The streams and modules of one API library.
#[derive(Debug)]
pub struct Runtime {
    streams: Handles<()>,
    modules: Handles<&'static Image>,
}

impl Default for Runtime {
    fn default() -> Self {
        Self::new()
    }
}

impl Runtime {
    /// No streams, no modules.
    pub const fn new() -> Self {
        Runtime {
            streams: Handles::new(0x57e4),
            modules: Handles::new(0x30d1),
        }
    }

    /// A new stream's handle.
    pub fn create_stream(&self) -> *mut c_void {
        self.streams.insert(()) as *mut c_void
    }

    /// `s` is the null stream or a live one.
    pub fn stream(&self, s: *mut c_void) -> Result<(), EmuError> {
        if s.is_null() || self.streams.get(s as u64).is_some() {
            Ok(())
        } else {
            Err(EmuError::InvalidHandle(format!("stream {s:p}")))
        }
    }

    /// Load a module from what `read` makes of `image`; its handle.
    ///
    /// # Safety
    /// `image` satisfies `read`'s contract.
    pub unsafe fn load_module(
        &self,
        image: *const c_void,
        read: unsafe fn(*const u8) -> Result<Image, EmuError>,
    ) -> Result<*mut c_void, EmuError> {
        // SAFETY: the caller's contract.
        let img = unsafe { read(image as *const u8)? };
        // Modules are never unloaded (the plugins keep theirs for the
        // life of the process), so the image is leaked.
        Ok(self.modules.insert(Box::leak(Box::new(img))) as *mut c_void)
    }

    /// The function `name` of `module`: the host build of that kernel, which
    /// the module must define.
    ///
    /// # Safety
    /// `name` is null or a NUL-terminated string.
    pub unsafe fn function(
        &self,
        module: *mut c_void,
        name: *const c_char,
    ) -> Result<*mut c_void, EmuError> {
        let img = self
            .modules
            .get(module as u64)
            .ok_or_else(|| EmuError::InvalidHandle(format!("module {module:p}")))?;
        if name.is_null() {
            return Err(EmuError::InvalidValue("null function name".into()));
        }
        // SAFETY: NUL-terminated (the caller's contract).
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        if !img.symbols.contains(name.as_ref()) {
            return Err(EmuError::NotFound(format!(
                "the {} defines no `{name}`",
                img.format
            )));
        }
        let k = kernels::find(&name)
            .ok_or_else(|| EmuError::NotFound(format!("`{name}` is not a kernel of kernels.h")))?;
        Ok(k as *const kernels::Kernel as *mut c_void)
    }

    /// Launch function `f` (from [`function`](Self::function)) on `grid`
    /// blocks of `block` threads, to completion.
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, each to a value of
    /// the parameter's type, and the kernel's accesses stay inside the
    /// buffers passed (the launch API's contract).
    #[allow(clippy::too_many_arguments)] // the launch APIs' parameters
    pub unsafe fn launch(
        &self,
        f: *mut c_void,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        s: *mut c_void,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> Result<(), EmuError> {
        self.stream(s)?;
        let k = kernels::from_handle(f)
            .ok_or_else(|| EmuError::InvalidHandle(format!("function {f:p}")))?;
        if shared_mem != 0 || !extra.is_null() {
            return Err(EmuError::NotSupported(format!(
                "{}: dynamic shared memory ({shared_mem} bytes) or `extra` parameters",
                k.name
            )));
        }
        // SAFETY: the caller's contract.
        unsafe { k.launch(grid, block, params, &LIMITS) }
    }
}

/// The name (`name`) or description of error code `e` in `table`.
pub fn error_text<C: PartialEq>(
    table: &'static [(C, &'static CStr, &'static CStr)],
    e: C,
    name: bool,
) -> Option<&'static CStr> {
    table
        .iter()
        .find(|(c, _, _)| *c == e)
        .map(|(_, n, d)| if name { *n } else { *d })
}
