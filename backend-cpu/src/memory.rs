//! Host memory "device" buffers.
//!
//! A handle is the address of a zeroed, 64-byte aligned allocation. Every
//! live handle is in a registry so that an unknown, foreign or freed handle
//! is refused rather than dereferenced, and so that copies are range-checked.
//! (An address may be reused by a later allocation, after which a stale copy
//! of the old handle names the new buffer: the registry cannot tell them
//! apart, as with any allocator-address handle.)

use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::RwLock;
use toast_accel::abi;
use toast_accel::plugin_support::PluginError;

/// Alignment of every buffer (a cache line, and enough for AVX-512 loads).
pub(crate) const ALIGN: usize = 64;

/// Live buffers: handle (address) to size in bytes.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    live: RwLock<HashMap<u64, u64>>,
}

fn layout(bytes: u64) -> Option<Layout> {
    // A zero-byte buffer still gets a distinct, valid address.
    let size = usize::try_from(bytes.max(1)).ok()?;
    Layout::from_size_align(size, ALIGN).ok()
}

fn unknown(handle: u64) -> PluginError {
    PluginError::invalid_handle(format!(
        "buffer handle 0x{handle:x} is not a live buffer of the cpu backend (never allocated here, or already freed)"
    ))
}

impl Registry {
    /// Allocate `bytes` zeroed bytes.
    pub(crate) fn alloc(&self, bytes: u64, name: &str) -> Result<u64, PluginError> {
        let oom = || {
            PluginError::new(
                abi::ERR_OUT_OF_MEMORY,
                format!("cannot allocate {bytes} bytes for buffer `{name}`"),
            )
        };
        let layout = layout(bytes).ok_or_else(oom)?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(oom());
        }
        let handle = p as u64;
        self.live
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(handle, bytes);
        Ok(handle)
    }

    /// Free a live buffer.
    pub(crate) fn free(&self, handle: u64) -> Result<(), PluginError> {
        let bytes = self
            .live
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle)
            .ok_or_else(|| unknown(handle))?;
        let layout = layout(bytes).expect("layout was valid at allocation");
        // SAFETY: `handle` came from `alloc_zeroed` with this layout and was
        // live until we removed it from the registry just now.
        unsafe { std::alloc::dealloc(handle as *mut u8, layout) };
        Ok(())
    }

    /// Run `f` on the bytes `[offset, offset + bytes)` of a live buffer,
    /// holding the registry so the buffer cannot be freed meanwhile.
    fn with_range<R>(
        &self,
        op: &str,
        handle: u64,
        offset: u64,
        bytes: u64,
        f: impl FnOnce(*mut u8) -> R,
    ) -> Result<R, PluginError> {
        let live = self.live.read().unwrap_or_else(|e| e.into_inner());
        let &size = live.get(&handle).ok_or_else(|| unknown(handle))?;
        if offset.checked_add(bytes).is_none_or(|end| end > size) {
            return Err(PluginError::invalid(format!(
                "{op}: range of {bytes} bytes at offset {offset} is outside buffer 0x{handle:x} of {size} bytes"
            )));
        }
        // SAFETY: offset <= size, inside the live allocation.
        Ok(f(unsafe { (handle as *mut u8).add(offset as usize) }))
    }

    pub(crate) fn copy_to_device(
        &self,
        handle: u64,
        offset: u64,
        src: *const u8,
        bytes: u64,
    ) -> Result<(), PluginError> {
        if bytes > 0 && src.is_null() {
            return Err(PluginError::invalid("copy_to_device: null source"));
        }
        self.with_range("copy_to_device", handle, offset, bytes, |dst| {
            if bytes > 0 {
                // SAFETY: dst has `bytes` bytes inside the buffer (checked);
                // src has `bytes` readable bytes by the ABI; `copy` tolerates
                // a source that overlaps the buffer.
                unsafe { std::ptr::copy(src, dst, bytes as usize) };
            }
        })
    }

    pub(crate) fn copy_to_host(
        &self,
        handle: u64,
        offset: u64,
        dst: *mut u8,
        bytes: u64,
    ) -> Result<(), PluginError> {
        if bytes > 0 && dst.is_null() {
            return Err(PluginError::invalid("copy_to_host: null destination"));
        }
        self.with_range("copy_to_host", handle, offset, bytes, |src| {
            if bytes > 0 {
                // SAFETY: src has `bytes` bytes inside the buffer (checked);
                // dst has `bytes` writable bytes by the ABI; `copy` tolerates overlap.
                unsafe { std::ptr::copy(src, dst, bytes as usize) };
            }
        })
    }

    pub(crate) fn reset(&self, handle: u64, offset: u64, bytes: u64) -> Result<(), PluginError> {
        self.with_range("reset", handle, offset, bytes, |p| {
            // SAFETY: `bytes` bytes inside the live buffer (checked).
            unsafe { std::ptr::write_bytes(p, 0, bytes as usize) };
        })
    }

    /// Free every buffer still live (at shutdown).
    pub(crate) fn free_all(&self) {
        let mut live = self.live.write().unwrap_or_else(|e| e.into_inner());
        for (handle, bytes) in live.drain() {
            let layout = layout(bytes).expect("layout was valid at allocation");
            // SAFETY: every registered handle is a live allocation with this layout.
            unsafe { std::alloc::dealloc(handle as *mut u8, layout) };
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.free_all();
    }
}
