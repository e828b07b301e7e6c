//! The OpenCL [`Driver`]: memory objects, blocking copies and fills on the
//! backend context's own in-order queue, the program, and launches.

use crate::device::{self, cl_error, ClKernel, Device, Queue, Selector};
use cl3::command_queue as cq;
use opencl3::memory::CL_MEM_READ_WRITE;
use opencl3::types::{cl_event, cl_mem, CL_BLOCKING};
use std::ffi::c_void;
use std::sync::Arc;
use toast_accel::abi;
use toast_accel::device_source::{fnv1a, Target};
use toast_accel::plugin_support::PluginError;
use toast_accel::rtc::{self, CacheKey, CompileError, Compiled};
use toast_gpu::{AllocError, DeviceChoice, DeviceMemoryKind, Driver, Grid, Param};

/// A device allocation: an OpenCL buffer object. Kernels receive the object
/// itself (`clSetKernelArg`), never an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mem(cl_mem);

// SAFETY: an OpenCL memory object is a reference-counted handle that the
// OpenCL API accepts from any thread.
unsafe impl Send for Mem {}
// SAFETY: as for `Send`; the handle itself is never mutated.
unsafe impl Sync for Mem {}

/// The OpenCL device of one backend context (shared with the other
/// contexts on the same device: see [`device`]) and the context's own queue.
#[derive(Debug)]
pub struct OpenClDriver {
    /// Every command of this backend context, in order. Declared first, so
    /// it is released before the device it was made on (which the
    /// process-wide list keeps alive anyway; OpenCL counts the queue's
    /// reference to the context).
    queue: Queue,
    dev: Arc<Device>,
}

fn device_error(what: &str, code: i32) -> PluginError {
    PluginError::new(
        abi::ERR_DEVICE,
        format!("opencl: {what}: {}", cl_error(code)),
    )
}

/// Release the event an enqueue call returned (every call here waits for
/// its command otherwise, so the event is not needed).
fn release(ev: cl_event) {
    // SAFETY: an event just returned by an enqueue call, released once.
    let _ = unsafe { cl3::event::release_event(ev) };
}

/// The status codes that mean the device (or the host, for PoCL) has no
/// memory for a buffer.
fn is_out_of_memory(code: i32) -> bool {
    use opencl3::error_codes::{
        CL_INVALID_BUFFER_SIZE, CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_OUT_OF_HOST_MEMORY,
        CL_OUT_OF_RESOURCES,
    };
    [
        CL_MEM_OBJECT_ALLOCATION_FAILURE,
        CL_OUT_OF_RESOURCES,
        CL_OUT_OF_HOST_MEMORY,
        CL_INVALID_BUFFER_SIZE,
    ]
    .contains(&code)
}

fn alloc_error(what: &str, code: i32) -> AllocError {
    let msg = format!("opencl: {what}: {}", cl_error(code));
    if is_out_of_memory(code) {
        AllocError::OutOfMemory(msg)
    } else {
        AllocError::Failed(msg)
    }
}

impl OpenClDriver {
    /// Fill `bytes` bytes of `buf` at `offset` with zeros and wait.
    ///
    /// # Safety
    /// `buf` is a live buffer of at least `offset + bytes` bytes.
    unsafe fn fill_zero(&self, buf: cl_mem, offset: u64, bytes: u64) -> Result<(), i32> {
        let zero = 0u8;
        // SAFETY: the range is inside the buffer (the caller's contract);
        // the one-byte pattern is copied during the call.
        let ev = unsafe {
            cq::enqueue_fill_buffer(
                self.queue.get(),
                buf,
                &zero as *const u8 as *const c_void,
                1,
                offset as usize,
                bytes as usize,
                0,
                std::ptr::null(),
            )
        }?;
        release(ev);
        cq::finish(self.queue.get())
    }
}

impl Driver for OpenClDriver {
    const NAME: &'static str = "opencl";
    /// "OCL" in ASCII, above 2^47.
    const HANDLE_TAG: u64 = 0x004f_434c_0000_0000;
    const TARGET: Target = Target::OpenCl;
    const DEVICE_ENV: &'static str = "TOAST_OPENCL_DEVICE";
    const COMPILER: &'static str = "OpenCL C compiler";
    /// OpenCL allocates lazily: `alloc` fills the new buffer, which zeroes it
    /// and makes a failed allocation an out-of-memory error right there.
    const ZEROES_ON_ALLOC: bool = true;

    type DeviceId = Selector;
    type Buffer = Mem;
    type Kernel = ClKernel;

    fn parse_device(text: &str, _what: &str) -> Result<Selector, PluginError> {
        Ok(Selector::parse(text))
    }

    fn open(choice: DeviceChoice<Selector>) -> Result<Self, PluginError> {
        rtc::cache_switch_off("TOAST_OPENCL_CACHE").map_err(PluginError::invalid)?;
        let (selector, node_local) = match choice {
            DeviceChoice::Default => (Selector::FirstSuitable, None),
            DeviceChoice::Named(s) => (s, None),
            DeviceChoice::NodeLocal { rank, .. } => (Selector::FirstSuitable, Some(rank)),
        };
        let dev = device::open(&selector, node_local)?;
        let queue = dev.new_queue()?;
        Ok(OpenClDriver { queue, dev })
    }

    fn summary(&self) -> String {
        let d = &self.dev;
        format!(
            "opencl backend {} on `{}` ({}, driver {}), {} compute units, {} bytes",
            env!("CARGO_PKG_VERSION"),
            d.name,
            d.platform,
            d.driver,
            d.compute_units,
            d.global_mem
        )
    }

    /// Nothing to do: OpenCL has no current device.
    fn bind(&self) -> Result<(), PluginError> {
        Ok(())
    }

    fn device_name(&self) -> &str {
        &self.dev.name
    }

    /// The platform and driver version (OpenCL binaries are specific to
    /// them, not to a named architecture).
    fn arch(&self) -> &str {
        &self.dev.arch
    }

    fn total_memory(&self) -> u64 {
        self.dev.global_mem
    }

    /// OpenCL cannot tell the free memory: 0, "unknown" in the ABI.
    fn mem_info(&self) -> (u64, u64) {
        (0, self.dev.global_mem)
    }

    fn max_allocation(&self) -> u64 {
        self.dev.max_alloc
    }

    fn compute_units(&self) -> u32 {
        self.dev.compute_units
    }

    fn memory_kind(&self) -> DeviceMemoryKind {
        self.dev.memory
    }

    fn uuid(&self) -> Option<[u8; 16]> {
        self.dev.uuid
    }

    fn alloc(&self, bytes: u64) -> Result<Mem, AllocError> {
        let max = self.dev.max_alloc;
        if bytes > max {
            return Err(AllocError::OutOfMemory(format!(
                "opencl: larger than the device's largest allocation ({max} bytes)"
            )));
        }
        let size = usize::try_from(bytes.max(1))
            .map_err(|_| AllocError::OutOfMemory("opencl: larger than the address space".into()))?;
        // The new buffer's fill is waited for with `clFinish`, which reports
        // the status of everything queued: what is queued before it is
        // waited for first, so that an earlier command's failure (NVIDIA's
        // driver reports a faulting kernel as CL_OUT_OF_RESOURCES) is a
        // device error, not a lack of memory that the pool would retry.
        cq::finish(self.queue.get()).map_err(|e| {
            AllocError::Failed(format!(
                "opencl: clFinish before an allocation: a command queued earlier failed: {}",
                cl_error(e)
            ))
        })?;
        // SAFETY: a plain device allocation: no host pointer, no host flags.
        let mem = unsafe {
            cl3::memory::create_buffer(
                self.dev.context.get(),
                CL_MEM_READ_WRITE,
                size,
                std::ptr::null_mut(),
            )
        }
        .map_err(|e| alloc_error("clCreateBuffer", e))?;
        // SAFETY: the buffer just created holds `size` bytes.
        if let Err(e) = unsafe { self.fill_zero(mem, 0, size as u64) } {
            // SAFETY: the buffer just created, released once.
            let _ = unsafe { cl3::memory::release_mem_object(mem) };
            return Err(alloc_error("zeroing a new buffer", e));
        }
        Ok(Mem(mem))
    }

    unsafe fn free(&self, buf: Mem) {
        // SAFETY: `buf` came from `alloc` and is released once (the
        // caller's contract).
        let _ = unsafe { cl3::memory::release_mem_object(buf.0) };
    }

    unsafe fn upload(&self, buf: Mem, offset: u64, src: &[u8]) -> Result<(), PluginError> {
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: the range is inside the buffer (the caller's contract);
        // the write is blocking, so `src` outlives it.
        let ev = unsafe {
            cq::enqueue_write_buffer(
                self.queue.get(),
                buf.0,
                CL_BLOCKING,
                offset as usize,
                src.len(),
                src.as_ptr() as *const c_void,
                0,
                std::ptr::null(),
            )
        }
        .map_err(|e| device_error(&format!("copy of {} bytes to the device", src.len()), e))?;
        release(ev);
        Ok(())
    }

    unsafe fn download(&self, buf: Mem, offset: u64, dst: &mut [u8]) -> Result<(), PluginError> {
        if dst.is_empty() {
            return Ok(());
        }
        let bytes = dst.len();
        // SAFETY: as in `upload`, with `dst` a live, writable slice.
        let ev = unsafe {
            cq::enqueue_read_buffer(
                self.queue.get(),
                buf.0,
                CL_BLOCKING,
                offset as usize,
                bytes,
                dst.as_mut_ptr() as *mut c_void,
                0,
                std::ptr::null(),
            )
        }
        .map_err(|e| device_error(&format!("copy of {bytes} bytes to the host"), e))?;
        release(ev);
        Ok(())
    }

    unsafe fn zero(&self, buf: Mem, offset: u64, bytes: u64) -> Result<(), PluginError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the caller's contract.
        unsafe { self.fill_zero(buf.0, offset, bytes) }
            .map_err(|e| device_error(&format!("zeroing {bytes} bytes"), e))
    }

    fn synchronize(&self) -> Result<(), PluginError> {
        cq::finish(self.queue.get()).map_err(|e| device_error("clFinish", e))
    }

    /// `opencl-<source hash>-<hash of device, platform, driver>.bin`;
    /// `None` when `TOAST_OPENCL_CACHE` turns it off (kept beside
    /// `TOAST_KERNEL_CACHE`, which turns off every backend's cache; both
    /// read by `rtc::cache_switch_off`, and checked when the plugin starts).
    fn cache_key(&self, source_hash: &str) -> Option<CacheKey> {
        if rtc::cache_switch_off("TOAST_OPENCL_CACHE").unwrap_or(true) {
            return None;
        }
        let d = &self.dev;
        let key = format!("{}\0{}\0{}", d.name, d.platform, d.driver);
        Some(CacheKey {
            file: format!("opencl-{source_hash}-{:016x}.bin", fnv1a(key.as_bytes())),
            identity: format!(
                "opencl program binary; device {}; platform {}; driver {}",
                d.name, d.platform, d.driver
            ),
        })
    }

    fn compile(&self, source: &str) -> Result<Compiled, CompileError> {
        let (code, log) = self.dev.compile(source)?;
        Ok(Compiled {
            code,
            kind: "program binary",
            log,
        })
    }

    fn load_module(
        &self,
        image: &[u8],
        names: &[&'static str],
    ) -> Result<Vec<ClKernel>, PluginError> {
        self.dev.load(image, names)
    }

    unsafe fn launch(
        &self,
        name: &str,
        kernel: ClKernel,
        grid: Grid,
        params: &[Param<Mem>],
    ) -> Result<(), PluginError> {
        let _serial = self.dev.launch.lock().unwrap_or_else(|e| e.into_inner());
        for (i, p) in params.iter().enumerate() {
            let null: cl_mem = std::ptr::null_mut();
            let (size, value): (usize, *const c_void) = match p {
                Param::I64(v) => (8, v as *const i64 as *const c_void),
                Param::I32(v) => (4, v as *const i32 as *const c_void),
                Param::F64(v) => (8, v as *const f64 as *const c_void),
                Param::Buffer(Some(m)) => (
                    std::mem::size_of::<cl_mem>(),
                    &m.0 as *const cl_mem as *const c_void,
                ),
                // A null memory object: the kernel's pointer is NULL.
                Param::Buffer(None) => (
                    std::mem::size_of::<cl_mem>(),
                    &null as *const cl_mem as *const c_void,
                ),
            };
            // SAFETY: `value` points to `size` bytes of the parameter's type,
            // which follows the kernel's prototype (the caller's contract);
            // the kernel object is ours to set under the launch lock.
            unsafe { cl3::kernel::set_kernel_arg(kernel.raw, i as u32, size, value) }
                .map_err(|e| device_error(&format!("argument {i} of kernel {name}"), e))?;
        }
        let threads = grid.threads as usize;
        let global = [
            grid.blocks.0 as usize * threads,
            grid.blocks.1 as usize,
            grid.blocks.2 as usize,
        ];
        // The global size along dimension 0 is a multiple of `threads`, so
        // it is a valid local size when the kernel allows that many work
        // items in a group; otherwise the implementation picks one.
        let local = [threads, 1, 1];
        let local_ptr = if threads <= kernel.max_local {
            local.as_ptr()
        } else {
            std::ptr::null()
        };
        // SAFETY: every argument is set above; `global` and `local` have 3
        // entries; the buffers are live for the launch (the caller's
        // contract).
        let ev = unsafe {
            cq::enqueue_nd_range_kernel(
                self.queue.get(),
                kernel.raw,
                3,
                std::ptr::null(),
                global.as_ptr(),
                local_ptr,
                0,
                std::ptr::null(),
            )
        }
        .map_err(|e| {
            device_error(
                &format!("launch of kernel {name} on global size {global:?}"),
                e,
            )
        })?;
        release(ev);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;
    use toast_gpu::DeviceChoice;

    /// Two drivers on the default device, or `None` (printing why) where
    /// OpenCL is unavailable and `TOAST_REQUIRE_OPENCL` is unset.
    fn two_drivers() -> Option<(OpenClDriver, OpenClDriver)> {
        let required = std::env::var_os("TOAST_REQUIRE_OPENCL").is_some_and(|v| !v.is_empty());
        match OpenClDriver::open(DeviceChoice::Default) {
            Ok(a) => Some((a, OpenClDriver::open(DeviceChoice::Default).unwrap())),
            Err(e) if e.status == abi::ERR_UNAVAILABLE && !required => {
                println!("SKIPPED: {}", e.message);
                None
            }
            Err(e) => panic!("opening the OpenCL device: {}", e.message),
        }
    }

    /// A context's wait does not wait for another context's commands: with
    /// context A's queue held by a marker on a user event that is not yet
    /// complete, B's `synchronize` returns, and A's returns once the event
    /// completes. With one queue per device (before each context had its
    /// own), B's `clFinish` waited for A's marker, so a failed command of
    /// A's would have been reported by B.
    #[test]
    fn a_context_waits_only_for_its_own_commands() {
        let Some((a, b)) = two_drivers() else { return };
        assert!(Arc::ptr_eq(&a.dev, &b.dev), "one device, shared");
        let gate = cl3::event::create_user_event(a.dev.context.get()).unwrap();
        // SAFETY: `gate` is a live event of the queue's context; the wait
        // list holds that one event.
        let marker = unsafe { cq::enqueue_marker_with_wait_list(a.queue.get(), 1, &gate) }.unwrap();
        let (done, finished) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let r = b.synchronize();
            let _ = done.send(());
            r
        });
        // A hang detector, not a timing: B's wait returns at once or, with
        // a shared queue, never before the gate opens below.
        let b_returned = finished.recv_timeout(Duration::from_secs(60)).is_ok();
        // Open the gate whatever happened, so that nothing is left waiting.
        cl3::event::set_user_event_status(gate, cl3::event::CL_COMPLETE).unwrap();
        waiter.join().unwrap().unwrap();
        a.synchronize().unwrap();
        release(marker);
        // SAFETY: the user event created above, released once.
        let _ = unsafe { cl3::event::release_event(gate) };
        assert!(
            b_returned,
            "context B's wait waited for context A's queued marker"
        );
    }
}
