//! Hostile inputs for the property tests of the readers (FITS, npz, the
//! configuration): every reader must answer `Ok` or a typed error on any
//! bytes, never panic, and never allocate far beyond what the input holds.
//!
//! * [`Mutation`] and [`mutation`]: a valid file changed the ways real
//!   corruption and hand-made probes change it: bytes overwritten, the file
//!   cut short, bytes spliced in, and a number written in the file (a
//!   header's size, shape or count) replaced by an absurd one.
//! * [`CountingAlloc`] and [`largest_allocation`]: a test binary installs
//!   the allocator (`#[global_allocator]`) and measures the largest single
//!   allocation a call makes on its thread.

use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Numbers that break readers that trust them: zero, negative, just past
/// 32-bit and 64-bit limits, the largest HEALPix resolution, longer than
/// any integer type, and floats far out of range.
pub const ABSURD_NUMBERS: [&str; 12] = [
    "0",
    "-1",
    "1",
    "2147483648",
    "4294967296",
    "536870912",
    "9223372036854775807",
    "18446744073709551615",
    "99999999999999999999999999",
    "1e300",
    "-1e308",
    "nan",
];

/// One change to a valid file.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Overwrite bytes: (position as a fraction of the length, new byte).
    Overwrite(Vec<(f64, u8)>),
    /// Keep only this fraction of the file.
    Truncate(f64),
    /// Insert these bytes at this fraction of the length.
    Splice(f64, Vec<u8>),
    /// Replace the k-th run of ASCII digits (k modulo the number of runs)
    /// by this number; with `keep_len`, a shorter number is padded with
    /// leading spaces so that fixed-width fields (FITS cards, `.npy`
    /// headers) keep their layout.
    Number {
        run: usize,
        with: &'static str,
        keep_len: bool,
    },
}

impl Mutation {
    /// `bytes` changed by this mutation.
    pub fn apply(&self, bytes: &[u8]) -> Vec<u8> {
        let at = |f: f64, len: usize| ((f * len as f64) as usize).min(len);
        let mut out = bytes.to_vec();
        match self {
            Mutation::Overwrite(edits) => {
                for &(f, b) in edits {
                    let i = at(f, out.len());
                    if i < out.len() {
                        out[i] = b;
                    }
                }
            }
            Mutation::Truncate(f) => out.truncate(at(*f, out.len())),
            Mutation::Splice(f, ins) => {
                let i = at(*f, out.len());
                out.splice(i..i, ins.iter().copied());
            }
            Mutation::Number {
                run,
                with,
                keep_len,
            } => {
                let runs = digit_runs(&out);
                if runs.is_empty() {
                    return out;
                }
                let (s, e) = runs[run % runs.len()];
                let mut text = with.as_bytes().to_vec();
                if *keep_len && text.len() < e - s {
                    let mut padded = vec![b' '; e - s - text.len()];
                    padded.extend(text);
                    text = padded;
                }
                out.splice(s..e, text);
            }
        }
        out
    }
}

/// The (start, end) of every run of ASCII digits in `bytes`.
fn digit_runs(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut start = None;
    for (i, b) in bytes.iter().enumerate() {
        match (b.is_ascii_digit(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                runs.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push((s, bytes.len()));
    }
    runs
}

/// Any [`Mutation`], numbers replaced from [`ABSURD_NUMBERS`].
pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        prop::collection::vec((0.0..1.0f64, any::<u8>()), 1..16).prop_map(Mutation::Overwrite),
        (0.0..1.0f64).prop_map(Mutation::Truncate),
        (0.0..1.0f64, prop::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(f, b)| Mutation::Splice(f, b)),
        (
            any::<usize>(),
            prop::sample::select(&ABSURD_NUMBERS[..]),
            any::<bool>()
        )
            .prop_map(|(run, with, keep_len)| Mutation::Number {
                run,
                with,
                keep_len
            }),
    ]
}

/// A global allocator that records, per thread, the largest single
/// allocation (or reallocation) asked of it; otherwise the system's.
#[derive(Debug)]
pub struct CountingAlloc;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: during thread teardown the slot may be gone; a const
    // initialiser without a destructor never allocates itself.
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are this allocator's; the bookkeeping
// touches only a thread-local `Cell` and never allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract for `alloc` is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (every allocation of this
        // allocator is) with `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as for `dealloc`, and `new_size` is the caller's, valid
        // for `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// `f`'s result and the largest single allocation it made on this thread
/// (the test binary must install [`CountingAlloc`]; otherwise 0).
pub fn largest_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LARGEST.with(|l| l.set(0));
    let r = f();
    (r, LARGEST.with(Cell::get))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_change_what_they_say() {
        let text = b"NAXIS2  =                   12 / rows";
        let m = Mutation::Number {
            run: 1,
            with: "7",
            keep_len: true,
        };
        assert_eq!(
            m.apply(text),
            b"NAXIS2  =                    7 / rows".to_vec()
        );
        let m = Mutation::Number {
            run: 0,
            with: "4294967296",
            keep_len: false,
        };
        assert_eq!(m.apply(b"(5, 700)"), b"(4294967296, 700)".to_vec());
        assert_eq!(Mutation::Truncate(0.5).apply(b"abcd"), b"ab".to_vec());
        assert_eq!(
            Mutation::Splice(0.25, vec![b'x']).apply(b"abcd"),
            b"axbcd".to_vec()
        );
        assert_eq!(
            Mutation::Overwrite(vec![(0.99, b'!')]).apply(b"abcd"),
            b"abc!".to_vec()
        );
        assert_eq!(digit_runs(b"a12b3"), [(1, 3), (4, 5)]);
    }
}
