//! Device buffers behind a handle table.
//!
//! A handle is `HANDLE_TAG | id` with `id` a counter that never repeats, so
//! a handle that was never returned by this backend (another backend's, or
//! a made-up one) or one already freed is not in the table and is refused
//! with `ERR_INVALID_HANDLE`; copies and resets are range-checked.

use crate::context::{cl_error, Device};
use opencl3::memory::{Buffer, ClMem, CL_MEM_READ_WRITE};
use opencl3::types::{cl_mem, CL_BLOCKING};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use toast_accel::abi;
use toast_accel::plugin_support::PluginError;

/// The high bits of every handle of this backend ("OCL" in ASCII).
const HANDLE_TAG: u64 = 0x004f_434c_0000_0000;

#[derive(Debug)]
struct Entry {
    buf: Buffer<u8>,
    bytes: u64,
    name: String,
}

/// Live buffers: handle to buffer.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    live: Mutex<HashMap<u64, Entry>>,
    next: AtomicU64,
}

fn unknown(handle: u64) -> PluginError {
    PluginError::invalid_handle(format!(
        "buffer handle 0x{handle:x} is not a live buffer of the opencl backend (never allocated here, or already freed)"
    ))
}

/// Check `[offset, offset + bytes)` lies inside a buffer of `size` bytes.
fn range(what: &str, e: &Entry, offset: u64, bytes: u64) -> Result<(), PluginError> {
    match offset.checked_add(bytes) {
        Some(end) if end <= e.bytes => Ok(()),
        _ => Err(PluginError::invalid(format!(
            "{what}: range [{offset}, {offset} + {bytes}) is outside buffer `{}` of {} bytes",
            e.name, e.bytes
        ))),
    }
}

impl Registry {
    /// Allocate `bytes` zeroed bytes on the device.
    pub(crate) fn alloc(&self, dev: &Device, bytes: u64, name: &str) -> Result<u64, PluginError> {
        let oom = |why: String| {
            PluginError::new(
                abi::ERR_OUT_OF_MEMORY,
                format!(
                    "cannot allocate {bytes} bytes for buffer `{name}` on OpenCL device {}: {why}",
                    dev.name
                ),
            )
        };
        if bytes > dev.max_alloc {
            return Err(oom(format!(
                "larger than the device's largest allocation ({} bytes)",
                dev.max_alloc
            )));
        }
        let size = usize::try_from(bytes.max(1)).map_err(|_| oom("too large".into()))?;
        // SAFETY: a plain device allocation, no host pointer.
        let mut buf = unsafe {
            Buffer::<u8>::create(&dev.context, CL_MEM_READ_WRITE, size, std::ptr::null_mut())
        }
        .map_err(|e| oom(cl_error(e)))?;
        // Zero it, as the CPU backend's buffers are.
        // SAFETY: the fill covers the buffer exactly; blocking via finish.
        unsafe {
            dev.queue
                .enqueue_fill_buffer(&mut buf, &[0u8], 0, size, &[])
        }
        .and_then(|_| dev.queue.finish())
        .map_err(|e| oom(format!("zeroing failed: {}", cl_error(e))))?;
        let handle = HANDLE_TAG | (self.next.fetch_add(1, Ordering::Relaxed) + 1);
        self.lock().insert(
            handle,
            Entry {
                buf,
                bytes,
                name: name.to_string(),
            },
        );
        Ok(handle)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Free a live buffer.
    pub(crate) fn free(&self, handle: u64) -> Result<(), PluginError> {
        self.lock()
            .remove(&handle)
            .map(drop)
            .ok_or_else(|| unknown(handle))
    }

    /// The OpenCL memory object and size of a live buffer.
    pub(crate) fn mem(&self, handle: u64) -> Result<(cl_mem, u64), PluginError> {
        let live = self.lock();
        let e = live.get(&handle).ok_or_else(|| unknown(handle))?;
        Ok((e.buf.get(), e.bytes))
    }

    /// Copy `bytes` host bytes at `src` to `offset` in the buffer.
    ///
    /// # Safety
    /// `src` is valid for `bytes` bytes.
    pub(crate) unsafe fn copy_to_device(
        &self,
        dev: &Device,
        handle: u64,
        offset: u64,
        src: *const u8,
        bytes: u64,
    ) -> Result<(), PluginError> {
        let mut live = self.lock();
        let e = live.get_mut(&handle).ok_or_else(|| unknown(handle))?;
        range("copy_to_device", e, offset, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        if src.is_null() {
            return Err(PluginError::invalid("copy_to_device: null source pointer"));
        }
        // SAFETY: valid for `bytes` bytes by the caller's contract.
        let data = unsafe { std::slice::from_raw_parts(src, bytes as usize) };
        // SAFETY: the range is inside the buffer; the write is blocking.
        unsafe {
            dev.queue
                .enqueue_write_buffer(&mut e.buf, CL_BLOCKING, offset as usize, data, &[])
        }
        .map_err(|err| dev_err(&format!("copy_to_device into `{}`", e.name), bytes, err))?;
        Ok(())
    }

    /// Copy `bytes` bytes at `offset` of the buffer to host `dst`.
    ///
    /// # Safety
    /// `dst` is valid for writes of `bytes` bytes.
    pub(crate) unsafe fn copy_to_host(
        &self,
        dev: &Device,
        handle: u64,
        offset: u64,
        dst: *mut u8,
        bytes: u64,
    ) -> Result<(), PluginError> {
        let live = self.lock();
        let e = live.get(&handle).ok_or_else(|| unknown(handle))?;
        range("copy_to_host", e, offset, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        if dst.is_null() {
            return Err(PluginError::invalid(
                "copy_to_host: null destination pointer",
            ));
        }
        // SAFETY: valid for `bytes` bytes by the caller's contract.
        let data = unsafe { std::slice::from_raw_parts_mut(dst, bytes as usize) };
        // SAFETY: the range is inside the buffer; the read is blocking.
        unsafe {
            dev.queue
                .enqueue_read_buffer(&e.buf, CL_BLOCKING, offset as usize, data, &[])
        }
        .map_err(|err| dev_err(&format!("copy_to_host from `{}`", e.name), bytes, err))?;
        Ok(())
    }

    /// Zero `bytes` bytes at `offset`.
    pub(crate) fn reset(
        &self,
        dev: &Device,
        handle: u64,
        offset: u64,
        bytes: u64,
    ) -> Result<(), PluginError> {
        let mut live = self.lock();
        let e = live.get_mut(&handle).ok_or_else(|| unknown(handle))?;
        range("reset", e, offset, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the range is inside the buffer; finished before returning.
        unsafe {
            dev.queue
                .enqueue_fill_buffer(&mut e.buf, &[0u8], offset as usize, bytes as usize, &[])
        }
        .and_then(|_| dev.queue.finish())
        .map_err(|err| dev_err(&format!("reset of `{}`", e.name), bytes, err))?;
        Ok(())
    }
}

fn dev_err(what: &str, bytes: u64, e: opencl3::error_codes::ClError) -> PluginError {
    PluginError::new(
        abi::ERR_DEVICE,
        format!("{what} ({bytes} bytes) failed: {}", cl_error(e)),
    )
}
