//! Device buffers: a handle table over a size-class memory pool.
//!
//! This file is compiled into both `backend-cuda` and `backend-hip` (each
//! includes it with `#[path]`); the backend's name and handle tag come from
//! that crate's root (`crate::BACKEND_NAME`, `crate::HANDLE_TAG`).
//!
//! # Handles
//!
//! A handle is never a device address: it is `HANDLE_TAG | n` with `n` a
//! counter that is never reused. The tag differs per backend (and CPU
//! handles are host addresses, below 2^47), so a handle from another
//! backend, a made-up number, or a handle already freed is not in the table
//! and is refused with `ERR_INVALID_HANDLE`, never dereferenced.
//!
//! # The pool
//!
//! The drivers' allocation calls (`cuMemAlloc`/`cuMemFree`, `hipMalloc`/`hipFree`) synchronise the device and cost tens of
//! microseconds; TOAST's OpenMP-offload port needed a pool for the same
//! reason. A request is rounded up to a size class (at least 256 bytes,
//! then powers of two up to 64 MiB, then multiples of 2 MiB) and served
//! from the free list of that class when one is there. `free` returns the
//! block to its list rather than to the driver while the cached total stays
//! under a cap (a quarter of device memory); above it the block is released.
//! When the driver reports out of memory, every cached block is released and
//! the allocation retried once; a second failure is `ERR_OUT_OF_MEMORY`
//! naming the buffer, its size and what is live. Every buffer is zeroed on
//! allocation, as the CPU backend's are.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use toast_accel::abi;
use toast_accel::plugin::PluginError;

pub(crate) use crate::HANDLE_TAG;
const BACKEND: &str = crate::BACKEND_NAME;

/// What the pool needs from the device.
pub(crate) trait DeviceAlloc {
    /// Allocate `bytes`; `Err((out_of_memory, message))` on failure.
    fn raw_alloc(&self, bytes: u64) -> Result<u64, (bool, String)>;
    /// Release a block of `raw_alloc`.
    fn raw_free(&self, ptr: u64);
    /// Zero `bytes` bytes at device address `ptr`.
    fn raw_zero(&self, ptr: u64, bytes: u64) -> Result<(), PluginError>;
}

#[derive(Debug)]
struct Block {
    ptr: u64,
    bytes: u64,
    class: u64,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    live: HashMap<u64, Block>,
    live_bytes: u64,
    free: BTreeMap<u64, Vec<u64>>,
    cached_bytes: u64,
}

/// The handle table and the pool.
#[derive(Debug)]
pub(crate) struct Memory {
    inner: Mutex<Inner>,
    cache_cap: u64,
}

/// The size class of a request of `bytes`.
pub(crate) fn size_class(bytes: u64) -> u64 {
    const MIN: u64 = 256;
    const POW2_MAX: u64 = 64 << 20;
    const STEP: u64 = 2 << 20;
    if bytes <= MIN {
        MIN
    } else if bytes <= POW2_MAX {
        bytes.next_power_of_two()
    } else {
        bytes.div_ceil(STEP).saturating_mul(STEP)
    }
}

fn unknown(handle: u64) -> PluginError {
    PluginError::invalid_handle(format!(
        "buffer handle 0x{handle:x} is not a live buffer of the {BACKEND} backend (never allocated here, or already freed)"
    ))
}

impl Memory {
    /// A pool that caches at most `cache_cap` bytes of freed blocks.
    pub(crate) fn new(cache_cap: u64) -> Self {
        Memory {
            inner: Mutex::new(Inner::default()),
            cache_cap,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocate a zeroed buffer of `bytes` bytes named `name`.
    pub(crate) fn alloc(
        &self,
        dev: &impl DeviceAlloc,
        bytes: u64,
        name: &str,
    ) -> Result<u64, PluginError> {
        let class = size_class(bytes);
        let mut g = self.lock();
        let reused = g.free.get_mut(&class).and_then(Vec::pop);
        let ptr = match reused {
            Some(p) => {
                g.cached_bytes -= class;
                p
            }
            None => {
                match dev.raw_alloc(class) {
                    Ok(p) => p,
                    Err((true, _)) => {
                        // Give the cached blocks back to the driver and retry once.
                        for (_, ptrs) in std::mem::take(&mut g.free) {
                            for p in ptrs {
                                dev.raw_free(p);
                            }
                        }
                        g.cached_bytes = 0;
                        dev.raw_alloc(class).map_err(|(oom, msg)| {
                        PluginError::new(
                            if oom { abi::ERR_OUT_OF_MEMORY } else { abi::ERR_DEVICE },
                            format!(
                                "{BACKEND}: cannot allocate {bytes} bytes for buffer `{name}`: {msg} ({} bytes live in {} buffers)",
                                g.live_bytes,
                                g.live.len()
                            ),
                        )
                    })?
                    }
                    Err((false, msg)) => {
                        return Err(PluginError::new(
                            abi::ERR_DEVICE,
                            format!(
                            "{BACKEND}: cannot allocate {bytes} bytes for buffer `{name}`: {msg}"
                        ),
                        ))
                    }
                }
            }
        };
        if let Err(e) = dev.raw_zero(ptr, class) {
            dev.raw_free(ptr);
            return Err(e);
        }
        g.next += 1;
        let handle = HANDLE_TAG | g.next;
        g.live_bytes += bytes;
        g.live.insert(handle, Block { ptr, bytes, class });
        Ok(handle)
    }

    /// Return a buffer to the pool.
    pub(crate) fn free(&self, dev: &impl DeviceAlloc, handle: u64) -> Result<(), PluginError> {
        let mut g = self.lock();
        let b = g.live.remove(&handle).ok_or_else(|| unknown(handle))?;
        g.live_bytes -= b.bytes;
        if g.cached_bytes + b.class <= self.cache_cap {
            g.cached_bytes += b.class;
            g.free.entry(b.class).or_default().push(b.ptr);
        } else {
            dev.raw_free(b.ptr);
        }
        Ok(())
    }

    /// The device address of `[offset, offset + bytes)` of a live buffer.
    pub(crate) fn range(
        &self,
        op: &str,
        handle: u64,
        offset: u64,
        bytes: u64,
    ) -> Result<u64, PluginError> {
        let g = self.lock();
        let b = g.live.get(&handle).ok_or_else(|| unknown(handle))?;
        if offset.checked_add(bytes).is_none_or(|end| end > b.bytes) {
            return Err(PluginError::invalid(format!(
                "{op}: range of {bytes} bytes at offset {offset} is outside buffer 0x{handle:x} of {} bytes",
                b.bytes
            )));
        }
        Ok(b.ptr + offset)
    }

    /// The device address of a kernel array argument of `len` elements of
    /// `elem` bytes (0 when the array is absent, `len == 0`).
    pub(crate) fn array(
        &self,
        kernel: &str,
        arg: &str,
        a: abi::Array,
        elem: u64,
    ) -> Result<u64, PluginError> {
        if a.len == 0 {
            return Ok(0);
        }
        let g = self.lock();
        let b = g.live.get(&a.ptr).ok_or_else(|| {
            PluginError::invalid_handle(format!(
                "{kernel}: array `{arg}`: buffer handle 0x{:x} is not a live buffer of the {BACKEND} backend (never allocated here, or already freed)",
                a.ptr
            ))
        })?;
        let need = a.len.saturating_mul(elem);
        if need > b.bytes {
            return Err(PluginError::invalid(format!(
                "{kernel}: array `{arg}` of {} elements ({need} bytes) exceeds its buffer of {} bytes",
                a.len, b.bytes
            )));
        }
        Ok(b.ptr)
    }

    /// Release every block, live or cached (at shutdown).
    pub(crate) fn release_all(&self, dev: &impl DeviceAlloc) {
        let mut g = self.lock();
        for (_, b) in g.live.drain() {
            dev.raw_free(b.ptr);
        }
        for (_, ptrs) in std::mem::take(&mut g.free) {
            for p in ptrs {
                dev.raw_free(p);
            }
        }
        g.live_bytes = 0;
        g.cached_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A fake device with a byte budget.
    struct Fake {
        next: RefCell<u64>,
        used: RefCell<u64>,
        budget: u64,
        sizes: RefCell<HashMap<u64, u64>>,
    }
    impl DeviceAlloc for Fake {
        fn raw_alloc(&self, bytes: u64) -> Result<u64, (bool, String)> {
            if *self.used.borrow() + bytes > self.budget {
                return Err((true, "out of memory".into()));
            }
            *self.used.borrow_mut() += bytes;
            let mut n = self.next.borrow_mut();
            *n += 1 << 20;
            self.sizes.borrow_mut().insert(*n, bytes);
            Ok(*n)
        }
        fn raw_free(&self, ptr: u64) {
            let b = self.sizes.borrow_mut().remove(&ptr).unwrap();
            *self.used.borrow_mut() -= b;
        }
        fn raw_zero(&self, _ptr: u64, _bytes: u64) -> Result<(), PluginError> {
            Ok(())
        }
    }
    fn fake(budget: u64) -> Fake {
        Fake {
            next: RefCell::new(0),
            used: RefCell::new(0),
            budget,
            sizes: RefCell::new(HashMap::new()),
        }
    }

    #[test]
    fn classes() {
        assert_eq!(size_class(0), 256);
        assert_eq!(size_class(257), 512);
        assert_eq!(size_class(64 << 20), 64 << 20);
        assert_eq!(size_class((64 << 20) + 1), (66 << 20));
    }

    #[test]
    fn reuse_and_handles() {
        let d = fake(1 << 20);
        let m = Memory::new(1 << 20);
        let h = m.alloc(&d, 1000, "a").unwrap();
        let p = m.range("t", h, 0, 1000).unwrap();
        assert!(m.range("t", h, 1, 1000).is_err());
        m.free(&d, h).unwrap();
        assert_eq!(m.free(&d, h).unwrap_err().status, abi::ERR_INVALID_HANDLE);
        assert_eq!(
            m.range("t", 0x1234, 0, 0).unwrap_err().status,
            abi::ERR_INVALID_HANDLE
        );
        let h2 = m.alloc(&d, 900, "b").unwrap();
        assert_ne!(h, h2, "handles are never reused");
        assert_eq!(
            m.range("t", h2, 0, 0).unwrap(),
            p,
            "block reused from the pool"
        );
        m.release_all(&d);
        assert_eq!(*d.used.borrow(), 0);
    }

    #[test]
    fn out_of_memory_names_buffer() {
        let d = fake(4096);
        let m = Memory::new(1 << 20);
        let a = m.alloc(&d, 2048, "a").unwrap();
        m.free(&d, a).unwrap();
        // The cached 2048-byte block is released to make room.
        let b = m.alloc(&d, 4000, "big").unwrap();
        let e = m.alloc(&d, 100, "signal").unwrap_err();
        assert_eq!(e.status, abi::ERR_OUT_OF_MEMORY);
        assert!(
            e.message.contains("`signal`") && e.message.contains("100 bytes"),
            "{}",
            e.message
        );
        m.free(&d, b).unwrap();
        m.release_all(&d);
    }
}
