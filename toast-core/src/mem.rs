//! Memory helpers: large zeroed buffers advised as huge pages, zeroing that
//! leaves untouched pages unmapped, and returning free heap to the system.
//!
//! The map kernels (`scan_map`, `build_noise_weighted`, the covariance
//! accumulations) read or write one pixel per sample at scattered places of
//! a map that can be a GiB: on 4 KiB pages nearly every access misses the
//! TLB. numpy advises every array above 4 MiB as huge pages
//! (`madvise(MADV_HUGEPAGE)`), so where the kernel's transparent huge pages
//! are in `madvise` mode (Debian's and most distributions' default) TOAST's
//! maps sit on 2 MiB pages and ours would not. [`zeroed_large`] gives a
//! zeroed buffer advised the same way, before anything touches it.
//!
//! Memory: a huge page is committed whole at its first touch, so a sparsely
//! touched buffer can take up to 2 MiB more per touched region than on small
//! pages. The pipeline's maps therefore do not use this: `toast_ops`'
//! `PixelData` sits on ordinary untouched zero pages and is reset with
//! [`zero_sparse`], so that only the pages holding a hit pixel become
//! resident (on `xsmall` 60 MB less, and no slower). The kernel benchmark
//! (`toast-cli bench kernels`) keeps the advice, to time the kernels on the
//! pages numpy gives TOAST's arrays. [`release_free_memory`] returns the
//! allocator's free pages between a pipeline's phases.

/// The size from which a buffer is advised (numpy's threshold).
pub const HUGEPAGE_THRESHOLD: usize = 4 << 20;

/// `n` zeroed elements, advised as transparent huge pages when the buffer
/// is at least [`HUGEPAGE_THRESHOLD`] bytes on Linux. The pages are not
/// touched here: the allocation is a zeroed (calloc-like) one, so the
/// advice takes effect at each page's first write. Elsewhere, or when the
/// kernel declines, an ordinary zeroed buffer; the contents are the same.
pub fn zeroed_large<T: bytemuck::Zeroable + Clone>(n: usize) -> Vec<T> {
    let v = vec![T::zeroed(); n];
    advise_hugepages(&v);
    v
}

/// `n` zeroed elements, or `None` when the memory cannot be had (an
/// address-space or data limit, no memory left, a size past `isize::MAX`)
/// where `vec![0; n]` would abort the process. Zeroed the way `vec!` does
/// (a calloc-like allocation: pages stay untouched until written).
pub fn try_zeroed<T: bytemuck::Zeroable>(n: usize) -> Option<Vec<T>> {
    let layout = std::alloc::Layout::array::<T>(n).ok()?;
    if layout.size() == 0 {
        return Some((0..n).map(|_| T::zeroed()).collect());
    }
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` was allocated by the global allocator with the layout of
    // `[T; n]` (size and alignment as a `Vec<T>` of capacity `n` has), and
    // all its `n` elements are initialised: zero bytes are a valid `T`
    // (`Zeroable`).
    Some(unsafe { Vec::from_raw_parts(p, n, n) })
}

#[cfg(target_os = "linux")]
fn advise_hugepages<T>(v: &[T]) {
    const PAGE: usize = 4096;
    let bytes = std::mem::size_of_val(v);
    let start = v.as_ptr() as usize;
    let first = start.div_ceil(PAGE) * PAGE;
    let end = (start + bytes) / PAGE * PAGE;
    if bytes >= HUGEPAGE_THRESHOLD && end > first {
        // SAFETY: [first, end) is page-aligned and lies inside `v`'s live
        // allocation (rounded inwards from its start and end); MADV_HUGEPAGE
        // only tells the kernel how to back those pages and changes neither
        // their contents nor the mapping, so no Rust reference is affected.
        // A refusal (an error return) leaves ordinary pages, which is fine.
        unsafe {
            libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_hugepages<T>(_v: &[T]) {}

/// Set every byte of `bytes` to zero, writing only the pages (4 KiB
/// stretches, aligned to the address space's pages) that hold a non-zero
/// byte. A zeroed buffer that was never written is not resident (its pages
/// read as the kernel's shared zero page); zeroing it with a plain `fill`
/// would commit every page. A map whose hit pixels cover a fraction of its
/// submaps (a third on `xsmall`) keeps the pages of the unhit rest unmapped
/// through repeated resets this way.
///
/// Reading a page to find it zero costs about what writing it would, so the
/// test is a word-wise OR (vectorised, one branch per 64 bytes; a per-byte
/// `any` ran at about a byte a cycle, 20 ms per reset of tiny's 67 MB
/// map) and buffers from [`PARALLEL_FROM`] bytes on are split over rayon's
/// pool (the solver resets its map every CG iteration).
pub fn zero_sparse(bytes: &mut [u8]) {
    use rayon::prelude::*;
    let zero_page = |page: &mut [u8]| {
        if !all_zero(page) {
            page.fill(0);
        }
    };
    // The bytes before the first page boundary, then whole pages.
    let head = bytes.as_ptr().align_offset(PAGE).min(bytes.len());
    let (first, pages) = bytes.split_at_mut(head);
    zero_page(first);
    if pages.len() >= PARALLEL_FROM {
        pages
            .par_chunks_mut(PAGE)
            .with_min_len(64)
            .for_each(zero_page);
    } else {
        pages.chunks_mut(PAGE).for_each(zero_page);
    }
}

/// The page size [`zero_sparse`] works in.
const PAGE: usize = 4096;

/// The size from which [`zero_sparse`] runs on several threads (below it a
/// pool wake-up costs more than the scan).
pub const PARALLEL_FROM: usize = 1 << 20;

/// Whether every byte is zero: the aligned middle as 8-byte words OR-ed 64
/// bytes at a time (no per-byte branch), the unaligned ends byte by byte.
fn all_zero(bytes: &[u8]) -> bool {
    let (head, words, tail) = bytemuck::pod_align_to::<u8, u64>(bytes);
    let mut blocks = words.chunks_exact(8);
    head.iter().all(|&b| b == 0)
        && tail.iter().all(|&b| b == 0)
        && blocks
            .by_ref()
            .all(|b| b.iter().fold(0, |a, &w| a | w) == 0)
        && blocks.remainder().iter().all(|&w| w == 0)
}

/// Give the allocator's free memory back to the system (glibc's
/// `malloc_trim(0)`: every arena's free pages, not only the top of the main
/// heap). Freed blocks below glibc's mmap threshold (up to 32 MiB once the
/// threshold has adapted) stay in the heap or in a worker thread's arena and
/// count as resident until something reuses them; a pipeline calls this
/// between phases so that one phase's transients (a per-thread FFT
/// workspace, per-detector rows) do not add to the next phase's peak.
/// Elsewhere than glibc, nothing.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of the allocator's own
    // arenas to the kernel (madvise of whole free pages); it touches no
    // live allocation and is thread-safe (it takes each arena's lock).
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A writer that asks the kernel to start writing each stretch of
/// [`WriteBehind::STRETCH`] bytes to the disk as soon as it is written
/// (Linux `sync_file_range(SYNC_FILE_RANGE_WRITE)`, which does not wait),
/// so that a later `fsync` of a large file waits only for its last
/// stretches instead of all of it: the disk works while the rest is
/// encoded. Elsewhere a plain writer. The bytes written are the same.
#[derive(Debug)]
pub struct WriteBehind {
    file: std::fs::File,
    /// Bytes written so far, and the offset up to which writeback was asked.
    written: u64,
    started: u64,
}

impl WriteBehind {
    /// Stretch size from which writeback is started.
    pub const STRETCH: u64 = 8 << 20;

    /// Wraps `file`, positioned at offset 0 (a new file).
    pub fn new(file: std::fs::File) -> Self {
        WriteBehind {
            file,
            written: 0,
            started: 0,
        }
    }

    #[cfg(target_os = "linux")]
    fn start_writeback(&mut self) {
        use std::os::fd::AsRawFd;
        let len = self.written - self.started;
        // SAFETY: sync_file_range only reads the descriptor of the open
        // file this struct owns and the two integers; it touches no memory
        // of this process. A failure (e.g. a file system without it) only
        // means the later fsync does all the work, so it is ignored.
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                self.started as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
        self.started = self.written;
    }

    #[cfg(not(target_os = "linux"))]
    fn start_writeback(&mut self) {
        self.started = self.written;
    }
}

impl std::io::Write for WriteBehind {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.started >= Self::STRETCH {
            self.start_writeback();
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_behind_writes_every_byte() {
        use std::io::{Read, Write};
        let path = std::env::temp_dir().join(format!("toast-wb-{}", std::process::id()));
        let data: Vec<u8> = (0..(2 * WriteBehind::STRETCH + 12345))
            .map(|i| (i % 251) as u8)
            .collect();
        let mut w = WriteBehind::new(std::fs::File::create(&path).unwrap());
        for c in data.chunks(1 << 20) {
            w.write_all(c).unwrap();
        }
        w.flush().unwrap();
        drop(w);
        let mut back = Vec::new();
        std::fs::File::open(&path)
            .unwrap()
            .read_to_end(&mut back)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(back == data);
    }

    #[test]
    fn try_zeroed_gives_zeros_or_none() {
        assert_eq!(try_zeroed::<f64>(1000), Some(vec![0.0f64; 1000]));
        assert_eq!(try_zeroed::<u8>(0), Some(Vec::new()));
        assert_eq!(try_zeroed::<()>(5).map(|v| v.len()), Some(5));
        assert!(try_zeroed::<f64>(usize::MAX / 4).is_none());
    }

    #[test]
    fn zero_sparse_zeroes_every_byte() {
        let mut v = vec![0u8; 3 * 4096 + 17];
        v[5] = 1;
        v[2 * 4096 + 3] = 255;
        v[3 * 4096 + 16] = 7;
        zero_sparse(&mut v);
        assert!(v.iter().all(|&b| b == 0));
        zero_sparse(&mut []);
        // Unaligned starts and lengths, single non-zero bytes anywhere (the
        // unaligned head, a word's last byte, the tail), and a buffer large
        // enough to run on the pool.
        let mut big = vec![0u8; 2 * PARALLEL_FROM + 4096 + 13];
        for start in [0usize, 1, 7, 4095] {
            for pos in [0usize, 7, 63, 64, 4095, 4096, PARALLEL_FROM + 5] {
                let s = &mut big[start..];
                let pos = pos.min(s.len() - 1);
                s[pos] = 0x80;
                s[s.len() - 1] = 1;
                assert!(!all_zero(s));
                zero_sparse(s);
                assert!(big.iter().all(|&b| b == 0), "start {start}, byte {pos}");
            }
        }
        assert!(all_zero(&big[3..]));
    }

    #[test]
    fn zeroed_large_is_zero_at_every_size() {
        for n in [0usize, 1, 1000, (HUGEPAGE_THRESHOLD / 8) + 3] {
            let v: Vec<f64> = zeroed_large(n);
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|x| *x == 0.0));
        }
        let v: Vec<i64> = zeroed_large(HUGEPAGE_THRESHOLD);
        assert!(v.iter().all(|x| *x == 0));
    }
}
