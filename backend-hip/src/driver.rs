//! The HIP driver: loading the runtime and hiprtc, the device, its stream
//! and its module, behind [`toast_gpu::Driver`].

use crate::ffi::{self, Hip, HipError};
use std::ffi::{c_int, c_void, CString};
use toast_accel::abi;
use toast_accel::device_source::Target;
use toast_accel::plugin_support::PluginError;
use toast_accel::rtc::hiprtc::Hiprtc;
use toast_accel::rtc::{CacheKey, CompileError, Compiled};
use toast_gpu::{
    ordinal_of, AllocError, DeviceChoice, DeviceMemoryKind, Driver, Grid, Param, ParamSlots,
};

fn unavailable(msg: impl Into<String>) -> PluginError {
    PluginError::new(abi::ERR_UNAVAILABLE, msg)
}

/// A kernel of the loaded module.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Function(*mut c_void);

// SAFETY: a `hipFunction_t` is a handle into a module that stays loaded for
// the life of the process; the runtime accepts it from any thread on which
// the device is selected (`bind`), which every entry point ensures.
unsafe impl Send for Function {}
// SAFETY: the handle is never mutated; see `Send`.
unsafe impl Sync for Function {}

/// The device: ordinal, runtime, stream, and what we know of it.
#[derive(Debug)]
struct Gpu {
    hip: Hip,
    ordinal: i32,
    name: String,
    /// `gfxNNN`.
    arch: String,
    total_memory: u64,
    /// Multiprocessors (compute units); 0 where the runtime does not say.
    compute_units: u32,
    /// Whose memory its allocations take (`hipDeviceAttributeIntegrated`).
    memory: DeviceMemoryKind,
    /// `hipDeviceGetUuid` (`None` where the runtime cannot tell).
    uuid: Option<[u8; 16]>,
    /// Transfers and kernels go to this one stream, in order.
    stream: *mut c_void,
}

// SAFETY: HIP streams may be used from any thread once the device is
// selected there (`bind`), which every entry point does; the runtime is
// thread-safe.
unsafe impl Send for Gpu {}
// SAFETY: the runtime is thread-safe and the handles are never mutated
// after `open`; see `Send`.
unsafe impl Sync for Gpu {}

/// The HIP driver: the device and hiprtc.
#[derive(Debug)]
pub(crate) struct HipDriver {
    gpu: Gpu,
    rtc: Hiprtc,
}

impl Gpu {
    fn check(&self, what: &str, r: HipError) -> Result<(), PluginError> {
        if r == ffi::HIP_SUCCESS {
            Ok(())
        } else {
            let after = if ffi::HIP_STICKY_ERRORS.contains(&r) {
                " (a kernel fault: the device is unusable from here on, and every later call \
                 of this process fails with it; the plugin option sync=launch names the kernel)"
            } else {
                ""
            };
            Err(PluginError::new(
                abi::ERR_DEVICE,
                format!("hip: {what}: {}{after}", self.hip.error_string(r)),
            ))
        }
    }

    fn open(choice: DeviceChoice<i32>) -> Result<Gpu, PluginError> {
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
        let ordinal = ordinal_of(&choice, count);
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
            compute_units: 0,
            memory: DeviceMemoryKind::Unknown,
            uuid: None,
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
        gpu.compute_units = gpu.hip.multiprocessors(ordinal);
        gpu.memory = gpu.hip.memory_kind(ordinal);
        gpu.uuid = gpu.hip.uuid(ordinal);
        gpu.stream = stream;
        Ok(gpu)
    }

    /// Select the device on the calling thread.
    fn bind(&self) -> Result<(), PluginError> {
        // SAFETY: a device index checked at open.
        let r = unsafe { (self.hip.set_device)(self.ordinal) };
        self.check("hipSetDevice", r)
    }

    fn synchronize(&self) -> Result<(), PluginError> {
        // SAFETY: our live stream.
        let r = unsafe { (self.hip.stream_synchronize)(self.stream) };
        self.check("hipStreamSynchronize", r)
    }

    /// Copy `bytes` bytes between host memory and the device, in
    /// `direction`; waits for the copy.
    ///
    /// # Safety
    /// `dst` and `src` are valid for `bytes` bytes on their sides of the
    /// copy.
    unsafe fn copy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        direction: c_int,
        what: &str,
    ) -> Result<(), PluginError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: valid for `bytes` bytes (the caller's contract); we
        // synchronise before returning, so the host memory outlives the copy.
        let r = unsafe { (self.hip.memcpy_async)(dst, src, bytes, direction, self.stream) };
        self.check(&format!("copy of {bytes} bytes to the {what}"), r)?;
        self.synchronize()
    }
}

impl Driver for HipDriver {
    const NAME: &'static str = "hip";
    const HANDLE_TAG: u64 = 0x41D0_u64 << 48;
    const TARGET: Target = Target::Hip;
    const DEVICE_ENV: &'static str = "TOAST_HIP_DEVICE";
    const COMPILER: &'static str = "hiprtc";

    type DeviceId = i32;
    type Buffer = u64;
    type Kernel = Function;

    fn parse_device(text: &str, what: &str) -> Result<i32, PluginError> {
        toast_gpu::parse_ordinal(text, what)
    }

    fn open(choice: DeviceChoice<i32>) -> Result<Self, PluginError> {
        let gpu = Gpu::open(choice)?;
        let rtc = Hiprtc::load().map_err(unavailable)?;
        Ok(HipDriver { gpu, rtc })
    }

    fn summary(&self) -> String {
        format!(
            "hip backend {}: device {} `{}` ({}), runtime {}, hiprtc {}.{} from {}",
            env!("CARGO_PKG_VERSION"),
            self.gpu.ordinal,
            self.gpu.name,
            self.gpu.arch,
            self.gpu.hip.origin,
            self.rtc.version.0,
            self.rtc.version.1,
            self.rtc.origin
        )
    }

    fn bind(&self) -> Result<(), PluginError> {
        self.gpu.bind()
    }

    fn device_name(&self) -> &str {
        &self.gpu.name
    }

    fn arch(&self) -> &str {
        &self.gpu.arch
    }

    fn total_memory(&self) -> u64 {
        self.gpu.total_memory
    }

    fn mem_info(&self) -> (u64, u64) {
        let (mut f, mut t) = (0usize, 0usize);
        // SAFETY: valid out pointers.
        if unsafe { (self.gpu.hip.mem_get_info)(&mut f, &mut t) } == ffi::HIP_SUCCESS {
            (f as u64, t as u64)
        } else {
            (0, self.gpu.total_memory)
        }
    }

    /// `hipDeviceAttributeMultiprocessorCount` (`hipDeviceGetAttribute`,
    /// not `hipDeviceProp_t`, whose layout differs between ROCm versions).
    fn compute_units(&self) -> u32 {
        self.gpu.compute_units
    }

    /// `hipDeviceAttributeIntegrated`.
    fn memory_kind(&self) -> DeviceMemoryKind {
        self.gpu.memory
    }

    fn uuid(&self) -> Option<[u8; 16]> {
        self.gpu.uuid
    }

    fn alloc(&self, bytes: u64) -> Result<u64, AllocError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        let r = unsafe { (self.gpu.hip.malloc)(&mut p, bytes as usize) };
        if r == ffi::HIP_SUCCESS {
            return Ok(p as u64);
        }
        let msg = format!("hipMalloc: {}", self.gpu.hip.error_string(r));
        Err(if r == ffi::HIP_ERROR_OUT_OF_MEMORY {
            AllocError::OutOfMemory(msg)
        } else {
            AllocError::Failed(msg)
        })
    }

    unsafe fn free(&self, buf: u64) {
        // SAFETY: `buf` came from `alloc` and is freed once (the caller's
        // contract).
        let _ = unsafe { (self.gpu.hip.free)(buf as *mut c_void) };
    }

    unsafe fn upload(&self, buf: u64, offset: u64, src: &[u8]) -> Result<(), PluginError> {
        // SAFETY: `buf + offset` has `src.len()` bytes (the caller's
        // contract) and `src` is a live slice.
        unsafe {
            self.gpu.copy(
                (buf + offset) as *mut c_void,
                src.as_ptr() as *const c_void,
                src.len(),
                ffi::HIP_MEMCPY_HOST_TO_DEVICE,
                "device",
            )
        }
    }

    unsafe fn download(&self, buf: u64, offset: u64, dst: &mut [u8]) -> Result<(), PluginError> {
        // SAFETY: `buf + offset` has `dst.len()` bytes (the caller's
        // contract) and `dst` is a live, writable slice.
        unsafe {
            self.gpu.copy(
                dst.as_mut_ptr() as *mut c_void,
                (buf + offset) as *const c_void,
                dst.len(),
                ffi::HIP_MEMCPY_DEVICE_TO_HOST,
                "host",
            )
        }
    }

    unsafe fn zero(&self, buf: u64, offset: u64, bytes: u64) -> Result<(), PluginError> {
        // SAFETY: `buf + offset` has at least `bytes` bytes (the caller's
        // contract).
        let r = unsafe {
            (self.gpu.hip.memset_async)(
                (buf + offset) as *mut c_void,
                0,
                bytes as usize,
                self.gpu.stream,
            )
        };
        self.gpu.check(&format!("zeroing {bytes} bytes"), r)?;
        self.gpu.synchronize()
    }

    fn synchronize(&self) -> Result<(), PluginError> {
        self.gpu.synchronize()
    }

    fn cache_key(&self, source_hash: &str) -> Option<CacheKey> {
        let (maj, min) = self.rtc.version;
        Some(CacheKey {
            file: format!("hip-{source_hash}-{}-hiprtc{maj}.{min}.co", self.gpu.arch),
            identity: format!("hip code object {}; hiprtc {maj}.{min}", self.gpu.arch),
        })
    }

    fn compile(&self, source: &str) -> Result<Compiled, CompileError> {
        self.rtc
            .compile(source, "toast_kernels.hip", &self.gpu.arch)
    }

    fn load_module(
        &self,
        image: &[u8],
        names: &[&'static str],
    ) -> Result<Vec<Function>, PluginError> {
        let (hip, arch) = (&self.gpu.hip, &self.gpu.arch);
        let mut module = std::ptr::null_mut();
        // SAFETY: `image` is a complete code object, read during the call;
        // valid out pointer.
        let r = unsafe { (hip.module_load_data)(&mut module, image.as_ptr() as *const c_void) };
        if r != ffi::HIP_SUCCESS {
            return Err(PluginError::new(
                abi::ERR_COMPILE,
                format!(
                    "hip: hipModuleLoadData rejected the compiled device code for {arch}: {}",
                    hip.error_string(r)
                ),
            ));
        }
        names
            .iter()
            .map(|&k| {
                let cname = CString::new(k).expect("kernel names have no NUL");
                let mut f = std::ptr::null_mut();
                // SAFETY: a module just loaded; a NUL-terminated name; out
                // pointer.
                let r = unsafe { (hip.module_get_function)(&mut f, module, cname.as_ptr()) };
                if r == ffi::HIP_SUCCESS {
                    Ok(Function(f))
                } else {
                    Err(PluginError::new(
                        abi::ERR_COMPILE,
                        format!(
                            "hip: kernel {k} not found in the compiled module for {arch}: {}",
                            hip.error_string(r)
                        ),
                    ))
                }
            })
            .collect()
    }

    unsafe fn launch(
        &self,
        name: &str,
        kernel: Function,
        grid: Grid,
        params: &[Param<u64>],
    ) -> Result<(), PluginError> {
        let mut slots = ParamSlots::new(params);
        let mut ptrs = slots.pointers();
        let blocks = grid.blocks;
        // SAFETY: the parameters match the kernel and their buffers are live
        // (the caller's contract); `slots` outlives the call, which copies
        // the parameters before returning.
        let r = unsafe {
            (self.gpu.hip.module_launch_kernel)(
                kernel.0,
                blocks.0,
                blocks.1,
                blocks.2,
                grid.threads,
                1,
                1,
                0,
                self.gpu.stream,
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.gpu
            .check(&format!("launch of kernel {name} on grid {blocks:?}"), r)
    }
}
