//! The device copies of recent calls' small read-only arguments.
//!
//! Every kernel call takes a few small host arrays that the kernel only
//! reads: the intervals, the per-detector index arrays and constants, the
//! offset template's per-detector layout. TOAST's operators make the same
//! calls again and again (one call per detector, every iteration of the
//! solver), so the bytes of these arrays repeat. A call looks its arrays up
//! here by their bytes: a copy already on the device is launched from as it
//! is, with no allocation and no upload; a new one is uploaded into a pool
//! buffer that stays here for the next call.
//!
//! An entry is held by the calls using it (`users`) and is never evicted
//! while held, so a call on another thread cannot free a buffer a launch
//! still reads. Beyond [`MAX_ENTRIES`] entries or [`MAX_BYTES`] bytes the
//! least recently used entries that no call holds are evicted (their
//! buffers go back to the pool). Arrays over [`MAX_ARRAY_BYTES`] (a
//! `filter_poly2D` template matrix) are not kept: hashing them each call
//! would cost what their upload does. The buffers are pool buffers: the
//! context's shutdown releases whatever is still here.

use std::collections::HashMap;

/// The largest array kept, in bytes.
pub(crate) const MAX_ARRAY_BYTES: usize = 64 * 1024;
/// The most entries kept.
pub(crate) const MAX_ENTRIES: usize = 1024;
/// The most bytes kept (in all entries).
pub(crate) const MAX_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug)]
struct Entry {
    /// The pool handle of the device copy.
    handle: u64,
    /// The value of the cache's clock at the last use.
    last_use: u64,
    /// Calls holding the entry now.
    users: usize,
}

/// The cache: device copies keyed by the bytes they hold.
#[derive(Debug, Default)]
pub(crate) struct SmallCache {
    entries: HashMap<Box<[u8]>, Entry>,
    /// Handle to key, for [`SmallCache::release`].
    keys: HashMap<u64, Box<[u8]>>,
    clock: u64,
    bytes: usize,
}

/// What [`SmallCache::acquire`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// A device copy of the bytes: its handle, now held by the caller.
    Hit(u64),
    /// None: upload the bytes, then [`SmallCache::insert`] the handle.
    Miss,
}

impl SmallCache {
    /// The device copy of `bytes`, held by the caller until
    /// [`SmallCache::release`], if there is one.
    pub(crate) fn acquire(&mut self, bytes: &[u8]) -> Lookup {
        self.clock += 1;
        match self.entries.get_mut(bytes) {
            Some(e) => {
                e.last_use = self.clock;
                e.users += 1;
                Lookup::Hit(e.handle)
            }
            None => Lookup::Miss,
        }
    }

    /// Keep `handle`, a device copy of `bytes` just uploaded, held by the
    /// caller; returns the handles evicted to make room (to free). Returns
    /// `false` (and keeps nothing) when `bytes` is too large to keep or
    /// another call inserted the same bytes meanwhile: the caller then owns
    /// `handle` alone and frees it after its call.
    pub(crate) fn insert(&mut self, bytes: &[u8], handle: u64) -> (bool, Vec<u64>) {
        if bytes.len() > MAX_ARRAY_BYTES || self.entries.contains_key(bytes) {
            return (false, Vec::new());
        }
        self.clock += 1;
        let key: Box<[u8]> = bytes.into();
        self.bytes += key.len();
        self.keys.insert(handle, key.clone());
        self.entries.insert(
            key,
            Entry {
                handle,
                last_use: self.clock,
                users: 1,
            },
        );
        (true, self.evict())
    }

    /// The call holding `handle` is done with it.
    pub(crate) fn release(&mut self, handle: u64) {
        if let Some(e) = self.keys.get(&handle).and_then(|k| self.entries.get_mut(k)) {
            e.users = e.users.saturating_sub(1);
        }
    }

    /// Remove the least recently used entries no call holds until the
    /// cache is within its limits; their handles.
    fn evict(&mut self) -> Vec<u64> {
        let mut out = Vec::new();
        while self.entries.len() > MAX_ENTRIES || self.bytes > MAX_BYTES {
            let oldest = self
                .entries
                .iter()
                .filter(|(_, e)| e.users == 0)
                .min_by_key(|(_, e)| e.last_use)
                .map(|(k, _)| k.clone());
            let Some(key) = oldest else { break };
            if let Some(e) = self.entries.remove(&key) {
                self.keys.remove(&e.handle);
                self.bytes -= key.len();
                out.push(e.handle);
            }
        }
        out
    }

    /// Entries kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_call_with_the_same_bytes_hits() {
        let mut c = SmallCache::default();
        assert_eq!(c.acquire(b"abc"), Lookup::Miss);
        assert_eq!(c.insert(b"abc", 7), (true, vec![]));
        c.release(7);
        assert_eq!(c.acquire(b"abc"), Lookup::Hit(7));
        c.release(7);
        assert_eq!(c.acquire(b"abd"), Lookup::Miss);
        // Inserted meanwhile by another call: the second copy is not kept.
        assert_eq!(c.insert(b"abc", 8), (false, vec![]));
    }

    #[test]
    fn large_arrays_are_not_kept() {
        let mut c = SmallCache::default();
        let big = vec![1u8; MAX_ARRAY_BYTES + 1];
        assert_eq!(c.insert(&big, 1), (false, vec![]));
        assert_eq!(c.acquire(&big), Lookup::Miss);
    }

    #[test]
    fn the_least_recently_used_free_entry_is_evicted_never_a_held_one() {
        let mut c = SmallCache::default();
        let key = |i: usize| (i as u64).to_le_bytes();
        for i in 0..MAX_ENTRIES {
            assert_eq!(c.insert(&key(i), i as u64), (true, vec![]));
            c.release(i as u64);
        }
        // Entry 0 is held again (used last), entry 1 is the oldest free.
        assert_eq!(c.acquire(&key(0)), Lookup::Hit(0));
        let (kept, evicted) = c.insert(&key(MAX_ENTRIES), 9999);
        assert!(kept);
        assert_eq!(evicted, vec![1]);
        assert_eq!(c.len(), MAX_ENTRIES);
        // Every entry held: nothing can be evicted, the cache grows past
        // its limit rather than free a buffer in use.
        let mut c = SmallCache::default();
        for i in 0..=MAX_ENTRIES {
            assert_eq!(c.insert(&key(i), i as u64).1, vec![]);
        }
        assert_eq!(c.len(), MAX_ENTRIES + 1);
        for i in 0..=MAX_ENTRIES {
            c.release(i as u64);
        }
        assert_eq!(c.insert(&key(MAX_ENTRIES + 1), 5000).1.len(), 2);
    }
}
