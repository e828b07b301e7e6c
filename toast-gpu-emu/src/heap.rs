//! Emulated device memory: host allocations behind device addresses.
//!
//! A device address is the host address of the allocation (so a kernel
//! dereferences it directly), aligned to 256 bytes as `cuMemAlloc` and
//! `hipMalloc` guarantee. Every live allocation is in one table, and every
//! copy, fill and free is checked against it first: an address that is not
//! inside a live allocation, or a range that runs past its end, is an error
//! the API turns into its own code, never a fault. The emulated device has
//! [`total_memory`] bytes (16 GiB, or `TOAST_EMU_MEMORY`); an allocation
//! beyond what is left is out of memory. New allocations are filled with [`FILL`], so a plugin that reads
//! memory it never wrote gets garbage, as on a device, not zeros.
//!
//! Each allocation of [`SHARED_MAPPING_MIN`] bytes or more is its own
//! shared anonymous mapping (`mmap` with `MAP_SHARED | MAP_ANONYMOUS`;
//! page-aligned, so more than [`ALIGN`]), not a heap block: the kernel
//! counts its pages as shared memory (`RssShmem` in `/proc/PID/status`),
//! apart from the process's own (`RssAnon`), so a test can tell the host
//! memory of a device run from the emulated device's, which on a real GPU
//! is not host memory at all. Smaller ones (the kernels' argument arrays)
//! stay heap blocks.

use crate::EmuError;
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// The emulated device's memory size unless `TOAST_EMU_MEMORY` says
/// otherwise: 16 GiB.
pub const DEFAULT_TOTAL_MEMORY: u64 = 16 << 30;

/// The emulated device's memory size: `TOAST_EMU_MEMORY` (bytes, or with a
/// `K`, `M` or `G` suffix: powers of 1024), else [`DEFAULT_TOTAL_MEMORY`].
pub fn total_memory() -> u64 {
    static TOTAL: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOTAL.get_or_init(|| {
        crate::faults::env_bytes("TOAST_EMU_MEMORY").unwrap_or(DEFAULT_TOTAL_MEMORY)
    })
}

/// The alignment of every allocation.
pub const ALIGN: usize = 256;

/// Allocations of at least this many bytes are shared mappings (see the
/// module documentation): 64 KiB.
pub const SHARED_MAPPING_MIN: usize = 64 << 10;

/// The byte every new allocation is filled with.
pub const FILL: u8 = 0xA5;

#[derive(Debug)]
struct Block {
    /// The first byte (the device address).
    start: *mut u8,
    /// Bytes allocated.
    size: usize,
    /// A shared mapping (else a heap block).
    mapped: bool,
}

// SAFETY: a block is plain memory owned by the table; the pointer is only
// an address, dereferenced under the table's lock or by kernels the API
// orders.
unsafe impl Send for Block {}

#[derive(Debug, Default)]
struct Table {
    /// Live allocations by device address.
    blocks: BTreeMap<u64, Block>,
    used: u64,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    blocks: BTreeMap::new(),
    used: 0,
});

fn table() -> MutexGuard<'static, Table> {
    // A panic while holding the lock leaves the table consistent (every
    // update is a single insert or remove), so poisoning is ignored.
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

impl Table {
    /// The live allocation holding `[addr, addr + len)`, as (start, size).
    fn find(&self, addr: u64, len: u64, what: &str) -> Result<(u64, u64), EmuError> {
        let Some((&start, b)) = self.blocks.range(..=addr).next_back() else {
            return Err(EmuError::InvalidPointer(format!(
                "{what}: {addr:#x} is not device memory"
            )));
        };
        let size = b.size as u64;
        if addr >= start + size {
            return Err(EmuError::InvalidPointer(format!(
                "{what}: {addr:#x} is not inside a live allocation"
            )));
        }
        if len > start + size - addr {
            return Err(EmuError::InvalidValue(format!(
                "{what}: {len} bytes at {addr:#x} run past the end of the {size}-byte allocation at {start:#x}"
            )));
        }
        Ok((start, size))
    }
}

/// Allocate `bytes` (> 0) bytes of emulated device memory.
pub fn alloc(bytes: u64) -> Result<u64, EmuError> {
    let mut t = table();
    let total = total_memory();
    if bytes > total.saturating_sub(t.used) {
        return Err(EmuError::OutOfMemory(format!(
            "{bytes} bytes requested, {} of {total} free",
            total.saturating_sub(t.used)
        )));
    }
    let size = usize::try_from(bytes)
        .ok()
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| EmuError::OutOfMemory(format!("{bytes} bytes requested")))?
        .max(1);
    let block = Block::new(size).ok_or_else(|| {
        EmuError::OutOfMemory(format!("the host could not allocate {bytes} bytes"))
    })?;
    let p = block.start;
    // SAFETY: `p` is a new allocation of `size` writable bytes.
    unsafe { std::ptr::write_bytes(p, FILL, size) };
    t.used += size as u64;
    t.blocks.insert(p as u64, block);
    Ok(p as u64)
}

impl Block {
    /// A new block of `size` (> 0) bytes, or `None` when the host has no
    /// memory for it: a shared anonymous mapping from
    /// [`SHARED_MAPPING_MIN`] bytes on (see the module documentation), a
    /// heap block below (a mapping per small buffer would count against
    /// the kernel's limit on mappings, `vm.max_map_count`).
    fn new(size: usize) -> Option<Block> {
        if size < SHARED_MAPPING_MIN {
            let layout = Layout::from_size_align(size, ALIGN).ok()?;
            // SAFETY: the layout has a non-zero size.
            let p = unsafe { std::alloc::alloc(layout) };
            return (!p.is_null()).then_some(Block {
                start: p,
                size,
                mapped: false,
            });
        }
        // SAFETY: a new anonymous mapping at an address the kernel chooses
        // (no existing memory is affected); `size` > 0.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        (p != libc::MAP_FAILED).then_some(Block {
            start: p.cast(),
            size,
            mapped: true,
        })
    }

    /// Give the block back to the host.
    ///
    /// # Safety
    /// The block came from [`Block::new`] and is released once; nothing
    /// uses its memory any more.
    unsafe fn release(self) {
        if self.mapped {
            // SAFETY: `start` is a mapping of `size` bytes made by `new`,
            // unmapped once (the caller's contract).
            unsafe { libc::munmap(self.start.cast(), self.size) };
        } else {
            // SAFETY: `start` was allocated by `new` with this layout (which
            // it checked), freed once (the caller's contract).
            unsafe {
                std::alloc::dealloc(
                    self.start,
                    Layout::from_size_align_unchecked(self.size, ALIGN),
                )
            };
        }
    }
}

/// Release the allocation that starts at `addr`.
pub fn free(addr: u64) -> Result<(), EmuError> {
    let mut t = table();
    let b = t.blocks.remove(&addr).ok_or_else(|| {
        EmuError::InvalidPointer(format!(
            "free of {addr:#x}, which is not the start of a live allocation"
        ))
    })?;
    t.used -= b.size as u64;
    // SAFETY: the block was made by `alloc` and is removed from the table,
    // so it is released once; the API's contract is that no queued work
    // uses it.
    unsafe { b.release() };
    Ok(())
}

/// Bytes in use and the total, as `cuMemGetInfo` reports them (free, total).
pub fn info() -> (u64, u64) {
    let t = table();
    let total = total_memory();
    (total.saturating_sub(t.used), total)
}

/// Whether `addr` is inside a live allocation (kernel pointer parameters).
pub fn contains(addr: u64) -> bool {
    table().find(addr, 0, "").is_ok()
}

/// Whether `[addr, addr + len)` lies in one live allocation.
pub fn check(addr: u64, len: u64, what: &str) -> Result<(), EmuError> {
    table().find(addr, len, what).map(|_| ())
}

fn host_ptr(p: *const u8, len: u64, what: &str) -> Result<(), EmuError> {
    if p.is_null() && len > 0 {
        return Err(EmuError::InvalidValue(format!("{what}: null host pointer")));
    }
    Ok(())
}

/// Copy `len` bytes from host memory `src` to device address `dst`.
///
/// # Safety
/// `src` is readable for `len` bytes (the caller's contract, as in CUDA).
pub unsafe fn copy_to_device(dst: u64, src: *const u8, len: u64) -> Result<(), EmuError> {
    let what = "copy to the device";
    host_ptr(src, len, what)?;
    let t = table();
    t.find(dst, len, what)?;
    if len > 0 {
        // SAFETY: `dst..dst+len` is inside a live allocation (checked, and
        // kept alive by the lock); `src` is readable (the caller's
        // contract); `copy` allows the ranges to overlap.
        unsafe { std::ptr::copy(src, dst as *mut u8, len as usize) };
    }
    Ok(())
}

/// Copy `len` bytes from device address `src` to host memory `dst`.
///
/// # Safety
/// `dst` is writable for `len` bytes (the caller's contract).
pub unsafe fn copy_to_host(dst: *mut u8, src: u64, len: u64) -> Result<(), EmuError> {
    let what = "copy to the host";
    host_ptr(dst, len, what)?;
    let t = table();
    t.find(src, len, what)?;
    if len > 0 {
        // SAFETY: as in `copy_to_device`, the other way round.
        unsafe { std::ptr::copy(src as *const u8, dst, len as usize) };
    }
    Ok(())
}

/// Copy `len` bytes between two device addresses.
pub fn copy_on_device(dst: u64, src: u64, len: u64) -> Result<(), EmuError> {
    let t = table();
    t.find(src, len, "device-to-device copy (source)")?;
    t.find(dst, len, "device-to-device copy (destination)")?;
    if len > 0 {
        // SAFETY: both ranges are inside live allocations (checked, kept
        // alive by the lock); `copy` allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
    }
    Ok(())
}

/// Set `len` bytes at device address `dst` to `value`.
pub fn fill(dst: u64, value: u8, len: u64) -> Result<(), EmuError> {
    let t = table();
    t.find(dst, len, "memset")?;
    if len > 0 {
        // SAFETY: the range is inside a live allocation (checked, kept alive
        // by the lock).
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, len as usize) };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_checked() {
        let a = alloc(1000).unwrap();
        assert_eq!(a % ALIGN as u64, 0);
        let src = [7u8; 16];
        let mut back = [0u8; 16];
        // SAFETY: 16-byte host buffers.
        unsafe {
            copy_to_device(a + 984, src.as_ptr(), 16).unwrap();
            copy_to_host(back.as_mut_ptr(), a + 984, 16).unwrap();
            assert!(matches!(
                copy_to_device(a + 985, src.as_ptr(), 16),
                Err(EmuError::InvalidValue(_))
            ));
            assert!(matches!(
                copy_to_host(back.as_mut_ptr(), 8, 16),
                Err(EmuError::InvalidPointer(_))
            ));
        }
        assert_eq!(back, src);
        fill(a, 0, 1000).unwrap();
        // SAFETY: `back` is a 16-byte host buffer; [a + 984, a + 1000) is inside the live
        // 1000-byte allocation `a`.
        unsafe { copy_to_host(back.as_mut_ptr(), a + 984, 16).unwrap() };
        assert_eq!(back, [0; 16]);
        assert!(contains(a + 999) && !contains(a + 1000));
        assert!(matches!(free(a + 8), Err(EmuError::InvalidPointer(_))));
        free(a).unwrap();
        assert!(matches!(free(a), Err(EmuError::InvalidPointer(_))));
        assert!(matches!(alloc(1 << 62), Err(EmuError::OutOfMemory(_))));
        // A large allocation is a shared mapping, checked the same way.
        let n = SHARED_MAPPING_MIN as u64 + 1000;
        let big = alloc(n).unwrap();
        assert!(table().blocks[&big].mapped);
        fill(big, 7, n).unwrap();
        // SAFETY: `back` is a 16-byte host buffer; the range is inside `big`.
        unsafe { copy_to_host(back.as_mut_ptr(), big + n - 16, 16).unwrap() };
        assert_eq!(back, [7; 16]);
        assert!(matches!(
            fill(big, 0, n + 1),
            Err(EmuError::InvalidValue(_))
        ));
        free(big).unwrap();
        assert!(!contains(big));
    }
}
