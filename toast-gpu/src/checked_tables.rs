//! The `global2local` tables already read back and checked, by buffer.
//!
//! The kernels that read or write a map (`scan_map`, `build_noise_weighted`,
//! `cov_accum_timestream`, `solver_flags` with a mask, the fused passes)
//! index it with the global-to-local submap table unchecked, so a call
//! checks every entry on the host first (`check::global2local`), and keeps
//! the host copy to name a faulting pixel's submap. The table lives on the
//! device, so that check is a download; on a device's fine pixel grid
//! (262 144 submaps for nside 1024) it is 2 MiB, and the map-maker makes
//! thousands of such calls with the same table.
//!
//! So a table is read back and checked once per buffer and content: here,
//! by its buffer handle (handles are never reused), with the entries and
//! the fewest local submaps it was checked against. A call with as many or
//! more local submaps uses the copy as it is (no download, no check); one
//! with fewer checks the copy again (no download). Anything that may write
//! the buffer forgets its entry: a copy to it, a reset, its release, and a
//! kernel call that has it as an output (`Context::written`, from the
//! plugin's entry points). No other path writes device memory.

use std::collections::HashMap;
use std::sync::Arc;

/// The checked tables of one context.
#[derive(Debug, Default)]
pub(crate) struct CheckedTables {
    tables: HashMap<u64, Checked>,
}

#[derive(Debug)]
struct Checked {
    entries: Arc<[i64]>,
    /// The fewest local submaps the entries were checked against.
    n_local: u64,
}

/// A table found here, and whether it still needs checking against the
/// call's local submaps.
pub(crate) struct Found {
    pub(crate) entries: Arc<[i64]>,
    pub(crate) checked: bool,
}

impl CheckedTables {
    /// The table of `handle` with `n` entries, if read back since the
    /// buffer was last written; `checked` when it passed a check against
    /// at most `n_local` local submaps (every entry below that count is
    /// below `n_local` too).
    pub(crate) fn find(&self, handle: u64, n: usize, n_local: u64) -> Option<Found> {
        let t = self.tables.get(&handle)?;
        (t.entries.len() == n).then(|| Found {
            entries: Arc::clone(&t.entries),
            checked: n_local >= t.n_local,
        })
    }

    /// Keep `entries` of `handle`, checked against `n_local` local submaps.
    pub(crate) fn insert(&mut self, handle: u64, entries: Arc<[i64]>, n_local: u64) {
        let n_local = match self.tables.get(&handle) {
            Some(t) if Arc::ptr_eq(&t.entries, &entries) => t.n_local.min(n_local),
            _ => n_local,
        };
        self.tables.insert(handle, Checked { entries, n_local });
    }

    /// The buffer `handle` may have been written: forget its table.
    pub(crate) fn written(&mut self, handle: u64) {
        if !self.tables.is_empty() {
            self.tables.remove(&handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_kept_until_written() {
        let mut t = CheckedTables::default();
        assert!(t.find(7, 3, 4).is_none());
        let e: Arc<[i64]> = Arc::from(vec![0, -1, 3]);
        t.insert(7, Arc::clone(&e), 4);
        let f = t.find(7, 3, 4).unwrap();
        assert!(f.checked && Arc::ptr_eq(&f.entries, &e));
        assert!(t.find(7, 3, 9).unwrap().checked, "more local submaps");
        assert!(!t.find(7, 3, 3).unwrap().checked, "fewer: check again");
        assert!(t.find(7, 4, 4).is_none(), "another length");
        assert!(t.find(8, 3, 4).is_none(), "another buffer");
        // Checked again against fewer: the smaller count is kept.
        t.insert(7, Arc::clone(&e), 3);
        assert!(t.find(7, 3, 3).unwrap().checked);
        t.written(7);
        assert!(t.find(7, 3, 4).is_none());
    }
}
