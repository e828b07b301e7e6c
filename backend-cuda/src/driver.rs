//! The CUDA driver: probing for the driver and NVRTC, the device, its
//! stream and its module, behind [`toast_gpu::Driver`].

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use std::ffi::{c_void, CString};
use toast_accel::abi;
use toast_accel::device_source::Target;
use toast_accel::plugin_support::PluginError;
use toast_accel::rtc::nvrtc::Nvrtc;
use toast_accel::rtc::{CacheKey, CompileError, Compiled};
use toast_gpu::{
    ordinal_of, AllocError, DeviceChoice, DeviceMemoryKind, Driver, Grid, Param, ParamSlots,
};

fn unavailable(msg: impl Into<String>) -> PluginError {
    PluginError::new(abi::ERR_UNAVAILABLE, msg)
}

fn driver(what: &str, e: cu::DriverError) -> PluginError {
    use sys::cudaError_enum as E;
    // A kernel fault leaves the context unusable: every later call of the
    // process returns the same error (the CUDA programming guide's "sticky"
    // errors), which would otherwise read as failures of their own.
    let sticky = matches!(
        e.0,
        E::CUDA_ERROR_ILLEGAL_ADDRESS
            | E::CUDA_ERROR_LAUNCH_TIMEOUT
            | E::CUDA_ERROR_ASSERT
            | E::CUDA_ERROR_HARDWARE_STACK_ERROR
            | E::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | E::CUDA_ERROR_MISALIGNED_ADDRESS
            | E::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | E::CUDA_ERROR_INVALID_PC
            | E::CUDA_ERROR_LAUNCH_FAILED
    );
    let after = if sticky {
        " (a kernel fault: the CUDA context is unusable from here on, and every later call \
         of this process fails with it; the plugin option sync=launch names the kernel)"
    } else {
        ""
    };
    PluginError::new(abi::ERR_DEVICE, format!("cuda: {what}: {e:?}{after}"))
}

/// Check that the driver and NVRTC can be loaded, with a plain `dlopen`,
/// before cudarc touches them (cudarc panics when a library or a symbol is
/// missing). Returns NVRTC, which the backend keeps for compiling, and
/// whether the driver has `cuDeviceGetUuid_v2` (R470, CUDA 11.4, on).
fn probe() -> Result<(Nvrtc, bool), PluginError> {
    // SAFETY: loading the driver library runs its initialisers only; it is
    // closed again at once (cudarc opens its own handle).
    let has_uuid = match unsafe { libloading::Library::new("libcuda.so.1") } {
        // SAFETY: only the symbol's presence is read; its type is never
        // used to call it.
        Ok(lib) => unsafe { lib.get::<unsafe extern "C" fn()>(b"cuDeviceGetUuid_v2") }.is_ok(),
        Err(e) => {
            return Err(unavailable(format!(
                "no NVIDIA driver (libcuda.so.1): {}",
                toast_accel::rtc::dl_error(&e)
            )))
        }
    };
    Ok((Nvrtc::load().map_err(unavailable)?, has_uuid))
}

/// A kernel of the loaded module.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Function(sys::CUfunction);

// SAFETY: a `CUfunction` is a handle into a module that stays loaded for the
// life of the process; the driver API accepts it from any thread on which
// its context is current (`bind`), which every entry point ensures.
unsafe impl Send for Function {}
// SAFETY: the handle is never mutated; see `Send`.
unsafe impl Sync for Function {}

/// The device: ordinal, driver handles, NVRTC, and what we know of it.
#[derive(Debug)]
pub(crate) struct CudaDriver {
    ordinal: i32,
    name: String,
    /// `sm_XY`.
    arch: String,
    total_memory: u64,
    compute_units: u32,
    /// Whose memory its allocations take (`CU_DEVICE_ATTRIBUTE_INTEGRATED`).
    memory: DeviceMemoryKind,
    /// `cuDeviceGetUuid_v2`, the same whatever `CUDA_VISIBLE_DEVICES`
    /// makes its ordinal (`None` where the driver cannot tell).
    uuid: Option<[u8; 16]>,
    cu_ctx: sys::CUcontext,
    /// Transfers and kernels go to this one stream, in order.
    stream: sys::CUstream,
    nvrtc: Nvrtc,
}

// SAFETY: CUDA driver contexts and streams may be used from any thread once
// the context is made current there (`bind`), which every entry point does.
unsafe impl Send for CudaDriver {}
// SAFETY: the driver API is thread-safe, and the handles are never mutated
// after `open`; see `Send`.
unsafe impl Sync for CudaDriver {}

impl CudaDriver {
    fn open_device(
        choice: DeviceChoice<i32>,
        nvrtc: Nvrtc,
        has_uuid: bool,
    ) -> Result<CudaDriver, PluginError> {
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
        let ordinal = ordinal_of(&choice, count);
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
        // An integrated GPU (Jetson, GB10) allocates from the host's
        // memory; a failed query leaves it unknown (informational).
        let memory = match attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED) {
            Ok(1) => DeviceMemoryKind::Host,
            Ok(0) => DeviceMemoryKind::Own,
            _ => DeviceMemoryKind::Unknown,
        };
        // The identity only counts the processes that share the device, so
        // a driver that cannot tell (one without the symbol, on which
        // cudarc would panic, or one that fails the call) leaves it unknown
        // rather than failing the start.
        let mut id = sys::CUuuid { bytes: [0; 16] };
        let uuid = if has_uuid {
            // SAFETY: valid device and out pointer; the symbol exists
            // (probed), so cudarc's lazy lookup finds it.
            unsafe { sys::cuDeviceGetUuid_v2(&mut id, dev) }
                .result()
                .ok()
                .map(|()| id.bytes.map(|b| b as u8))
        } else {
            None
        };
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
        Ok(CudaDriver {
            ordinal,
            name,
            arch: format!("sm_{major}{minor}"),
            total_memory: total as u64,
            compute_units: sms.max(0) as u32,
            memory,
            uuid,
            cu_ctx,
            stream,
            nvrtc,
        })
    }
}

impl Driver for CudaDriver {
    const NAME: &'static str = "cuda";
    const HANDLE_TAG: u64 = 0xC0DA_u64 << 48;
    const TARGET: Target = Target::Cuda;
    const DEVICE_ENV: &'static str = "TOAST_CUDA_DEVICE";
    const COMPILER: &'static str = "NVRTC";

    type DeviceId = i32;
    type Buffer = u64;
    type Kernel = Function;

    fn parse_device(text: &str, what: &str) -> Result<i32, PluginError> {
        toast_gpu::parse_ordinal(text, what)
    }

    fn open(choice: DeviceChoice<i32>) -> Result<Self, PluginError> {
        let (nvrtc, has_uuid) = probe()?;
        CudaDriver::open_device(choice, nvrtc, has_uuid)
    }

    fn summary(&self) -> String {
        format!(
            "cuda backend {}: device {} `{}` ({}, {} SMs), NVRTC {}.{} from {}",
            env!("CARGO_PKG_VERSION"),
            self.ordinal,
            self.name,
            self.arch,
            self.compute_units,
            self.nvrtc.version.0,
            self.nvrtc.version.1,
            self.nvrtc.origin
        )
    }

    fn bind(&self) -> Result<(), PluginError> {
        // SAFETY: the context is retained for the life of the process.
        unsafe { cu::ctx::set_current(self.cu_ctx) }.map_err(|e| driver("cuCtxSetCurrent", e))
    }

    fn device_name(&self) -> &str {
        &self.name
    }

    fn arch(&self) -> &str {
        &self.arch
    }

    fn total_memory(&self) -> u64 {
        self.total_memory
    }

    fn mem_info(&self) -> (u64, u64) {
        cu::mem_get_info().map_or((0, self.total_memory), |(f, t)| (f as u64, t as u64))
    }

    /// Streaming multiprocessors.
    fn compute_units(&self) -> u32 {
        self.compute_units
    }

    fn memory_kind(&self) -> DeviceMemoryKind {
        self.memory
    }

    fn uuid(&self) -> Option<[u8; 16]> {
        self.uuid
    }

    fn alloc(&self, bytes: u64) -> Result<u64, AllocError> {
        // SAFETY: plain allocation in the current context.
        unsafe { cu::malloc_sync(bytes as usize) }.map_err(|e| {
            let msg = format!("cuMemAlloc: {e:?}");
            if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
                AllocError::OutOfMemory(msg)
            } else {
                AllocError::Failed(msg)
            }
        })
    }

    unsafe fn free(&self, buf: u64) {
        // SAFETY: `buf` came from `alloc` and is freed once (the caller's
        // contract).
        let _ = unsafe { cu::free_sync(buf) };
    }

    unsafe fn upload(&self, buf: u64, offset: u64, src: &[u8]) -> Result<(), PluginError> {
        if src.is_empty() {
            return Ok(());
        }
        let bytes = src.len();
        // SAFETY: `buf + offset` has `bytes` bytes (the caller's contract)
        // and `src` is a live slice; we synchronise before returning, so
        // `src` outlives the copy.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                buf + offset,
                src.as_ptr() as *const c_void,
                bytes,
                self.stream,
            )
        }
        .result()
        .map_err(|e| driver(&format!("copy of {bytes} bytes to the device"), e))?;
        self.synchronize()
    }

    unsafe fn download(&self, buf: u64, offset: u64, dst: &mut [u8]) -> Result<(), PluginError> {
        if dst.is_empty() {
            return Ok(());
        }
        let bytes = dst.len();
        // SAFETY: as in `upload`, with `dst` a live, writable slice.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                dst.as_mut_ptr() as *mut c_void,
                buf + offset,
                bytes,
                self.stream,
            )
        }
        .result()
        .map_err(|e| driver(&format!("copy of {bytes} bytes to the host"), e))?;
        self.synchronize()
    }

    unsafe fn zero(&self, buf: u64, offset: u64, bytes: u64) -> Result<(), PluginError> {
        // SAFETY: `buf + offset` has at least `bytes` bytes (the caller's
        // contract).
        unsafe { cu::memset_d8_async(buf + offset, 0, bytes as usize, self.stream) }
            .map_err(|e| driver(&format!("zeroing {bytes} bytes"), e))?;
        self.synchronize()
    }

    fn synchronize(&self) -> Result<(), PluginError> {
        // SAFETY: our live stream.
        unsafe { cu::stream::synchronize(self.stream) }
            .map_err(|e| driver("cuStreamSynchronize", e))
    }

    fn cache_key(&self, source_hash: &str) -> Option<CacheKey> {
        let (maj, min) = self.nvrtc.version;
        Some(CacheKey {
            file: format!("cuda-{source_hash}-{}-nvrtc{maj}.{min}.cubin", self.arch),
            identity: format!("cuda cubin {}; NVRTC {maj}.{min}", self.arch),
        })
    }

    fn compile(&self, source: &str) -> Result<Compiled, CompileError> {
        self.nvrtc.compile(source, "toast_kernels.cu", &self.arch)
    }

    fn load_module(
        &self,
        image: &[u8],
        names: &[&'static str],
    ) -> Result<Vec<Function>, PluginError> {
        let arch = &self.arch;
        // SAFETY: `image` is a complete cubin or NUL-terminated PTX, read
        // during the call only.
        let module =
            unsafe { cu::module::load_data(image.as_ptr() as *const c_void) }.map_err(|e| {
                PluginError::new(
                    abi::ERR_COMPILE,
                    format!(
                        "cuda: cuModuleLoadData rejected the compiled device code for {arch}: {e:?}"
                    ),
                )
            })?;
        names
            .iter()
            .map(|&k| {
                let cname = CString::new(k).expect("kernel names have no NUL");
                // SAFETY: a module just loaded; a NUL-terminated name.
                unsafe { cu::module::get_function(module, cname) }
                    .map(Function)
                    .map_err(|e| {
                        PluginError::new(
                            abi::ERR_COMPILE,
                            format!(
                                "cuda: kernel {k} not found in the compiled module for {arch}: {e:?}"
                            ),
                        )
                    })
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
        unsafe {
            cu::launch_kernel(
                kernel.0,
                blocks,
                (grid.threads, 1, 1),
                0,
                self.stream,
                &mut ptrs,
            )
        }
        .map_err(|e| driver(&format!("launch of kernel {name} on grid {blocks:?}"), e))
    }
}
