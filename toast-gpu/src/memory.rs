//! Device buffers: a handle table over a size-class memory pool, generic
//! over the buffer type of a [`Driver`]; the backend's name
//! and handle tag are the driver's `NAME` and `HANDLE_TAG`.
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
//! The drivers' allocation calls (`cuMemAlloc`/`cuMemFree`,
//! `hipMalloc`/`hipFree`) synchronise the device and cost tens of
//! microseconds; TOAST's OpenMP-offload port needed a pool for the same
//! reason. A request is rounded up to a size class (at least 256 bytes,
//! then powers of two up to 1 MiB, then multiples of 1 MiB: at most 1 MiB
//! above the request beyond it, so that the budget holds the buffers a run
//! sizes to it, not up to twice them as power-of-two classes of tens of
//! MiB did; a run's large buffers repeat their sizes, so they are still
//! reused) and served
//! from the free list of that class when one is there. `free` returns the
//! block to its list rather than to the driver while the cached total stays
//! under a cap (a quarter of device memory); above it the block is released.
//! When the driver reports out of memory, every cached block is released and
//! the allocation retried once; a second failure is `ERR_OUT_OF_MEMORY`
//! naming the buffer, its size and what is live. Every buffer is zeroed on
//! allocation, as the CPU backend's are (by the pool, or by the driver when
//! it zeroes fresh allocations itself: `Driver::ZEROES_ON_ALLOC`). A size
//! class is never larger than the driver's `max_allocation` (nor smaller
//! than the request: one above the maximum goes to the driver, which
//! refuses it).
//!
//! # The budget
//!
//! The device memory the pool holds (live blocks and cached ones, in size
//! classes) never exceeds a [`Budget`]: the plugin option `memory=GiB`, else
//! TOAST's `TOAST_GPU_MEM_GB`, else 90% of the device memory free when the
//! context was created (of the total, where the API cannot tell the free
//! memory). An allocation that would pass it first releases the cached
//! blocks, then is refused with `ERR_OUT_OF_MEMORY` naming the budget and
//! where it came from, before the driver is asked: a run sized to a budget
//! fails the same way on a card of any size. A request whose size class
//! would pass the budget but whose own bytes fit gets a block of its own
//! size (the live blocks keep their classes: many small buffers may still
//! be refused before their requested bytes reach the budget).

use crate::driver::{AllocError, Driver};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use toast_accel::abi;
pub use toast_accel::budget::{Budget, BudgetSource};
use toast_accel::plugin_support::PluginError;

/// What an out-of-memory error adds: what lowers the need. The device
/// memory a run needs grows with the detector data each process holds, so
/// fewer detectors per process lower it.
const OUT_OF_MEMORY_HINT: &str = "; to need less device memory, run fewer detectors per \
    process (toast-cli run --n-det, a smaller --case, or more processes per group with \
    --group-size), or run on the cpu backend";

/// What the pool needs from the device: a narrower view of [`Driver`]
/// (every driver is one), which the tests implement with a fake device.
pub(crate) trait DeviceAlloc {
    /// A device allocation.
    type Buffer: Copy;
    /// Allocate `bytes` bytes.
    fn raw_alloc(&self, bytes: u64) -> Result<Self::Buffer, AllocError>;
    /// Release a block of `raw_alloc`.
    ///
    /// # Safety
    /// `buf` came from `raw_alloc` and is released once.
    unsafe fn raw_free(&self, buf: Self::Buffer);
    /// Zero the first `bytes` bytes of `buf`.
    ///
    /// # Safety
    /// `buf` is a live block of at least `bytes` bytes.
    unsafe fn raw_zero(&self, buf: Self::Buffer, bytes: u64) -> Result<(), PluginError>;
    /// Whether `raw_alloc` returns zeroed blocks (`Driver::ZEROES_ON_ALLOC`).
    fn zeroes_on_alloc(&self) -> bool {
        false
    }
    /// The largest block `raw_alloc` can return (`Driver::max_allocation`).
    fn max_block(&self) -> u64 {
        u64::MAX
    }
    /// Free and total device memory in bytes (`Driver::mem_info`; 0 free:
    /// unknown), for out-of-memory messages.
    fn free_and_total(&self) -> (u64, u64) {
        (0, 0)
    }
}

impl<D: Driver> DeviceAlloc for D {
    type Buffer = D::Buffer;
    fn raw_alloc(&self, bytes: u64) -> Result<D::Buffer, AllocError> {
        self.alloc(bytes)
    }
    unsafe fn raw_free(&self, buf: D::Buffer) {
        // SAFETY: the caller's contract is `Driver::free`'s.
        unsafe { self.free(buf) }
    }
    unsafe fn raw_zero(&self, buf: D::Buffer, bytes: u64) -> Result<(), PluginError> {
        // SAFETY: the caller's contract is `Driver::zero`'s at offset 0.
        unsafe { self.zero(buf, 0, bytes) }
    }
    fn zeroes_on_alloc(&self) -> bool {
        D::ZEROES_ON_ALLOC
    }
    fn max_block(&self) -> u64 {
        self.max_allocation()
    }
    fn free_and_total(&self) -> (u64, u64) {
        self.mem_info()
    }
}

#[derive(Debug)]
struct Block<B> {
    buf: B,
    bytes: u64,
    class: u64,
    /// The name `alloc` was given, for messages.
    name: String,
}

#[derive(Debug)]
struct Inner<B> {
    next: u64,
    live: HashMap<u64, Block<B>>,
    live_bytes: u64,
    /// The size classes of the live blocks: device memory they hold.
    live_class_bytes: u64,
    /// The most device memory the pool held at once (live and cached).
    peak_held: u64,
    free: BTreeMap<u64, Vec<B>>,
    cached_bytes: u64,
}

/// The handle table and the pool of one backend.
#[derive(Debug)]
pub struct Memory<B> {
    inner: Mutex<Inner<B>>,
    backend: &'static str,
    tag: u64,
    cache_cap: u64,
    budget: Budget,
}

/// The size class of a request of `bytes`.
pub fn size_class(bytes: u64) -> u64 {
    const MIN: u64 = 256;
    const POW2_MAX: u64 = 1 << 20;
    const STEP: u64 = 1 << 20;
    if bytes <= MIN {
        MIN
    } else if bytes <= POW2_MAX {
        bytes.next_power_of_two()
    } else {
        bytes.div_ceil(STEP).saturating_mul(STEP)
    }
}

impl<B: Copy> Memory<B> {
    /// An empty table of the backend `backend`, whose handles carry `tag`,
    /// caching at most `cache_cap` bytes of freed blocks and holding at
    /// most `budget` of device memory.
    pub(crate) fn new(backend: &'static str, tag: u64, cache_cap: u64, budget: Budget) -> Self {
        Memory {
            inner: Mutex::new(Inner {
                next: 0,
                live: HashMap::new(),
                live_bytes: 0,
                live_class_bytes: 0,
                peak_held: 0,
                free: BTreeMap::new(),
                cached_bytes: 0,
            }),
            backend,
            tag,
            cache_cap: cache_cap.min(budget.bytes),
            budget,
        }
    }

    /// The budget.
    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// The most device memory the pool held at once so far (live and
    /// cached blocks), in bytes.
    pub fn peak_held(&self) -> u64 {
        self.lock().peak_held
    }

    /// The budget's bytes that no live block holds (cached blocks are
    /// released for a request that needs their room).
    pub fn room(&self) -> u64 {
        self.budget
            .bytes
            .saturating_sub(self.lock().live_class_bytes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<B>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn unknown(&self, handle: u64) -> PluginError {
        PluginError::invalid_handle(format!(
            "buffer handle 0x{handle:x} is not a live buffer of the {} backend (never allocated here, or already freed)",
            self.backend
        ))
    }

    /// Allocate a zeroed buffer of `bytes` bytes named `name`.
    pub(crate) fn alloc(
        &self,
        dev: &impl DeviceAlloc<Buffer = B>,
        bytes: u64,
        name: &str,
    ) -> Result<u64, PluginError> {
        let backend = self.backend;
        let mut g = self.lock();
        let rounded = size_class(bytes).min(dev.max_block()).max(bytes);
        // A request the budget holds is never refused for its rounding: it
        // then takes a block of its own size (cached under it, as a class).
        let class = if bytes > 0
            && g.live_class_bytes + rounded > self.budget.bytes
            && g.live_class_bytes + bytes <= self.budget.bytes
        {
            bytes
        } else {
            rounded
        };
        let reused = g.free.get_mut(&class).and_then(Vec::pop);
        let zero = reused.is_some() || !dev.zeroes_on_alloc();
        if reused.is_none() && g.live_class_bytes + g.cached_bytes + class > self.budget.bytes {
            // Within the budget only without the cached blocks: release them.
            for (_, bufs) in std::mem::take(&mut g.free) {
                for b in bufs {
                    // SAFETY: a cached block of `raw_alloc`, in no list any
                    // more: released once.
                    unsafe { dev.raw_free(b) };
                }
            }
            g.cached_bytes = 0;
            if g.live_class_bytes + class > self.budget.bytes {
                let (free, total) = dev.free_and_total();
                return Err(PluginError::new(
                    abi::ERR_OUT_OF_MEMORY,
                    format!(
                        "{backend}: cannot allocate {bytes} bytes for buffer `{name}`: out of the \
                         device memory budget of {} ({} bytes held in {} buffers; device memory: \
                         {} bytes free of {total}){OUT_OF_MEMORY_HINT}, or raise the budget \
                         (--backend-options {backend}:memory=GiB, or TOAST_GPU_MEM_GB)",
                        self.budget,
                        g.live_class_bytes,
                        g.live.len(),
                        if free == 0 && total > 0 {
                            "unknown".to_string()
                        } else {
                            free.to_string()
                        },
                    ),
                ));
            }
        }
        let buf = match reused {
            Some(b) => {
                g.cached_bytes -= class;
                b
            }
            None => match dev.raw_alloc(class) {
                Ok(b) => b,
                Err(AllocError::OutOfMemory(_)) => {
                    // Give the cached blocks back to the driver and retry once.
                    for (_, bufs) in std::mem::take(&mut g.free) {
                        for b in bufs {
                            // SAFETY: a cached block of `raw_alloc`, in no
                            // list any more: released once.
                            unsafe { dev.raw_free(b) };
                        }
                    }
                    g.cached_bytes = 0;
                    dev.raw_alloc(class).map_err(|e| {
                        let (status, hint) = match e {
                            AllocError::OutOfMemory(_) => {
                                (abi::ERR_OUT_OF_MEMORY, OUT_OF_MEMORY_HINT)
                            }
                            AllocError::Failed(_) => (abi::ERR_DEVICE, ""),
                        };
                        let (free, total) = dev.free_and_total();
                        let free = if free == 0 && total > 0 {
                            "unknown".to_string()
                        } else {
                            free.to_string()
                        };
                        PluginError::new(
                            status,
                            format!(
                                "{backend}: cannot allocate {bytes} bytes for buffer `{name}`: {} \
                                 (device memory: {free} bytes free of {total}; {} bytes live in {} \
                                 buffers){hint}",
                                e.message(),
                                g.live_bytes,
                                g.live.len()
                            ),
                        )
                    })?
                }
                Err(AllocError::Failed(msg)) => {
                    return Err(PluginError::new(
                        abi::ERR_DEVICE,
                        format!(
                            "{backend}: cannot allocate {bytes} bytes for buffer `{name}`: {msg}"
                        ),
                    ))
                }
            },
        };
        if zero {
            // SAFETY: `buf` is a block of `class` bytes that no handle names.
            if let Err(e) = unsafe { dev.raw_zero(buf, class) } {
                // SAFETY: `buf` came from `raw_alloc` (fresh, or a cached block popped
                // from its list) and no handle names it; it is released once, here,
                // and not used after.
                unsafe { dev.raw_free(buf) };
                return Err(e);
            }
        }
        g.next += 1;
        let handle = self.tag | g.next;
        g.live_bytes += bytes;
        g.live_class_bytes += class;
        g.peak_held = g.peak_held.max(g.live_class_bytes + g.cached_bytes);
        g.live.insert(
            handle,
            Block {
                buf,
                bytes,
                class,
                name: name.to_string(),
            },
        );
        Ok(handle)
    }

    /// Return a buffer to the pool.
    pub(crate) fn free(
        &self,
        dev: &impl DeviceAlloc<Buffer = B>,
        handle: u64,
    ) -> Result<(), PluginError> {
        let mut g = self.lock();
        let b = g.live.remove(&handle).ok_or_else(|| self.unknown(handle))?;
        g.live_bytes -= b.bytes;
        g.live_class_bytes -= b.class;
        if g.cached_bytes + b.class <= self.cache_cap {
            g.cached_bytes += b.class;
            g.free.entry(b.class).or_default().push(b.buf);
        } else {
            // SAFETY: the block of a handle just removed from the table.
            unsafe { dev.raw_free(b.buf) };
        }
        Ok(())
    }

    /// The buffer and offset of `[offset, offset + bytes)` of a live buffer.
    pub(crate) fn range(
        &self,
        op: &str,
        handle: u64,
        offset: u64,
        bytes: u64,
    ) -> Result<(B, u64), PluginError> {
        let g = self.lock();
        let b = g.live.get(&handle).ok_or_else(|| self.unknown(handle))?;
        if offset.checked_add(bytes).is_none_or(|end| end > b.bytes) {
            return Err(PluginError::invalid(format!(
                "{op}: range of {bytes} bytes at offset {offset} is outside buffer `{}` (0x{handle:x}) of {} bytes",
                b.name, b.bytes
            )));
        }
        Ok((b.buf, offset))
    }

    /// The buffer of a kernel array argument of `len` elements of `elem`
    /// bytes (`None` when the array is absent, `len == 0`).
    pub(crate) fn array(
        &self,
        kernel: &str,
        arg: &str,
        a: abi::Array,
        elem: u64,
    ) -> Result<Option<B>, PluginError> {
        if a.len == 0 {
            return Ok(None);
        }
        let g = self.lock();
        let b = g.live.get(&a.ptr).ok_or_else(|| {
            PluginError::invalid_handle(format!(
                "{kernel}: array `{arg}`: buffer handle 0x{:x} is not a live buffer of the {} backend (never allocated here, or already freed)",
                a.ptr, self.backend
            ))
        })?;
        let need = a.len.saturating_mul(elem);
        if need > b.bytes {
            return Err(PluginError::invalid(format!(
                "{kernel}: array `{arg}` of {} elements ({need} bytes) exceeds its buffer `{}` of {} bytes",
                a.len, b.name, b.bytes
            )));
        }
        Ok(Some(b.buf))
    }

    /// Release every block, live or cached (at shutdown).
    pub(crate) fn release_all(&self, dev: &impl DeviceAlloc<Buffer = B>) {
        let mut g = self.lock();
        for (_, b) in g.live.drain() {
            // SAFETY: the host is shutting the backend down: no handle is
            // used after this, and each block is released once.
            unsafe { dev.raw_free(b.buf) };
        }
        for (_, bufs) in std::mem::take(&mut g.free) {
            for b in bufs {
                // SAFETY: a cached block, released once.
                unsafe { dev.raw_free(b) };
            }
        }
        g.live_bytes = 0;
        g.live_class_bytes = 0;
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
        type Buffer = u64;
        fn raw_alloc(&self, bytes: u64) -> Result<u64, AllocError> {
            if *self.used.borrow() + bytes > self.budget {
                return Err(AllocError::OutOfMemory("out of memory".into()));
            }
            *self.used.borrow_mut() += bytes;
            let mut n = self.next.borrow_mut();
            *n += 1 << 20;
            self.sizes.borrow_mut().insert(*n, bytes);
            Ok(*n)
        }
        unsafe fn raw_free(&self, ptr: u64) {
            let b = self.sizes.borrow_mut().remove(&ptr).unwrap();
            *self.used.borrow_mut() -= b;
        }
        unsafe fn raw_zero(&self, _ptr: u64, _bytes: u64) -> Result<(), PluginError> {
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

    const TAG: u64 = 0xC0DA_u64 << 48;

    #[test]
    fn the_budget_is_never_passed_and_its_refusal_names_it() {
        let d = fake(1 << 30);
        let budget = Budget::parse_gib("0.001", BudgetSource::Option).unwrap();
        assert_eq!(budget.bytes, 1_073_741);
        let m = Memory::new("test", TAG, 1 << 30, budget);
        let a = m.alloc(&d, 512 << 10, "a").unwrap();
        let e = m.alloc(&d, 600 << 10, "b").unwrap_err();
        assert_eq!(e.status, abi::ERR_OUT_OF_MEMORY);
        assert!(
            e.message
                .contains("budget of 0.001 GiB = 1073741 bytes (option memory=)")
                && e.message.contains("`b`"),
            "{}",
            e.message
        );
        // Freed blocks are cached, but a new class that needs their room
        // releases them first.
        m.free(&d, a).unwrap();
        let c = m.alloc(&d, 900 << 10, "c").unwrap();
        assert!(*d.used.borrow() <= budget.bytes, "{}", d.used.borrow());
        assert!(m.peak_held() <= budget.bytes);
        m.free(&d, c).unwrap();
        // A request that fits the budget though its class does not (after
        // a's 1 MiB class, 25000 bytes fit, their 32 KiB class does not):
        // served at its own size, and the budget still holds.
        let m = Memory::new("test", TAG, 0, budget);
        let a = m.alloc(&d, 600_000, "a").unwrap();
        let b = m.alloc(&d, 25_000, "b").unwrap();
        assert!(m.peak_held() <= budget.bytes, "{}", m.peak_held());
        assert!(m.alloc(&d, 200, "c").is_err());
        m.free(&d, a).unwrap();
        m.free(&d, b).unwrap();
        for bad in ["0", "-1", "x", "inf", ""] {
            assert!(
                Budget::parse_gib(bad, BudgetSource::Environment).is_err(),
                "{bad}"
            );
        }
        assert_eq!(Budget::default_for(0, 10 << 30).bytes, 9 << 30);
        assert_eq!(
            Budget::default_for(5 << 30, 10 << 30).bytes,
            (5u64 << 30) / 10 * 9
        );
    }

    #[test]
    fn classes() {
        assert_eq!(size_class(0), 256);
        assert_eq!(size_class(257), 512);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), 2 << 20);
        assert_eq!(size_class((3 << 20) + 1), 4 << 20);
        assert_eq!(size_class(34_560_000), 33 << 20);
        assert_eq!(size_class((64 << 20) + 1), (65 << 20));
    }

    #[test]
    fn reuse_and_handles() {
        let d = fake(1 << 20);
        let m = Memory::new("test", TAG, 1 << 20, Budget::UNLIMITED);
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
        assert_eq!(h2 & !((1 << 48) - 1), TAG, "handles carry the tag");
        assert_eq!(
            m.range("t", h2, 0, 0).unwrap(),
            p,
            "block reused from the pool"
        );
        m.release_all(&d);
        assert_eq!(*d.used.borrow(), 0);
    }

    /// A device that zeroes on allocation and allows blocks of at most
    /// `max` bytes; counts the zeroing calls and records the block sizes.
    struct Capped {
        inner: Fake,
        max: u64,
        zeroed: RefCell<u32>,
    }
    impl DeviceAlloc for Capped {
        type Buffer = u64;
        fn raw_alloc(&self, bytes: u64) -> Result<u64, AllocError> {
            assert!(bytes <= self.max, "a block above the device's maximum");
            self.inner.raw_alloc(bytes)
        }
        unsafe fn raw_free(&self, ptr: u64) {
            // SAFETY: the caller's contract.
            unsafe { self.inner.raw_free(ptr) }
        }
        unsafe fn raw_zero(&self, _ptr: u64, _bytes: u64) -> Result<(), PluginError> {
            *self.zeroed.borrow_mut() += 1;
            Ok(())
        }
        fn zeroes_on_alloc(&self) -> bool {
            true
        }
        fn max_block(&self) -> u64 {
            self.max
        }
    }

    #[test]
    fn driver_hooks_cap_classes_and_skip_zeroing_fresh_blocks() {
        let d = Capped {
            inner: fake(1 << 30),
            max: 3000,
            zeroed: RefCell::new(0),
        };
        let m = Memory::new("test", TAG, 1 << 20, Budget::UNLIMITED);
        // 2500 bytes would be a 4096-byte class: capped at the maximum.
        let a = m.alloc(&d, 2500, "a").unwrap();
        assert_eq!(
            d.inner.sizes.borrow().values().copied().collect::<Vec<_>>(),
            [3000]
        );
        assert_eq!(
            *d.zeroed.borrow(),
            0,
            "a fresh block is zeroed by the driver"
        );
        m.free(&d, a).unwrap();
        let b = m.alloc(&d, 2500, "b").unwrap();
        assert_eq!(
            *d.zeroed.borrow(),
            1,
            "a reused block is zeroed by the pool"
        );
        assert_eq!(d.inner.sizes.borrow().len(), 1, "and it is the same block");
        m.free(&d, b).unwrap();
        m.release_all(&d);
    }

    #[test]
    fn out_of_memory_names_buffer() {
        let d = fake(4096);
        let m = Memory::new("test", TAG, 1 << 20, Budget::UNLIMITED);
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
