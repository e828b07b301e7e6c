//! The backend context: probing for the runtime, the device, its stream,
//! the compiled module, host logging and the buffer table.

use crate::ffi::{self, Hip, HipError};
use crate::memory::{DeviceAlloc, Memory};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::Mutex;
use toast_accel::abi::{self, HostApi, LogFn};
use toast_accel::device_source as ds;
use toast_accel::plugin::PluginError;
use toast_accel::rtc as compile;
use toast_accel::rtc::hiprtc::Hiprtc;

fn unavailable(msg: impl Into<String>) -> PluginError {
    PluginError::new(abi::ERR_UNAVAILABLE, msg)
}

/// The device: ordinal, runtime, stream, and what we know of it.
#[derive(Debug)]
pub(crate) struct Gpu {
    hip: Hip,
    pub(crate) ordinal: i32,
    pub(crate) name: String,
    /// `gfxNNN`.
    pub(crate) arch: String,
    pub(crate) total_memory: u64,
    /// Transfers and kernels go to this one stream, in order.
    stream: *mut c_void,
}

// SAFETY: HIP streams may be used from any thread once the device is
// selected there (`bind`), which every entry point does; the runtime is
// thread-safe.
unsafe impl Send for Gpu {}
// SAFETY: as above.
unsafe impl Sync for Gpu {}

impl Gpu {
    fn check(&self, what: &str, r: HipError) -> Result<(), PluginError> {
        if r == ffi::HIP_SUCCESS {
            Ok(())
        } else {
            Err(PluginError::new(
                abi::ERR_DEVICE,
                format!("hip: {what}: {}", self.hip.error_string(r)),
            ))
        }
    }

    fn open(ordinal: i32) -> Result<Gpu, PluginError> {
        let hip = Hip::load().map_err(unavailable)?;
        // SAFETY: plain runtime calls with valid out pointers.
        let r = unsafe { (hip.init)(0) };
        if r == ffi::HIP_ERROR_NO_DEVICE || r == ffi::HIP_ERROR_INVALID_DEVICE {
            let kfd = if std::path::Path::new("/dev/kfd").exists() {
                ""
            } else {
                ", no /dev/kfd"
            };
            return Err(unavailable(format!(
                "no AMD GPU: hipInit returned {}{kfd}",
                hip.error_string(r)
            )));
        }
        if r != ffi::HIP_SUCCESS {
            return Err(unavailable(format!(
                "hipInit failed: {}",
                hip.error_string(r)
            )));
        }
        let mut count: c_int = 0;
        // SAFETY: valid out pointer.
        let r = unsafe { (hip.get_device_count)(&mut count) };
        if r == ffi::HIP_ERROR_NO_DEVICE || (r == ffi::HIP_SUCCESS && count == 0) {
            return Err(unavailable("no AMD GPU: hipGetDeviceCount returned 0"));
        }
        if r != ffi::HIP_SUCCESS {
            return Err(unavailable(format!(
                "hipGetDeviceCount failed: {}",
                hip.error_string(r)
            )));
        }
        if ordinal < 0 || ordinal >= count {
            return Err(PluginError::invalid(format!(
                "hip: device {ordinal} does not exist ({count} device(s))"
            )));
        }
        let mut gpu = Gpu {
            hip,
            ordinal,
            name: String::new(),
            arch: String::new(),
            total_memory: 0,
            stream: std::ptr::null_mut(),
        };
        gpu.bind()?;
        let (name, arch) = gpu.hip.device_name_arch(ordinal).map_err(|r| {
            PluginError::new(
                abi::ERR_DEVICE,
                format!("hip: hipGetDeviceProperties: {}", gpu.hip.error_string(r)),
            )
        })?;
        if arch.is_empty() {
            return Err(PluginError::new(
                abi::ERR_DEVICE,
                format!("hip: device {ordinal} `{name}` reports no gfx architecture"),
            ));
        }
        let mut total = 0usize;
        // SAFETY: valid out pointer.
        let r = unsafe { (gpu.hip.device_total_mem)(&mut total, ordinal) };
        gpu.check("hipDeviceTotalMem", r)?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        let r = unsafe { (gpu.hip.stream_create)(&mut stream) };
        gpu.check("hipStreamCreate", r)?;
        gpu.name = name;
        gpu.arch = arch;
        gpu.total_memory = total as u64;
        gpu.stream = stream;
        Ok(gpu)
    }

    /// Select the device on the calling thread.
    pub(crate) fn bind(&self) -> Result<(), PluginError> {
        // SAFETY: a device index checked at open.
        let r = unsafe { (self.hip.set_device)(self.ordinal) };
        self.check("hipSetDevice", r)
    }

    /// Free and total device memory.
    pub(crate) fn mem_info(&self) -> (u64, u64) {
        let (mut f, mut t) = (0usize, 0usize);
        // SAFETY: valid out pointers.
        if unsafe { (self.hip.mem_get_info)(&mut f, &mut t) } == ffi::HIP_SUCCESS {
            (f as u64, t as u64)
        } else {
            (0, self.total_memory)
        }
    }

    pub(crate) fn synchronize(&self) -> Result<(), PluginError> {
        // SAFETY: our live stream.
        let r = unsafe { (self.hip.stream_synchronize)(self.stream) };
        self.check("hipStreamSynchronize", r)
    }

    /// Copy `bytes` host bytes to device address `dst`; waits for the copy.
    pub(crate) fn upload(&self, dst: u64, src: *const u8, bytes: u64) -> Result<(), PluginError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `dst` has `bytes` bytes (range-checked by the caller), `src`
        // `bytes` readable bytes (ABI contract); we synchronise before
        // returning, so `src` outlives the copy.
        let r = unsafe {
            (self.hip.memcpy_async)(
                dst as *mut c_void,
                src as *const c_void,
                bytes as usize,
                ffi::HIP_MEMCPY_HOST_TO_DEVICE,
                self.stream,
            )
        };
        self.check(&format!("copy of {bytes} bytes to the device"), r)?;
        self.synchronize()
    }

    /// Copy `bytes` bytes at device address `src` to host memory.
    pub(crate) fn download(&self, dst: *mut u8, src: u64, bytes: u64) -> Result<(), PluginError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: as in `upload`, with `dst` writable for `bytes` bytes.
        let r = unsafe {
            (self.hip.memcpy_async)(
                dst as *mut c_void,
                src as *const c_void,
                bytes as usize,
                ffi::HIP_MEMCPY_DEVICE_TO_HOST,
                self.stream,
            )
        };
        self.check(&format!("copy of {bytes} bytes to the host"), r)?;
        self.synchronize()
    }

    /// Load a code object.
    fn load_module(&self, image: &[u8]) -> Result<*mut c_void, PluginError> {
        let mut m = std::ptr::null_mut();
        // SAFETY: `image` is a complete code object, read during the call.
        let r = unsafe { (self.hip.module_load_data)(&mut m, image.as_ptr() as *const c_void) };
        if r != ffi::HIP_SUCCESS {
            return Err(PluginError::new(
                abi::ERR_COMPILE,
                format!(
                    "hip: hipModuleLoadData rejected the compiled device code for {}: {}",
                    self.arch,
                    self.hip.error_string(r)
                ),
            ));
        }
        Ok(m)
    }

    /// Launch `f` on a 3-D grid of blocks of `block` threads.
    ///
    /// # Safety
    /// `params` point to values whose types and order are the kernel's
    /// parameters, and every device address among them is live for the
    /// call (it is synchronous).
    pub(crate) unsafe fn launch(
        &self,
        kernel: &str,
        f: *mut c_void,
        grid: (u32, u32, u32),
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), PluginError> {
        // SAFETY: by the caller's contract.
        let r = unsafe {
            (self.hip.module_launch_kernel)(
                f,
                grid.0,
                grid.1,
                grid.2,
                block,
                1,
                1,
                0,
                self.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.check(&format!("launch of kernel {kernel} on grid {grid:?}"), r)?;
        self.synchronize()
            .map_err(|e| PluginError::new(e.status, format!("kernel {kernel}: {}", e.message)))
    }
}

impl DeviceAlloc for Gpu {
    fn raw_alloc(&self, bytes: u64) -> Result<u64, (bool, String)> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        let r = unsafe { (self.hip.malloc)(&mut p, bytes as usize) };
        if r == ffi::HIP_SUCCESS {
            Ok(p as u64)
        } else {
            Err((
                r == ffi::HIP_ERROR_OUT_OF_MEMORY,
                format!("hipMalloc: {}", self.hip.error_string(r)),
            ))
        }
    }
    fn raw_free(&self, ptr: u64) {
        // SAFETY: `ptr` came from `raw_alloc` and is freed once.
        let _ = unsafe { (self.hip.free)(ptr as *mut c_void) };
    }
    fn raw_zero(&self, ptr: u64, bytes: u64) -> Result<(), PluginError> {
        // SAFETY: `ptr` is a block of at least `bytes` bytes.
        let r =
            unsafe { (self.hip.memset_async)(ptr as *mut c_void, 0, bytes as usize, self.stream) };
        self.check(&format!("zeroing {bytes} bytes"), r)?;
        self.synchronize()
    }
}

/// The compiled kernels of one device.
#[derive(Debug)]
pub(crate) struct Module {
    functions: HashMap<&'static str, usize>,
}

/// What `init` creates and every call receives as `ctx`.
#[derive(Debug)]
pub(crate) struct Ctx {
    log: LogFn,
    log_user: *mut c_void,
    pub(crate) gpu: Gpu,
    rtc: Hiprtc,
    pub(crate) memory: Memory,
    module: Mutex<Option<Module>>,
}

// SAFETY: `log_user` is the host's pointer, which the ABI lets any thread
// pass back to its callback; everything else is Send + Sync.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

impl Ctx {
    /// Load the runtime, open the device and build the context.
    ///
    /// # Safety
    /// `host` is null or points to a `HostApi` of at least `host.size`
    /// bytes whose `options` is null or NUL-terminated.
    pub(crate) unsafe fn new(host: *const HostApi) -> Result<Ctx, PluginError> {
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
        let mut ordinal = 0i32;
        if let Ok(v) = std::env::var("TOAST_HIP_DEVICE") {
            if !v.trim().is_empty() {
                ordinal = parse_device(&v, "environment variable TOAST_HIP_DEVICE")?;
            }
        }
        let mut unknown = Vec::new();
        for item in options.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = item.split_once('=').unwrap_or((item, ""));
            match k.trim() {
                "device" => ordinal = parse_device(v, "option device")?,
                other => unknown.push(other.to_string()),
            }
        }
        let gpu = Gpu::open(ordinal)?;
        let rtc = Hiprtc::load().map_err(unavailable)?;
        let ctx = Ctx {
            log,
            log_user,
            memory: Memory::new(gpu.total_memory / 4),
            gpu,
            rtc,
            module: Mutex::new(None),
        };
        for k in unknown {
            ctx.log(
                abi::LOG_WARN,
                &format!("hip backend: unknown option `{k}` ignored"),
            );
        }
        ctx.log(
            abi::LOG_DEBUG,
            &format!(
                "hip backend {}: device {} `{}` ({}), runtime {}, hiprtc {}.{} from {}",
                env!("CARGO_PKG_VERSION"),
                ctx.gpu.ordinal,
                ctx.gpu.name,
                ctx.gpu.arch,
                ctx.gpu.hip.origin,
                ctx.rtc.version.0,
                ctx.rtc.version.1,
                ctx.rtc.origin
            ),
        );
        Ok(ctx)
    }

    /// The function `name` of the device module, compiling (or loading from
    /// the disk cache) the shared source on first use.
    pub(crate) fn function(&self, name: &str) -> Result<*mut c_void, PluginError> {
        let mut m = self.module.lock().unwrap_or_else(|e| e.into_inner());
        if m.is_none() {
            let target = crate::kernels::TARGET;
            let source = ds::source(target);
            let hash = format!("{:016x}", ds::source_hash(target));
            *m = Some(self.build_module(&source, &hash, &ds::KERNEL_NAMES)?);
        }
        let module = m.as_ref().expect("built above");
        module
            .functions
            .get(name)
            .map(|&f| f as *mut c_void)
            .ok_or_else(|| {
                PluginError::new(
                    abi::ERR_INTERNAL,
                    format!("hip: kernel {name} is not in the device source"),
                )
            })
    }

    fn build_module(
        &self,
        source: &str,
        source_hash: &str,
        kernels: &[&'static str],
    ) -> Result<Module, PluginError> {
        let arch = &self.gpu.arch;
        let (maj, min) = self.rtc.version;
        let file = format!("hip-{source_hash}-{arch}-hiprtc{maj}.{min}.co");
        let image = match compile::cache_read(&file) {
            Some(code) => {
                self.log(
                    abi::LOG_DEBUG,
                    &format!("hip: device code from the cache ({file})"),
                );
                code
            }
            None => {
                let c = self
                    .rtc
                    .compile(source, "toast_kernels.hip", arch)
                    .map_err(|e| {
                        let kernel = compile::kernel_at_error(source, &e.log);
                        PluginError::new(abi::ERR_COMPILE, format!("hip: kernel {kernel}: {e}"))
                    })?;
                if !c.log.trim().is_empty() {
                    self.log(
                        abi::LOG_WARN,
                        &format!("hip: hiprtc log for {arch}:\n{}", c.log),
                    );
                }
                compile::cache_write(&file, &c.code);
                c.code
            }
        };
        let module = self.gpu.load_module(&image)?;
        let mut functions = HashMap::new();
        for &k in kernels {
            let cname = CString::new(k).expect("kernel names have no NUL");
            let mut f = std::ptr::null_mut();
            // SAFETY: a module just loaded; a NUL-terminated name; out pointer.
            let r = unsafe { (self.gpu.hip.module_get_function)(&mut f, module, cname.as_ptr()) };
            if r != ffi::HIP_SUCCESS {
                return Err(PluginError::new(
                    abi::ERR_COMPILE,
                    format!(
                        "hip: kernel {k} not found in the compiled module for {arch}: {}",
                        self.gpu.hip.error_string(r)
                    ),
                ));
            }
            functions.insert(k, f as usize);
        }
        Ok(Module { functions })
    }

    /// Send a message to the host's log callback, if any.
    pub(crate) fn log(&self, level: i32, msg: &str) {
        if let Some(f) = self.log {
            // SAFETY: the host's callback takes `len` bytes at `msg` and the
            // user pointer it gave us.
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

impl Drop for Ctx {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            let _ = self.gpu.synchronize();
            self.memory.release_all(&self.gpu);
        }
    }
}

fn parse_device(v: &str, what: &str) -> Result<i32, PluginError> {
    v.trim()
        .parse::<i32>()
        .ok()
        .filter(|&d| d >= 0)
        .ok_or_else(|| {
            PluginError::invalid(format!(
                "{what}: `{v}` is not a device index (a non-negative integer)"
            ))
        })
}
