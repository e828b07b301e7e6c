//! Parallel decomposition shared by the kernels.
//!
//! Most kernels write `out[row(det), s]` for the samples `s` of each interval.
//! They are split along the sample axis: a task owns the samples
//! `[c0, c1)` and processes, for every detector in order, the pieces of every
//! interval (in interval order) that fall inside its range. Each output
//! element is then written by one task only, in exactly TOAST's order
//! (detector, interval, sample), whatever the number of threads, even when
//! two detectors share an output row or intervals overlap.

use rayon::prelude::*;
use toast_accel::abi::SampleRange;

/// A data-dependent failure at detector `det`, interval `view`, sample `samp`.
///
/// Ordered by `(det, view, samp)`: of several failures found by parallel
/// tasks, the smallest is the first one a sequential run would meet, so the
/// reported error does not depend on scheduling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SampleFault {
    pub det: usize,
    pub view: usize,
    pub samp: usize,
    pub message: String,
}

impl SampleFault {
    pub(crate) fn new(det: usize, view: usize, samp: usize, message: String) -> Self {
        SampleFault {
            det,
            view,
            samp,
            message,
        }
    }

    fn key(&self) -> (usize, usize, usize) {
        (self.det, self.view, self.samp)
    }
}

pub(crate) type TaskResult = Result<(), SampleFault>;

/// Keep the first (in sequential order) of two task outcomes.
pub(crate) fn first_fault(a: TaskResult, b: TaskResult) -> TaskResult {
    match (a, b) {
        (Ok(()), x) | (x, Ok(())) => x,
        (Err(x), Err(y)) => Err(if y.key() < x.key() { y } else { x }),
    }
}

/// The part of interval `view` that lies inside a task's sample range.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seg {
    pub view: usize,
    pub first: usize,
    pub last: usize,
}

impl Seg {
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.last - self.first
    }
}

/// Samples per task: about eight tasks per thread, at least 1024 samples
/// (so a task amortises its set-up), at most 65536.
pub(crate) fn chunk_len(n_samp: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    n_samp.div_ceil(threads * 8).clamp(1024, 1 << 16)
}

/// Run `f` in parallel over chunks of the sample axis. `f` receives the
/// pieces of every interval inside its chunk, in interval order (empty
/// chunks are skipped). The first fault in sequential order is returned.
///
/// `intervals` must have been validated (`0 <= first <= last <= n_samp`).
pub(crate) fn for_each_chunk<F>(n_samp: usize, intervals: &[SampleRange], f: F) -> TaskResult
where
    F: Fn(&[Seg]) -> TaskResult + Sync + Send,
{
    if n_samp == 0 || intervals.iter().all(|iv| iv.first == iv.last) {
        return Ok(());
    }
    let cl = chunk_len(n_samp);
    let n_chunks = n_samp.div_ceil(cl);
    (0..n_chunks)
        .into_par_iter()
        .map(|c| {
            let c0 = c * cl;
            let c1 = (c0 + cl).min(n_samp);
            let segs: Vec<Seg> = intervals
                .iter()
                .enumerate()
                .filter_map(|(view, iv)| {
                    let first = (iv.first as usize).max(c0);
                    let last = (iv.last as usize).min(c1);
                    (first < last).then_some(Seg { view, first, last })
                })
                .collect();
            if segs.is_empty() {
                Ok(())
            } else {
                f(&segs)
            }
        })
        .reduce(|| Ok(()), first_fault)
}

/// A mutable array shared by parallel tasks that write disjoint parts of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SharedMut<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: a SharedMut is only a pointer and a length; the tasks that share it
// write disjoint elements (each user documents why), so sending or sharing it
// between threads is as safe as sending `&mut [T]` pieces of it.
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub(crate) fn new(s: &mut [T]) -> Self {
        SharedMut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }

    /// The first element's address, for a caller that computes in-bounds
    /// element addresses itself.
    #[inline]
    pub(crate) fn as_mut_ptr(&self) -> *mut T {
        self.ptr
    }

    /// The elements `[start, start + len)`. Panics when out of bounds, so a
    /// logic error can never touch memory outside the array.
    ///
    /// # Safety
    /// No other live reference (in this or another thread) may overlap the
    /// returned range while it is in use.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, start: usize, len: usize) -> &mut [T] {
        assert!(
            start <= self.len && len <= self.len - start,
            "SharedMut range [{start}, {start}+{len}) outside array of {}",
            self.len
        );
        // SAFETY: in bounds (checked above) of the array this was built from,
        // which outlives the kernel call; exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}
