//! Parallel decomposition shared by the kernels.
//!
//! Most kernels write `out[row(det), s]` for the samples `s` of each interval.
//! They are split along the sample axis: a task owns the samples
//! `[c0, c1)` and processes, for every detector in order, the pieces of every
//! interval (in interval order) that fall inside its range. Each output
//! element is then written by one task only, in exactly TOAST's order
//! (detector, interval, sample), whatever the number of threads, even when
//! two detectors share an output row or intervals overlap.
//!
//! A short call (tens of microseconds) runs on the calling thread instead
//! ([`with_helper`], [`split_in_two`]): the caller offers one half of it to a
//! pool thread and runs the other; an awake pool thread takes the half at
//! once, and if none has by the time the caller is done, the caller runs it
//! too. Each element is computed by the same expression either way.

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
// SAFETY: `&SharedMut` gives only the pointer and length (a copy); writes through it
// go to disjoint elements (each user documents why), like `&mut [T]` pieces per thread.
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

// ---------------------------------------------------------------------------
// Short calls: the caller and one pool thread, each half of the work.

thread_local! {
    /// The pool that [`split_in_two`] may hand the second half to: set by
    /// [`with_helper`] around a kernel that runs on the calling thread
    /// (`CpuKernel::inline`), unset otherwise.
    static HELPER: std::cell::Cell<*const rayon::ThreadPool> =
        const { std::cell::Cell::new(std::ptr::null()) };
}

/// Run `f` on this thread with `pool` (when it has two threads or more) as
/// the helper of [`split_in_two`].
pub(crate) fn with_helper<R>(pool: Option<&rayon::ThreadPool>, f: impl FnOnce() -> R) -> R {
    /// Restores the previous helper, also when `f` unwinds.
    struct Restore(*const rayon::ThreadPool);
    impl Drop for Restore {
        fn drop(&mut self) {
            HELPER.with(|h| h.set(self.0));
        }
    }
    let p = pool
        .filter(|p| p.current_num_threads() >= 2)
        .map_or(std::ptr::null(), |p| p as *const rayon::ThreadPool);
    let _restore = Restore(HELPER.with(|h| h.replace(p)));
    f()
}

/// Where the second half of a [`split_in_two`] call stands.
const PENDING: u8 = 0;
const HELPER_RUNS: u8 = 1;
const CALLER_RUNS: u8 = 2;
const HELPER_DONE: u8 = 3;

/// What the pool's job holds: the second half's work (its lifetime erased)
/// and its state, shared with the caller.
struct HalfJob {
    state: std::sync::atomic::AtomicU8,
    work: *mut (dyn FnMut() + Send),
}

// SAFETY: `work` is a `Send` closure that exactly one thread calls: the
// pool's job only after winning `state` from PENDING to HELPER_RUNS (the
// caller then does not return, so the closure stays alive, until the state
// is HELPER_DONE), the caller only after winning it to CALLER_RUNS.
unsafe impl Send for HalfJob {}
// SAFETY: through `&HalfJob` threads touch only the atomic `state` and, for the one
// thread that wins it (HELPER_RUNS or CALLER_RUNS), the closure `work`, which the
// caller keeps alive until the state is HELPER_DONE or it ran the closure itself.
unsafe impl Sync for HalfJob {}

/// Run `first()` and `second()` (which touch disjoint data) and return when
/// both are done. Without a helper pool ([`with_helper`]) both run here, in
/// order. With one, `second` is offered to a pool thread while this thread
/// runs `first`; if no pool thread has taken it by then, this thread runs it
/// too. The caller never sleeps waiting for the pool: a pool thread that is
/// awake (as after the calls before) takes the half at once, and a sleeping
/// one costs only the offer, not its wake-up. TOAST's OpenMP threads, which
/// spin between parallel regions, give short calls the same.
pub(crate) fn split_in_two(first: impl FnOnce(), mut second: impl FnMut() + Send) {
    use std::sync::atomic::Ordering::{AcqRel, Acquire, Release};
    let pool = HELPER.with(|h| h.get());
    if pool.is_null() {
        first();
        second();
        return;
    }
    let work: &mut (dyn FnMut() + Send) = &mut second;
    // SAFETY: only the lifetime is erased; see HalfJob's Send impl for why
    // the pointer is not used after `second` is dropped.
    let work: *mut (dyn FnMut() + Send) = unsafe { std::mem::transmute(work) };
    let job = std::sync::Arc::new(HalfJob {
        state: std::sync::atomic::AtomicU8::new(PENDING),
        work,
    });
    let theirs = std::sync::Arc::clone(&job);
    // SAFETY: HELPER is only set, by `with_helper`, to a pool that outlives
    // the call it wraps (the context's, which lives until `shutdown`).
    let pool = unsafe { &*pool };
    pool.spawn(move || {
        if theirs
            .state
            .compare_exchange(PENDING, HELPER_RUNS, AcqRel, Acquire)
            .is_ok()
        {
            /// Marks the half done, also if it unwinds.
            struct Done<'a>(&'a HalfJob);
            impl Drop for Done<'_> {
                fn drop(&mut self) {
                    self.0.state.store(HELPER_DONE, Release);
                }
            }
            let _done = Done(&theirs);
            // SAFETY: we won the half; the caller waits for HELPER_DONE
            // before `second` goes out of scope.
            unsafe { (*theirs.work)() };
        }
    });
    /// On leaving (also by unwinding out of `first`): take the half back if
    /// no pool thread has it, else wait until it is done, so that `second`
    /// is never dropped while a pool thread runs it.
    struct Join<'a>(&'a HalfJob);
    impl Drop for Join<'_> {
        fn drop(&mut self) {
            let state = &self.0.state;
            let mut spins = 0u32;
            loop {
                match state.compare_exchange(PENDING, CALLER_RUNS, AcqRel, Acquire) {
                    Ok(_) | Err(CALLER_RUNS) | Err(HELPER_DONE) => return,
                    Err(_) => {}
                }
                spins += 1;
                if spins < 1 << 12 {
                    std::hint::spin_loop();
                } else {
                    // The pool thread was descheduled mid-half: let it run.
                    std::thread::yield_now();
                }
            }
        }
    }
    let join = Join(&job);
    first();
    if job
        .state
        .compare_exchange(PENDING, CALLER_RUNS, AcqRel, Acquire)
        .is_ok()
    {
        // SAFETY: we won the half (no pool thread calls it); `work` points
        // at `second`, which lives until this function returns.
        unsafe { (*job.work)() };
    }
    drop(join);
}

/// [`split_in_two`] over an output array: `f(half, range)` for its first
/// and second halves, `range` being the half's indices in `out` (for the
/// inputs read beside it).
pub(crate) fn split_out_in_two<T: Send>(
    out: &mut [T],
    f: impl Fn(&mut [T], std::ops::Range<usize>) + Sync,
) {
    let (n, mid) = (out.len(), out.len() / 2);
    let (first, second) = out.split_at_mut(mid);
    // `split_in_two` takes an FnMut for its second half; it runs once.
    let mut second = Some(second);
    split_in_two(
        || f(first, 0..mid),
        || {
            if let Some(o) = second.take() {
                f(o, mid..n);
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both halves run exactly once, with or without a helper pool, and the
    /// helper is only set inside `with_helper`.
    #[test]
    fn split_in_two_runs_each_half_once() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let n = 50_000;
        let input: Vec<f64> = (0..n).map(|i| i as f64 * 0.5).collect();
        let want: Vec<f64> = input.iter().map(|x| x * 3.0).collect();
        let run = |out: &mut [f64]| {
            let (o0, o1) = out.split_at_mut(n / 2);
            let mut o1 = Some(o1);
            let mut calls = 0;
            split_in_two(
                || {
                    for (o, x) in o0.iter_mut().zip(&input[..n / 2]) {
                        *o += x * 3.0;
                    }
                },
                || {
                    calls += 1;
                    if let Some(o1) = o1.take() {
                        for (o, x) in o1.iter_mut().zip(&input[n / 2..]) {
                            *o += x * 3.0;
                        }
                    }
                },
            );
            calls
        };
        let mut out = vec![0.0; n];
        assert_eq!(run(&mut out), 1);
        assert_eq!(out, want);
        for _ in 0..200 {
            let mut out = vec![0.0; n];
            let calls = with_helper(Some(&pool), || run(&mut out));
            assert_eq!(calls, 1);
            assert_eq!(out, want);
        }
        assert!(HELPER.with(|h| h.get()).is_null());
        // A one-thread pool is no helper.
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        with_helper(Some(&one), || assert!(HELPER.with(|h| h.get()).is_null()));
    }
}
