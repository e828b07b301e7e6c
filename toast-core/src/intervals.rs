//! Sample intervals with an exclusive `last`, and their set algebra.
//!
//! An [`Interval`] has exactly the memory layout of TOAST's `interval_dtype`
//! (`start: f64, stop: f64, first: i64, last: i64`, 32 bytes), so a slice of
//! them can go to a kernel or a device buffer as it is. Kernels read only
//! `first` and `last`, and visit `first <= s < last`.
//!
//! An [`IntervalList`] built by this module is always *canonical*: its
//! intervals are non-empty, sorted, non-overlapping (adjacent is allowed) and
//! lie within `[0, n_samples)`. Its `start`/`stop` are the times of the first
//! and of the last *included* sample (`times[first]`, `times[last - 1]`), so
//! time and sample views agree: building a list from its own `(start, stop)`
//! pairs with [`IntervalList::from_timespans`] gives the same samples back.
//!
//! This differs from TOAST in two documented ways. TOAST stores as `stop` the
//! time of the first *excluded* sample, and maps time spans to samples with a
//! half-open rule (`start <= t < stop`, except that a stop at the last
//! timestamp includes it); that rule is available as
//! [`IntervalList::from_timespans_toast`]. And TOAST clips out-of-range
//! sample spans silently, where we return an error.

use std::ops::Range;
use thiserror::Error;

/// One interval of samples, `first <= s < last`, with the times of its first
/// and last included samples. Same layout as TOAST's `interval_dtype`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Interval {
    /// Time of the first sample.
    pub start: f64,
    /// Time of the last included sample (see the module documentation).
    pub stop: f64,
    /// First sample.
    pub first: i64,
    /// One past the last sample (exclusive).
    pub last: i64,
}

const _: () = assert!(std::mem::size_of::<Interval>() == 32);

// SAFETY: `Interval` is `repr(C)` with four 8-byte fields and no padding
// (checked by the size assertion above); the all-zero pattern is valid.
unsafe impl bytemuck::Zeroable for Interval {}
// SAFETY: `Interval` is `repr(C)` with four 8-byte fields and no padding (size assertion
// above), every bit pattern of f64 and i64 is a valid value, and the type is `Copy`,
// `'static` and holds no pointers.
unsafe impl bytemuck::Pod for Interval {}

impl Interval {
    /// An interval from its four fields.
    pub fn new(start: f64, stop: f64, first: i64, last: i64) -> Self {
        Interval {
            start,
            stop,
            first,
            last,
        }
    }

    /// Number of samples (`last - first`, 0 if reversed).
    pub fn len(&self) -> usize {
        (self.last - self.first).max(0) as usize
    }

    /// Whether the interval holds no sample.
    pub fn is_empty(&self) -> bool {
        self.last <= self.first
    }

    /// Whether sample `s` lies in the interval.
    pub fn contains(&self, s: i64) -> bool {
        self.first <= s && s < self.last
    }

    /// The samples as a range of indices (empty if reversed or negative).
    pub fn samples(&self) -> Range<usize> {
        let first = self.first.max(0) as usize;
        let last = (self.last.max(0) as usize).max(first);
        first..last
    }
}

/// Errors building or validating intervals.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum IntervalError {
    /// An interval or sample span reaches outside `[0, n_samples]`.
    #[error("interval {index} [{first}, {last}) is outside the {n_samples} samples")]
    OutOfRange {
        /// Position in the input.
        index: usize,
        /// Its first sample.
        first: i64,
        /// Its exclusive last sample.
        last: i64,
        /// The number of samples.
        n_samples: usize,
    },
    /// `first > last`.
    #[error("interval {index} has first {first} > last {last}")]
    Reversed {
        /// Position in the input.
        index: usize,
        /// Its first sample.
        first: i64,
        /// Its exclusive last sample.
        last: i64,
    },
    /// An interval starts before the previous one ends.
    #[error(
        "intervals must be sorted and disjoint: interval {index} [{first}, {last}) starts before \
         the previous one ends at {prev_last}"
    )]
    Overlap {
        /// Position in the input.
        index: usize,
        /// Its first sample.
        first: i64,
        /// Its exclusive last sample.
        last: i64,
        /// The exclusive last sample of the previous interval.
        prev_last: i64,
    },
    /// A time span with `start > stop` or a NaN bound.
    #[error("time span {index} ({start}, {stop}) is invalid: need start <= stop, both finite")]
    InvalidSpan {
        /// Position in the input.
        index: usize,
        /// Requested start.
        start: f64,
        /// Requested stop.
        stop: f64,
    },
    /// Time spans out of order or overlapping.
    #[error(
        "time spans must be sorted and disjoint: span {index} starts at {start} before the \
         previous one stops at {prev_stop}"
    )]
    UnsortedSpans {
        /// Position in the input.
        index: usize,
        /// Its start.
        start: f64,
        /// The stop of the previous span.
        prev_stop: f64,
    },
    /// The timestamps decrease somewhere (or are NaN).
    #[error("timestamps must be sorted: times[{index}] = {value} is below times[{}]", index - 1)]
    UnsortedTimes {
        /// First offending index (>= 1).
        index: usize,
        /// Its value.
        value: f64,
    },
    /// Two inputs disagree on the number of samples.
    #[error("{what} has {actual} samples, expected {expected}")]
    LengthMismatch {
        /// What was checked (`times`, `flags`, `other list`, ...).
        what: &'static str,
        /// Expected sample count.
        expected: usize,
        /// Actual sample count.
        actual: usize,
    },
}

/// A canonical list of intervals over `n_samples` samples (see the module
/// documentation for the invariants).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct IntervalList {
    n_samples: usize,
    intervals: Vec<Interval>,
}

fn check_times(times: &[f64]) -> Result<(), IntervalError> {
    for i in 1..times.len() {
        // An incomparable pair means a NaN.
        if matches!(
            times[i].partial_cmp(&times[i - 1]),
            None | Some(std::cmp::Ordering::Less)
        ) {
            return Err(IntervalError::UnsortedTimes {
                index: i,
                value: times[i],
            });
        }
    }
    Ok(())
}

/// Validate raw intervals against the canonical rules (empty intervals are
/// allowed here; [`IntervalList::from_intervals`] drops them).
pub fn validate_intervals(n_samples: usize, intervals: &[Interval]) -> Result<(), IntervalError> {
    let mut prev_last: Option<i64> = None;
    for (index, iv) in intervals.iter().enumerate() {
        if iv.first > iv.last {
            return Err(IntervalError::Reversed {
                index,
                first: iv.first,
                last: iv.last,
            });
        }
        if iv.first < 0 || iv.last > n_samples as i64 {
            return Err(IntervalError::OutOfRange {
                index,
                first: iv.first,
                last: iv.last,
                n_samples,
            });
        }
        if iv.is_empty() {
            continue;
        }
        if let Some(pl) = prev_last {
            if iv.first < pl {
                return Err(IntervalError::Overlap {
                    index,
                    first: iv.first,
                    last: iv.last,
                    prev_last: pl,
                });
            }
        }
        prev_last = Some(iv.last);
    }
    Ok(())
}

impl IntervalList {
    /// No intervals over `n_samples` samples.
    pub fn empty(n_samples: usize) -> Self {
        IntervalList {
            n_samples,
            intervals: Vec::new(),
        }
    }

    /// One interval covering all samples (none if there are no samples).
    pub fn full(times: &[f64]) -> Self {
        let n = times.len();
        let intervals = if n == 0 {
            Vec::new()
        } else {
            vec![Interval::new(times[0], times[n - 1], 0, n as i64)]
        };
        IntervalList {
            n_samples: n,
            intervals,
        }
    }

    fn make(times: &[f64], first: i64, last: i64) -> Interval {
        Interval::new(times[first as usize], times[last as usize - 1], first, last)
    }

    /// Build from `(first, last)` sample ranges (`last` exclusive). Ranges must
    /// be sorted, disjoint and within `[0, times.len()]`; empty ranges are
    /// dropped.
    pub fn from_samples(times: &[f64], ranges: &[(i64, i64)]) -> Result<Self, IntervalError> {
        let n = times.len();
        let raw: Vec<Interval> = ranges
            .iter()
            .map(|&(f, l)| Interval::new(0.0, 0.0, f, l))
            .collect();
        validate_intervals(n, &raw)?;
        let intervals = raw
            .into_iter()
            .filter(|iv| !iv.is_empty())
            .map(|iv| Self::make(times, iv.first, iv.last))
            .collect();
        Ok(IntervalList {
            n_samples: n,
            intervals,
        })
    }

    /// Build from existing intervals (read from a file, say): validated as in
    /// [`validate_intervals`], empty ones dropped, times kept as given.
    pub fn from_intervals(
        n_samples: usize,
        intervals: Vec<Interval>,
    ) -> Result<Self, IntervalError> {
        validate_intervals(n_samples, &intervals)?;
        Ok(IntervalList {
            n_samples,
            intervals: intervals.into_iter().filter(|iv| !iv.is_empty()).collect(),
        })
    }

    fn check_spans(spans: &[(f64, f64)]) -> Result<(), IntervalError> {
        for (index, &(start, stop)) in spans.iter().enumerate() {
            if !start.is_finite() || !stop.is_finite() || start > stop {
                return Err(IntervalError::InvalidSpan { index, start, stop });
            }
            if index > 0 && start < spans[index - 1].1 {
                return Err(IntervalError::UnsortedSpans {
                    index,
                    start,
                    prev_stop: spans[index - 1].1,
                });
            }
        }
        Ok(())
    }

    fn from_sample_bounds(
        times: &[f64],
        bounds: Vec<(usize, i64, i64)>,
    ) -> Result<Self, IntervalError> {
        let mut intervals = Vec::with_capacity(bounds.len());
        let mut prev_last: Option<i64> = None;
        for (index, first, last) in bounds {
            if first >= last {
                continue;
            }
            if let Some(pl) = prev_last {
                if first < pl {
                    return Err(IntervalError::Overlap {
                        index,
                        first,
                        last,
                        prev_last: pl,
                    });
                }
            }
            prev_last = Some(last);
            intervals.push(Self::make(times, first, last));
        }
        Ok(IntervalList {
            n_samples: times.len(),
            intervals,
        })
    }

    /// Build from closed time spans: each covers the samples with
    /// `start <= t <= stop` (first = first sample with `t >= start`, last =
    /// one past the last sample with `t <= stop`). Spans must be sorted and
    /// disjoint; spans that hold no sample are dropped. Two spans that share a
    /// boundary that is exactly a sample time overlap on that sample and are
    /// an error.
    pub fn from_timespans(times: &[f64], spans: &[(f64, f64)]) -> Result<Self, IntervalError> {
        check_times(times)?;
        Self::check_spans(spans)?;
        let bounds = spans
            .iter()
            .enumerate()
            .map(|(i, &(start, stop))| {
                let first = times.partition_point(|&t| t < start) as i64;
                let last = times.partition_point(|&t| t <= stop) as i64;
                (i, first, last)
            })
            .collect();
        Self::from_sample_bounds(times, bounds)
    }

    /// Build from time spans with TOAST's rule (`IntervalList._find_indices`):
    /// samples with `start <= t < stop`, except that a span whose stop lies
    /// past the second-to-last sample also includes the last one; spans that
    /// do not overlap `(times[0], times[n-1])` are dropped.
    pub fn from_timespans_toast(
        times: &[f64],
        spans: &[(f64, f64)],
    ) -> Result<Self, IntervalError> {
        check_times(times)?;
        Self::check_spans(spans)?;
        let n = times.len();
        if n == 0 {
            return Ok(Self::empty(0));
        }
        let bounds = spans
            .iter()
            .enumerate()
            .filter(|(_, &(start, stop))| start < times[n - 1] && stop > times[0])
            .map(|(i, &(start, stop))| {
                let first = times.partition_point(|&t| t < start) as i64;
                let mut last = times.partition_point(|&t| t < stop) as i64;
                if last == n as i64 - 1 {
                    last = n as i64;
                }
                (i, first, last)
            })
            .collect();
        Self::from_sample_bounds(times, bounds)
    }

    /// Runs of samples selected by `good` (`true` = inside an interval).
    pub fn from_selection(times: &[f64], good: &[bool]) -> Result<Self, IntervalError> {
        if good.len() != times.len() {
            return Err(IntervalError::LengthMismatch {
                what: "selection",
                expected: times.len(),
                actual: good.len(),
            });
        }
        let mut intervals = Vec::new();
        let mut start: Option<usize> = None;
        for (i, &g) in good.iter().enumerate() {
            match (g, start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    intervals.push(Self::make(times, s as i64, i as i64));
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            intervals.push(Self::make(times, s as i64, good.len() as i64));
        }
        Ok(IntervalList {
            n_samples: times.len(),
            intervals,
        })
    }

    /// Runs of *unflagged* samples: those with `flags[i] & mask == 0`.
    pub fn from_flags(times: &[f64], flags: &[u8], mask: u8) -> Result<Self, IntervalError> {
        if flags.len() != times.len() {
            return Err(IntervalError::LengthMismatch {
                what: "flags",
                expected: times.len(),
                actual: flags.len(),
            });
        }
        let good: Vec<bool> = flags.iter().map(|&f| f & mask == 0).collect();
        Self::from_selection(times, &good)
    }

    /// Number of samples the list is defined over.
    pub fn n_samples(&self) -> usize {
        self.n_samples
    }

    /// Number of intervals.
    pub fn len(&self) -> usize {
        self.intervals.len()
    }

    /// Whether the list holds no interval.
    pub fn is_empty(&self) -> bool {
        self.intervals.is_empty()
    }

    /// The intervals.
    pub fn as_slice(&self) -> &[Interval] {
        &self.intervals
    }

    /// The intervals as raw bytes in TOAST's `interval_dtype` layout.
    pub fn as_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.intervals)
    }

    /// Iterate over the intervals.
    pub fn iter(&self) -> std::slice::Iter<'_, Interval> {
        self.intervals.iter()
    }

    /// Total number of samples covered.
    pub fn total_samples(&self) -> usize {
        self.intervals.iter().map(Interval::len).sum()
    }

    /// Whether sample `s` lies in some interval.
    pub fn contains_sample(&self, s: i64) -> bool {
        let i = self.intervals.partition_point(|iv| iv.last <= s);
        i < self.intervals.len() && self.intervals[i].contains(s)
    }

    /// `mask[s]` is true for samples inside an interval.
    pub fn sample_mask(&self) -> Vec<bool> {
        let mut m = vec![false; self.n_samples];
        for iv in &self.intervals {
            m[iv.samples()].fill(true);
        }
        m
    }

    /// Check the canonical invariants (always true for lists built here).
    pub fn validate(&self) -> Result<(), IntervalError> {
        validate_intervals(self.n_samples, &self.intervals)
    }

    fn same_length(&self, other: &IntervalList) -> Result<(), IntervalError> {
        if self.n_samples != other.n_samples {
            return Err(IntervalError::LengthMismatch {
                what: "other interval list",
                expected: self.n_samples,
                actual: other.n_samples,
            });
        }
        Ok(())
    }

    /// The samples not covered by any interval, as maximal runs.
    pub fn complement(&self, times: &[f64]) -> Result<IntervalList, IntervalError> {
        if times.len() != self.n_samples {
            return Err(IntervalError::LengthMismatch {
                what: "times",
                expected: self.n_samples,
                actual: times.len(),
            });
        }
        let mut out = Vec::new();
        let mut cursor = 0i64;
        for iv in &self.intervals {
            if iv.first > cursor {
                out.push(Self::make(times, cursor, iv.first));
            }
            cursor = cursor.max(iv.last);
        }
        if cursor < self.n_samples as i64 {
            out.push(Self::make(times, cursor, self.n_samples as i64));
        }
        Ok(IntervalList {
            n_samples: self.n_samples,
            intervals: out,
        })
    }

    /// Samples covered by both lists (one output interval per overlapping
    /// pair, as TOAST's `&`).
    pub fn intersection(&self, other: &IntervalList) -> Result<IntervalList, IntervalError> {
        self.same_length(other)?;
        let (a, b) = (&self.intervals, &other.intervals);
        let (mut i, mut j) = (0, 0);
        let mut out = Vec::new();
        while i < a.len() && j < b.len() {
            let lo = a[i].first.max(b[j].first);
            let hi = a[i].last.min(b[j].last);
            if lo < hi {
                out.push(Interval::new(
                    a[i].start.max(b[j].start),
                    a[i].stop.min(b[j].stop),
                    lo,
                    hi,
                ));
            }
            if a[i].last < b[j].last {
                i += 1;
            } else {
                j += 1;
            }
        }
        Ok(IntervalList {
            n_samples: self.n_samples,
            intervals: out,
        })
    }

    /// Samples covered by either list. Overlapping intervals merge; adjacent
    /// ones stay separate, as in TOAST's `|` (see [`IntervalList::simplify`]).
    pub fn union(&self, other: &IntervalList) -> Result<IntervalList, IntervalError> {
        self.same_length(other)?;
        let mut all: Vec<Interval> = self
            .intervals
            .iter()
            .chain(other.intervals.iter())
            .copied()
            .collect();
        all.sort_by_key(|iv| (iv.first, iv.last));
        let mut out: Vec<Interval> = Vec::with_capacity(all.len());
        for iv in all {
            match out.last_mut() {
                Some(cur) if iv.first < cur.last => {
                    if iv.last > cur.last {
                        cur.last = iv.last;
                        cur.stop = iv.stop;
                    }
                }
                _ => out.push(iv),
            }
        }
        Ok(IntervalList {
            n_samples: self.n_samples,
            intervals: out,
        })
    }

    /// Merge adjacent intervals (`last == next.first`) into one.
    pub fn simplify(&mut self) {
        let mut out: Vec<Interval> = Vec::with_capacity(self.intervals.len());
        for iv in self.intervals.drain(..) {
            match out.last_mut() {
                Some(cur) if iv.first == cur.last => {
                    cur.last = iv.last;
                    cur.stop = iv.stop;
                }
                _ => out.push(iv),
            }
        }
        self.intervals = out;
    }
}

impl<'a> IntoIterator for &'a IntervalList {
    type Item = &'a Interval;
    type IntoIter = std::slice::Iter<'a, Interval>;
    fn into_iter(self) -> Self::IntoIter {
        self.intervals.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift64*), enough for property tests.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        /// A mask with runs, so intervals have varied lengths.
        fn mask(&mut self, n: usize) -> Vec<bool> {
            let p = self.below(5) + 1;
            let mut v = Vec::with_capacity(n);
            let mut cur = self.below(2) == 0;
            for _ in 0..n {
                if self.below(10) < p {
                    cur = !cur;
                }
                v.push(cur);
            }
            v
        }
    }

    fn times(n: usize) -> Vec<f64> {
        (0..n).map(|i| 100.0 + 0.5 * i as f64).collect()
    }

    fn check_canonical(l: &IntervalList, times: &[f64]) {
        l.validate().unwrap();
        for iv in l.iter() {
            assert!(!iv.is_empty());
            assert_eq!(iv.start, times[iv.first as usize]);
            assert_eq!(iv.stop, times[iv.last as usize - 1]);
        }
    }

    #[test]
    fn layout_matches_toast_interval_dtype() {
        assert_eq!(std::mem::size_of::<Interval>(), 32);
        let l = IntervalList::from_samples(&times(10), &[(2, 5)]).unwrap();
        let b = l.as_bytes();
        assert_eq!(b.len(), 32);
        assert_eq!(f64::from_ne_bytes(b[0..8].try_into().unwrap()), 101.0);
        assert_eq!(f64::from_ne_bytes(b[8..16].try_into().unwrap()), 102.0);
        assert_eq!(i64::from_ne_bytes(b[16..24].try_into().unwrap()), 2);
        assert_eq!(i64::from_ne_bytes(b[24..32].try_into().unwrap()), 5);
    }

    #[test]
    fn from_samples_rules() {
        let t = times(10);
        let l = IntervalList::from_samples(&t, &[(0, 2), (2, 2), (2, 4), (7, 10)]).unwrap();
        assert_eq!(l.len(), 3, "empty range dropped, adjacent kept");
        assert_eq!(l.total_samples(), 7);
        check_canonical(&l, &t);
        assert!(matches!(
            IntervalList::from_samples(&t, &[(3, 1)]),
            Err(IntervalError::Reversed { index: 0, .. })
        ));
        assert!(matches!(
            IntervalList::from_samples(&t, &[(0, 11)]),
            Err(IntervalError::OutOfRange { n_samples: 10, .. })
        ));
        assert!(matches!(
            IntervalList::from_samples(&t, &[(-1, 3)]),
            Err(IntervalError::OutOfRange { .. })
        ));
        assert!(matches!(
            IntervalList::from_samples(&t, &[(0, 5), (4, 6)]),
            Err(IntervalError::Overlap {
                index: 1,
                prev_last: 5,
                ..
            })
        ));
        assert!(matches!(
            IntervalList::from_samples(&t, &[(5, 6), (0, 2)]),
            Err(IntervalError::Overlap { index: 1, .. })
        ));
    }

    #[test]
    fn from_timespans_closed_rule() {
        let t = times(10); // 100.0, 100.5, ..., 104.5
                           // Exactly on sample times: both ends included.
        let l = IntervalList::from_timespans(&t, &[(100.5, 101.5)]).unwrap();
        assert_eq!((l.as_slice()[0].first, l.as_slice()[0].last), (1, 4));
        // Between samples.
        let l = IntervalList::from_timespans(&t, &[(100.4, 101.6)]).unwrap();
        assert_eq!((l.as_slice()[0].first, l.as_slice()[0].last), (1, 4));
        // Span covering nothing is dropped; spans past the ends are clipped.
        let l = IntervalList::from_timespans(&t, &[(90.0, 99.0), (100.1, 100.2), (104.0, 200.0)])
            .unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!((l.as_slice()[0].first, l.as_slice()[0].last), (8, 10));
        // Touching on a sample time overlaps that sample.
        assert!(matches!(
            IntervalList::from_timespans(&t, &[(100.0, 101.0), (101.0, 102.0)]),
            Err(IntervalError::Overlap { index: 1, .. })
        ));
        // Touching between samples is fine.
        let l = IntervalList::from_timespans(&t, &[(100.0, 101.2), (101.2, 102.0)]).unwrap();
        assert_eq!(l.total_samples(), 5);
        assert!(matches!(
            IntervalList::from_timespans(&t, &[(2.0, 1.0)]),
            Err(IntervalError::InvalidSpan { .. })
        ));
        assert!(matches!(
            IntervalList::from_timespans(&t, &[(f64::NAN, 1.0)]),
            Err(IntervalError::InvalidSpan { .. })
        ));
        assert!(matches!(
            IntervalList::from_timespans(&t, &[(101.0, 102.0), (100.0, 100.5)]),
            Err(IntervalError::UnsortedSpans { index: 1, .. })
        ));
        assert!(matches!(
            IntervalList::from_timespans(&[1.0, 0.0], &[(0.0, 1.0)]),
            Err(IntervalError::UnsortedTimes { index: 1, .. })
        ));
        assert!(matches!(
            IntervalList::from_timespans(&[f64::NAN, 1.0], &[(0.0, 1.0)]),
            Err(IntervalError::UnsortedTimes { index: 1, .. })
        ));
    }

    #[test]
    fn from_timespans_round_trips_own_times() {
        let mut rng = Rng(7);
        for _ in 0..200 {
            let n = 1 + rng.below(60) as usize;
            let t = times(n);
            let l = IntervalList::from_selection(&t, &rng.mask(n)).unwrap();
            let spans: Vec<(f64, f64)> = l.iter().map(|iv| (iv.start, iv.stop)).collect();
            assert_eq!(IntervalList::from_timespans(&t, &spans).unwrap(), l);
        }
    }

    #[test]
    fn from_timespans_toast_rule() {
        let t = times(10);
        // Half-open: a stop exactly on a sample excludes it.
        let l = IntervalList::from_timespans_toast(&t, &[(100.5, 101.5)]).unwrap();
        assert_eq!((l.as_slice()[0].first, l.as_slice()[0].last), (1, 3));
        // A stop at the last timestamp includes the last sample.
        let l = IntervalList::from_timespans_toast(&t, &[(103.0, 104.5)]).unwrap();
        assert_eq!((l.as_slice()[0].first, l.as_slice()[0].last), (6, 10));
        // Outside the timestamps: dropped.
        let l = IntervalList::from_timespans_toast(&t, &[(104.5, 110.0)]).unwrap();
        assert!(l.is_empty());
        // Touching spans are fine under the half-open rule.
        let l = IntervalList::from_timespans_toast(&t, &[(100.0, 101.0), (101.0, 102.0)]).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l.as_slice()[0].last, l.as_slice()[1].first);
    }

    #[test]
    fn from_flags_runs() {
        let t = times(8);
        let flags = [0u8, 1, 0, 0, 2, 4, 0, 0];
        let l = IntervalList::from_flags(&t, &flags, 3).unwrap();
        let got: Vec<(i64, i64)> = l.iter().map(|iv| (iv.first, iv.last)).collect();
        assert_eq!(got, vec![(0, 1), (2, 4), (5, 8)]);
        assert_eq!(l.total_samples(), 6);
        check_canonical(&l, &t);
        assert!(matches!(
            IntervalList::from_flags(&t, &flags[..3], 1),
            Err(IntervalError::LengthMismatch { .. })
        ));
        // No samples.
        assert!(IntervalList::from_flags(&[], &[], 1).unwrap().is_empty());
    }

    #[test]
    fn set_algebra_properties() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        for _ in 0..500 {
            let n = rng.below(80) as usize;
            let t = times(n);
            let ma = rng.mask(n);
            let mb = rng.mask(n);
            let a = IntervalList::from_selection(&t, &ma).unwrap();
            let b = IntervalList::from_selection(&t, &mb).unwrap();
            check_canonical(&a, &t);
            assert_eq!(a.sample_mask(), ma);
            assert_eq!(a.total_samples(), ma.iter().filter(|&&x| x).count());
            for (s, &m) in ma.iter().enumerate() {
                assert_eq!(a.contains_sample(s as i64), m);
            }

            let not_a = a.complement(&t).unwrap();
            check_canonical(&not_a, &t);
            let want: Vec<bool> = ma.iter().map(|x| !x).collect();
            assert_eq!(not_a.sample_mask(), want);
            assert_eq!(not_a.complement(&t).unwrap(), a, "double complement");

            let and = a.intersection(&b).unwrap();
            check_canonical(&and, &t);
            let want: Vec<bool> = ma.iter().zip(&mb).map(|(x, y)| *x && *y).collect();
            assert_eq!(and.sample_mask(), want);
            assert_eq!(and, b.intersection(&a).unwrap(), "commutative");

            let or = a.union(&b).unwrap();
            check_canonical(&or, &t);
            let want: Vec<bool> = ma.iter().zip(&mb).map(|(x, y)| *x || *y).collect();
            assert_eq!(or.sample_mask(), want);

            // De Morgan on sample sets.
            let lhs = or.complement(&t).unwrap();
            let rhs = not_a.intersection(&b.complement(&t).unwrap()).unwrap();
            assert_eq!(lhs.sample_mask(), rhs.sample_mask());
            // Identities.
            assert_eq!(a.union(&IntervalList::empty(n)).unwrap(), a);
            assert!(a.intersection(&not_a).unwrap().is_empty());
            assert_eq!(
                a.union(&not_a).unwrap().total_samples(),
                n,
                "a | !a covers everything"
            );
            let mut full = a.union(&not_a).unwrap();
            full.simplify();
            assert_eq!(full, IntervalList::full(&t));
        }
    }

    #[test]
    fn union_keeps_adjacent_and_simplify_merges() {
        let t = times(10);
        let a = IntervalList::from_samples(&t, &[(0, 3)]).unwrap();
        let b = IntervalList::from_samples(&t, &[(3, 5), (4, 4)]).unwrap();
        let mut u = a.union(&b).unwrap();
        assert_eq!(u.len(), 2);
        u.simplify();
        assert_eq!(u.len(), 1);
        assert_eq!(u.as_slice()[0], Interval::new(100.0, 102.0, 0, 5));
        let c = IntervalList::from_samples(&t, &[(1, 7)]).unwrap();
        let u = a.union(&c).unwrap();
        assert_eq!(u.as_slice(), &[Interval::new(100.0, 103.0, 0, 7)]);
    }

    #[test]
    fn mismatched_lengths_are_errors() {
        let a = IntervalList::full(&times(5));
        let b = IntervalList::full(&times(6));
        assert!(matches!(
            a.intersection(&b),
            Err(IntervalError::LengthMismatch {
                expected: 5,
                actual: 6,
                ..
            })
        ));
        assert!(a.union(&b).is_err());
        assert!(a.complement(&times(4)).is_err());
    }

    #[test]
    fn from_intervals_validates_and_drops_empty() {
        let raw = vec![
            Interval::new(0.0, 0.0, 0, 2),
            Interval::new(0.0, 0.0, 3, 3),
            Interval::new(0.0, 0.0, 4, 6),
        ];
        let l = IntervalList::from_intervals(6, raw).unwrap();
        assert_eq!(l.len(), 2);
        let bad = vec![Interval::new(0.0, 0.0, 2, 5), Interval::new(0.0, 0.0, 1, 3)];
        assert!(IntervalList::from_intervals(6, bad).is_err());
        // The error message names the interval.
        let e = validate_intervals(4, &[Interval::new(0.0, 0.0, 0, 9)]).unwrap_err();
        assert_eq!(e.to_string(), "interval 0 [0, 9) is outside the 4 samples");
    }

    #[test]
    fn interval_helpers() {
        let iv = Interval::new(0.0, 1.0, 3, 6);
        assert_eq!(iv.len(), 3);
        assert!(iv.contains(3) && iv.contains(5) && !iv.contains(6));
        assert_eq!(iv.samples(), 3..6);
        let e = Interval::new(0.0, 0.0, 5, 2);
        assert!(e.is_empty());
        assert_eq!(e.len(), 0);
        assert_eq!(e.samples().len(), 0);
    }
}
