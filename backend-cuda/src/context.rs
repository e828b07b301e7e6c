//! The backend context: probing for the driver, the device, its stream, the
//! compiled module, host logging and the buffer table.

use crate::memory::{DeviceAlloc, Memory};
use cudarc::driver::result as cu;
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::Mutex;
use toast_accel::abi::{self, HostApi, LogFn};
use toast_accel::device_source as ds;
use toast_accel::plugin::PluginError;
use toast_accel::rtc as compile;
use toast_accel::rtc::nvrtc::Nvrtc;

fn unavailable(msg: impl Into<String>) -> PluginError {
    PluginError::new(abi::ERR_UNAVAILABLE, msg)
}

fn driver(what: &str, e: cu::DriverError) -> PluginError {
    PluginError::new(abi::ERR_DEVICE, format!("cuda: {what}: {e:?}"))
}

/// Check that the driver and NVRTC can be loaded, with a plain `dlopen`,
/// before cudarc touches them (cudarc panics when a library is missing).
/// Returns NVRTC, which the backend keeps for compiling.
pub(crate) fn probe() -> Result<Nvrtc, PluginError> {
    // SAFETY: loading the driver library runs its initialisers only; it is
    // closed again at once (cudarc opens its own handle).
    match unsafe { libloading::Library::new("libcuda.so.1") } {
        Ok(lib) => drop(lib),
        Err(e) => {
            return Err(unavailable(format!(
                "no NVIDIA driver (libcuda.so.1): {}",
                toast_accel::rtc::dl_error(&e)
            )))
        }
    }
    Nvrtc::load().map_err(unavailable)
}

/// The device: ordinal, driver handles, and what we know of it.
#[derive(Debug)]
pub(crate) struct Gpu {
    pub(crate) ordinal: i32,
    pub(crate) name: String,
    /// `sm_XY`.
    pub(crate) arch: String,
    pub(crate) total_memory: u64,
    pub(crate) compute_units: u32,
    cu_ctx: sys::CUcontext,
    /// Transfers and kernels go to this one stream, in order.
    pub(crate) stream: sys::CUstream,
}

// SAFETY: CUDA driver contexts and streams may be used from any thread once
// the context is made current there (`bind`), which every entry point does.
unsafe impl Send for Gpu {}
// SAFETY: as above; the driver API is thread-safe.
unsafe impl Sync for Gpu {}

impl Gpu {
    fn open(ordinal: i32) -> Result<Gpu, PluginError> {
        cu::init().map_err(|e| {
            if e.0 == sys::cudaError_enum::CUDA_ERROR_NO_DEVICE {
                unavailable("no NVIDIA GPU: cuInit returned CUDA_ERROR_NO_DEVICE")
            } else {
                unavailable(format!(
                    "cuInit failed: {e:?} (the driver is installed but unusable)"
                ))
            }
        })?;
        let count = cu::device::get_count()
            .map_err(|e| unavailable(format!("cuDeviceGetCount failed: {e:?}")))?;
        if count == 0 {
            return Err(unavailable("no NVIDIA GPU: cuDeviceGetCount returned 0"));
        }
        if ordinal < 0 || ordinal >= count {
            return Err(PluginError::invalid(format!(
                "cuda: device {ordinal} does not exist ({count} device(s))"
            )));
        }
        let dev = cu::device::get(ordinal).map_err(|e| driver("cuDeviceGet", e))?;
        let name = cu::device::get_name(dev).map_err(|e| driver("cuDeviceGetName", e))?;
        // SAFETY: `dev` is a valid device from cuDeviceGet.
        let attr = |a| unsafe { cu::device::get_attribute(dev, a) };
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .map_err(|e| driver("cuDeviceGetAttribute", e))?;
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
            .map_err(|e| driver("cuDeviceGetAttribute", e))?;
        let sms = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| driver("cuDeviceGetAttribute", e))?;
        // SAFETY: valid device.
        let total =
            unsafe { cu::device::total_mem(dev) }.map_err(|e| driver("cuDeviceTotalMem", e))?;
        // SAFETY: valid device; the primary context is retained for the life
        // of the process (plugins are never unloaded).
        let cu_ctx = unsafe { cu::primary_ctx::retain(dev) }
            .map_err(|e| driver("cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: a context just retained.
        unsafe { cu::ctx::set_current(cu_ctx) }.map_err(|e| driver("cuCtxSetCurrent", e))?;
        let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking)
            .map_err(|e| driver("cuStreamCreate", e))?;
        Ok(Gpu {
            ordinal,
            name,
            arch: format!("sm_{major}{minor}"),
            total_memory: total as u64,
            compute_units: sms.max(0) as u32,
            cu_ctx,
            stream,
        })
    }

    /// Make the context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<(), PluginError> {
        // SAFETY: the context is retained for the life of the process.
        unsafe { cu::ctx::set_current(self.cu_ctx) }.map_err(|e| driver("cuCtxSetCurrent", e))
    }

    /// Free and total device memory.
    pub(crate) fn mem_info(&self) -> (u64, u64) {
        cu::mem_get_info().map_or((0, self.total_memory), |(f, t)| (f as u64, t as u64))
    }

    pub(crate) fn synchronize(&self) -> Result<(), PluginError> {
        // SAFETY: our live stream.
        unsafe { cu::stream::synchronize(self.stream) }
            .map_err(|e| driver("cuStreamSynchronize", e))
    }

    /// Copy `bytes` host bytes to device address `dst`; waits for the copy
    /// (the host memory is only borrowed for the call).
    pub(crate) fn upload(&self, dst: u64, src: *const u8, bytes: u64) -> Result<(), PluginError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `dst` has `bytes` bytes (range-checked by the caller) and
        // `src` `bytes` readable bytes (ABI contract); we synchronise before
        // returning, so `src` outlives the copy.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, bytes as usize, self.stream)
        }
        .result()
        .map_err(|e| driver(&format!("copy of {bytes} bytes to the device"), e))?;
        self.synchronize()
    }

    /// Copy `bytes` bytes at device address `src` to host memory.
    pub(crate) fn download(&self, dst: *mut u8, src: u64, bytes: u64) -> Result<(), PluginError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: as in `upload`, with `dst` writable for `bytes` bytes.
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, bytes as usize, self.stream) }
            .result()
            .map_err(|e| driver(&format!("copy of {bytes} bytes to the host"), e))?;
        self.synchronize()
    }

    /// Load a module image (cubin or NUL-terminated PTX).
    pub(crate) fn load_module(&self, image: &[u8]) -> Result<sys::CUmodule, PluginError> {
        // SAFETY: `image` is a complete cubin or NUL-terminated PTX, read
        // during the call only.
        unsafe { cu::module::load_data(image.as_ptr() as *const c_void) }.map_err(|e| {
            PluginError::new(
                abi::ERR_COMPILE,
                format!(
                    "cuda: cuModuleLoadData rejected the compiled device code for {}: {e:?}",
                    self.arch
                ),
            )
        })
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
        f: sys::CUfunction,
        grid: (u32, u32, u32),
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), PluginError> {
        // SAFETY: by the caller's contract.
        unsafe { cu::launch_kernel(f, grid, (block, 1, 1), 0, self.stream, params) }
            .map_err(|e| driver(&format!("launch of kernel {kernel} on grid {grid:?}"), e))?;
        self.synchronize()
            .map_err(|e| PluginError::new(e.status, format!("kernel {kernel}: {}", e.message)))
    }
}

impl DeviceAlloc for Gpu {
    fn raw_alloc(&self, bytes: u64) -> Result<u64, (bool, String)> {
        // SAFETY: plain allocation in the current context.
        unsafe { cu::malloc_sync(bytes as usize) }.map_err(|e| {
            (
                e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY,
                format!("cuMemAlloc: {e:?}"),
            )
        })
    }
    fn raw_free(&self, ptr: u64) {
        // SAFETY: `ptr` came from `raw_alloc` and is freed once.
        let _ = unsafe { cu::free_sync(ptr) };
    }
    fn raw_zero(&self, ptr: u64, bytes: u64) -> Result<(), PluginError> {
        // SAFETY: `ptr` is a block of at least `bytes` bytes.
        unsafe { cu::memset_d8_async(ptr, 0, bytes as usize, self.stream) }
            .map_err(|e| driver(&format!("zeroing {bytes} bytes"), e))?;
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
    nvrtc: Nvrtc,
    pub(crate) memory: Memory,
    module: Mutex<Option<Module>>,
}

// SAFETY: `log_user` is the host's pointer, which the ABI lets any thread
// pass back to its callback; everything else is Send + Sync.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

impl Ctx {
    /// Probe for the driver, open the device and build the context.
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
        if let Ok(v) = std::env::var("TOAST_CUDA_DEVICE") {
            if !v.trim().is_empty() {
                ordinal = parse_device(&v, "environment variable TOAST_CUDA_DEVICE")?;
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
        let nvrtc = probe()?;
        let gpu = Gpu::open(ordinal)?;
        let ctx = Ctx {
            log,
            log_user,
            memory: Memory::new(gpu.total_memory / 4),
            gpu,
            nvrtc,
            module: Mutex::new(None),
        };
        for k in unknown {
            ctx.log(
                abi::LOG_WARN,
                &format!("cuda backend: unknown option `{k}` ignored"),
            );
        }
        ctx.log(
            abi::LOG_DEBUG,
            &format!(
                "cuda backend {}: device {} `{}` ({}, {} SMs), NVRTC {}.{} from {}",
                env!("CARGO_PKG_VERSION"),
                ctx.gpu.ordinal,
                ctx.gpu.name,
                ctx.gpu.arch,
                ctx.gpu.compute_units,
                ctx.nvrtc.version.0,
                ctx.nvrtc.version.1,
                ctx.nvrtc.origin
            ),
        );
        Ok(ctx)
    }

    /// The function `name` of the device module, compiling (or loading from
    /// the disk cache) the shared source on first use.
    pub(crate) fn function(&self, name: &str) -> Result<sys::CUfunction, PluginError> {
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
            .map(|&f| f as sys::CUfunction)
            .ok_or_else(|| {
                PluginError::new(
                    abi::ERR_INTERNAL,
                    format!("cuda: kernel {name} is not in the device source"),
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
        let (maj, min) = self.nvrtc.version;
        let file = format!("cuda-{source_hash}-{arch}-nvrtc{maj}.{min}.cubin");
        let image = match compile::cache_read(&file) {
            Some(code) => {
                self.log(
                    abi::LOG_DEBUG,
                    &format!("cuda: device code from the cache ({file})"),
                );
                code
            }
            None => {
                let c = self
                    .nvrtc
                    .compile(source, "toast_kernels.cu", arch)
                    .map_err(|e| {
                        let kernel = compile::kernel_at_error(source, &e.log);
                        PluginError::new(abi::ERR_COMPILE, format!("cuda: kernel {kernel}: {e}"))
                    })?;
                if !c.log.trim().is_empty() {
                    self.log(
                        abi::LOG_WARN,
                        &format!("cuda: NVRTC log for {arch}:\n{}", c.log),
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
            // SAFETY: a module just loaded; a NUL-terminated name.
            let f = unsafe { cu::module::get_function(module, cname) }.map_err(|e| {
                PluginError::new(
                    abi::ERR_COMPILE,
                    format!("cuda: kernel {k} not found in the compiled module for {arch}: {e:?}"),
                )
            })?;
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
