//! The backend context: runtime loading, device selection, the compiled
//! program, host logging and the buffer registry.

use crate::memory::Registry;
use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::{Device as ClDevice, CL_DEVICE_TYPE_ALL};
use opencl3::error_codes::ClError;
use opencl3::kernel::Kernel;
use opencl3::platform::get_platforms;
use opencl3::program::Program;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use toast_accel::abi::{self, HostApi, LogFn};
use toast_accel::device_source::{self, Target};
use toast_accel::plugin_support::PluginError;

/// An OpenCL error code as text.
pub(crate) fn cl_error(e: ClError) -> String {
    format!("{e} ({})", e.0)
}

/// The selected device, its context, queue and compiled program.
#[derive(Debug)]
pub(crate) struct Device {
    pub(crate) name: String,
    pub(crate) platform: String,
    pub(crate) driver: String,
    pub(crate) global_mem: u64,
    pub(crate) max_alloc: u64,
    pub(crate) compute_units: u32,
    pub(crate) context: Context,
    pub(crate) queue: CommandQueue,
    /// Every kernel of the program, by entry-point name; the lock also
    /// serialises argument setting and launching.
    pub(crate) kernels: Mutex<HashMap<&'static str, Kernel>>,
    _program: Program,
}

/// What `init` creates and every call receives as `ctx`.
#[derive(Debug)]
pub(crate) struct OpenClContext {
    /// Shared by every context of the process on the same device.
    pub(crate) dev: Arc<Device>,
    pub(crate) registry: Registry,
    log: LogFn,
    log_user: *mut c_void,
}

// SAFETY: the host's log callback and its user pointer may be called from
// any thread (ABI rule); every other field is Send + Sync (the kernels are
// behind a mutex).
unsafe impl Send for OpenClContext {}
// SAFETY: as above.
unsafe impl Sync for OpenClContext {}

fn unavailable(msg: impl Into<String>) -> PluginError {
    PluginError::new(abi::ERR_UNAVAILABLE, msg)
}

impl OpenClContext {
    /// Parse the host API and options, pick a device and compile the kernels.
    ///
    /// # Safety
    /// `host` is null or points to a `HostApi` of at least `host.size`
    /// bytes whose `options` is null or NUL-terminated.
    pub(crate) unsafe fn new(host: *const HostApi) -> Result<OpenClContext, PluginError> {
        let mut log: LogFn = None;
        let mut log_user = std::ptr::null_mut();
        let mut options = String::new();
        if !host.is_null() {
            // SAFETY: non-null; the host passes a valid struct. Read the size first.
            let size = unsafe { std::ptr::addr_of!((*host).size).read() } as usize;
            if size >= std::mem::size_of::<HostApi>() {
                // SAFETY: the whole struct is present.
                let h = unsafe { &*host };
                log = h.log;
                log_user = h.log_user;
                if !h.options.is_null() {
                    // SAFETY: NUL-terminated by the ABI.
                    options = unsafe { CStr::from_ptr(h.options) }
                        .to_string_lossy()
                        .into_owned();
                }
            }
        }
        let mut selector = std::env::var("TOAST_OPENCL_DEVICE")
            .ok()
            .filter(|s| !s.trim().is_empty());
        for item in options.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = item.split_once('=').unwrap_or((item, ""));
            match k.trim() {
                "device" => selector = Some(v.trim().to_string()),
                other => {
                    return Err(PluginError::new(
                        abi::ERR_INVALID_ARGUMENT,
                        format!("unknown option `{other}` (known: device)"),
                    ))
                }
            }
        }
        let dev = open_device(selector.as_deref())?;
        let ctx = OpenClContext {
            dev,
            registry: Registry::default(),
            log,
            log_user,
        };
        ctx.log(
            abi::LOG_DEBUG,
            &format!(
                "opencl backend on `{}` ({}, driver {}), {} compute units, {} bytes",
                ctx.dev.name,
                ctx.dev.platform,
                ctx.dev.driver,
                ctx.dev.compute_units,
                ctx.dev.global_mem
            ),
        );
        Ok(ctx)
    }

    pub(crate) fn log(&self, level: i32, msg: &str) {
        if let Some(f) = self.log {
            // SAFETY: the host's callback with its own user pointer; `msg`
            // is valid for `len` bytes during the call.
            unsafe {
                f(
                    self.log_user,
                    level,
                    msg.as_ptr() as *const c_char,
                    msg.len(),
                )
            };
        }
    }
}

/// Every device of every platform: `(platform index, device index,
/// platform name, device)`.
fn all_devices() -> Result<Vec<(usize, usize, String, ClDevice)>, PluginError> {
    let platforms = get_platforms().map_err(|e| {
        unavailable(format!(
            "no OpenCL platform (the ICD loader found none: {})",
            cl_error(e)
        ))
    })?;
    let mut out = Vec::new();
    for (pi, p) in platforms.iter().enumerate() {
        let pname = p.name().unwrap_or_else(|_| format!("platform {pi}"));
        // A platform without devices reports CL_DEVICE_NOT_FOUND.
        let ids = p.get_devices(CL_DEVICE_TYPE_ALL).unwrap_or_default();
        for (di, id) in ids.into_iter().enumerate() {
            out.push((pi, di, pname.clone(), ClDevice::new(id)));
        }
    }
    Ok(out)
}

/// Why a device cannot run the kernels, if it cannot.
fn unsuitable(d: &ClDevice) -> Option<String> {
    let ext = d.extensions().unwrap_or_default();
    let missing: Vec<&str> = ["cl_khr_fp64", "cl_khr_int64_base_atomics"]
        .into_iter()
        .filter(|e| !ext.split_whitespace().any(|x| x == *e))
        .collect();
    (!missing.is_empty()).then(|| format!("it lacks {}", missing.join(" and ")))
}

/// Devices opened so far, by (platform index, device index): the OpenCL
/// context, queue and compiled program are made once per device and process
/// and shared by every backend context (the lock also serialises opening,
/// as concurrent program builds are not safe on every implementation).
#[allow(clippy::type_complexity)]
static OPENED: Mutex<Vec<((usize, usize), Arc<Device>)>> = Mutex::new(Vec::new());

/// Pick the device (`selector`: "P:D" indices or a substring of the device
/// name, case-insensitive; else the first suitable one) and open it, or
/// return it if this process opened it already.
fn open_device(selector: Option<&str>) -> Result<Arc<Device>, PluginError> {
    let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = cl3::load_library() {
        return Err(unavailable(format!(
            "no OpenCL runtime (libOpenCL.so.1): {e}"
        )));
    }
    let devs = all_devices()?;
    if devs.is_empty() {
        return Err(unavailable(
            "no OpenCL device: the OpenCL platforms list no device (install an ICD such as pocl-opencl-icd)",
        ));
    }
    let listing = || {
        devs.iter()
            .map(|(p, d, pn, dev)| format!("{p}:{d} `{}` ({pn})", dev.name().unwrap_or_default()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let chosen = match selector {
        Some(sel) => {
            let by_index = sel.split_once(':').and_then(|(p, d)| {
                Some((
                    p.trim().parse::<usize>().ok()?,
                    d.trim().parse::<usize>().ok()?,
                ))
            });
            let found = devs.iter().find(|(p, d, _, dev)| match by_index {
                Some((pi, di)) => *p == pi && *d == di,
                None => dev
                    .name()
                    .unwrap_or_default()
                    .to_lowercase()
                    .contains(&sel.to_lowercase()),
            });
            let Some(f) = found else {
                return Err(unavailable(format!(
                    "no OpenCL device matches `{sel}` (TOAST_OPENCL_DEVICE or option device=); devices: {}",
                    listing()
                )));
            };
            if let Some(why) = unsuitable(&f.3) {
                return Err(unavailable(format!(
                    "OpenCL device `{}` cannot run the kernels: {why}",
                    f.3.name().unwrap_or_default()
                )));
            }
            f
        }
        None => match devs.iter().find(|d| unsuitable(&d.3).is_none()) {
            Some(f) => f,
            None => {
                return Err(unavailable(format!(
                    "no OpenCL device has cl_khr_fp64 and cl_khr_int64_base_atomics; devices: {}",
                    listing()
                )))
            }
        },
    };
    let (pi, di, pname, d) = chosen;
    if let Some((_, dev)) = opened.iter().find(|(k, _)| *k == (*pi, *di)) {
        return Ok(Arc::clone(dev));
    }
    let name = d.name().unwrap_or_default();
    let context = Context::from_device(d).map_err(|e| {
        PluginError::new(
            abi::ERR_DEVICE,
            format!(
                "cannot create an OpenCL context on `{name}`: {}",
                cl_error(e)
            ),
        )
    })?;
    // SAFETY: the device belongs to the context just created.
    let queue = unsafe { CommandQueue::create(&context, d.id(), 0) }.map_err(|e| {
        PluginError::new(
            abi::ERR_DEVICE,
            format!("cannot create an OpenCL queue on `{name}`: {}", cl_error(e)),
        )
    })?;
    let driver = d.driver_version().unwrap_or_default();
    let program = compile(&context, &name, pname, &driver)?;
    let mut kernels = HashMap::new();
    for k in device_source::KERNEL_NAMES {
        let kern = Kernel::create(&program, k).map_err(|e| {
            PluginError::new(
                abi::ERR_COMPILE,
                format!(
                    "kernel `{k}`: not found in the compiled program: {}",
                    cl_error(e)
                ),
            )
        })?;
        kernels.insert(k, kern);
    }
    let dev = Arc::new(Device {
        name: name.clone(),
        platform: pname.clone(),
        driver,
        global_mem: d.global_mem_size().unwrap_or(0),
        max_alloc: d.max_mem_alloc_size().unwrap_or(u64::MAX),
        compute_units: d.max_compute_units().unwrap_or(0),
        context,
        queue,
        kernels: Mutex::new(kernels),
        _program: program,
    });
    opened.push(((*pi, *di), Arc::clone(&dev)));
    Ok(dev)
}

/// Where compiled programs are cached: `$TOAST_CACHE_DIR/opencl`, else
/// `$XDG_CACHE_HOME/toast-rs/opencl`, else `$HOME/.cache/toast-rs/opencl`;
/// `None` when `TOAST_OPENCL_CACHE=0` or no directory is known.
fn cache_dir() -> Option<PathBuf> {
    if std::env::var("TOAST_OPENCL_CACHE").is_ok_and(|v| v.trim() == "0") {
        return None;
    }
    let nonempty = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    nonempty("TOAST_CACHE_DIR")
        .or_else(|| nonempty("XDG_CACHE_HOME").map(|d| d.join("toast-rs")))
        .or_else(|| nonempty("HOME").map(|d| d.join(".cache").join("toast-rs")))
        .map(|d| d.join("opencl"))
}

/// The cache file of the program for this source, device and driver.
fn cache_file(device: &str, platform: &str, driver: &str) -> Option<PathBuf> {
    let key = format!(
        "{:016x}\0{device}\0{platform}\0{driver}",
        device_source::source_hash(Target::OpenCl)
    );
    Some(cache_dir()?.join(format!("{:016x}.bin", device_source::fnv1a(key.as_bytes()))))
}

/// Whether a built program holds every kernel.
fn complete(p: &Program) -> bool {
    let names: Vec<&str> = p.kernel_names().split(';').map(str::trim).collect();
    device_source::KERNEL_NAMES
        .iter()
        .all(|k| names.contains(k))
}

/// The compiled kernels for this device: from the on-disk cache (keyed by
/// the source hash, device name, platform and driver version) when a usable
/// binary is there, else compiled from the shared device source and stored
/// (best effort: a cache that cannot be read or written is only skipped).
fn compile(
    context: &Context,
    device: &str,
    platform: &str,
    driver: &str,
) -> Result<Program, PluginError> {
    let file = cache_file(device, platform, driver);
    if let Some(bin) = file.as_ref().and_then(|f| std::fs::read(f).ok()) {
        if let Ok(p) = Program::create_and_build_from_binary(context, &[&bin], "") {
            if complete(&p) {
                return Ok(p);
            }
        }
    }
    let src = device_source::source(Target::OpenCl);
    let p = Program::create_and_build_from_source(context, &src, "").map_err(|log| {
        PluginError::new(
            abi::ERR_COMPILE,
            format!(
                "the device kernels ({}; source hash {:016x}) failed to compile for OpenCL device `{device}`: {log}",
                device_source::KERNEL_NAMES.join(", "),
                device_source::source_hash(Target::OpenCl)
            ),
        )
    })?;
    if let (Some(f), Ok(bins)) = (file, p.get_binaries()) {
        if let (Some(bin), Some(dir)) = (bins.first().filter(|b| !b.is_empty()), f.parent()) {
            // Write then rename, so a concurrent reader never sees half a file.
            let tmp = f.with_extension(format!("tmp{}", std::process::id()));
            let stored = std::fs::create_dir_all(dir)
                .and_then(|_| std::fs::write(&tmp, bin))
                .and_then(|_| std::fs::rename(&tmp, &f));
            if stored.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
        }
    }
    Ok(p)
}
