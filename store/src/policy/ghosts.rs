//! S3-FIFO's ghost queue: fingerprints of the keys that left the small
//! queue, oldest first, and the set of them an insert is tested against.
//!
//! The behaviour is the earlier implementation's exactly (and with it the
//! order's decisions): a returning ghost leaves the set but its queue entry
//! stays until it ages out, and the queue, stale entries included, is
//! trimmed to a bound the caller gives (the number of live blocks) on every
//! removal from small, so it stays bounded.
//!
//! Ghosts are 64-bit fingerprints of their keys (a keyed hash, seeded per
//! order), not the 32-byte keys: at a million blocks the set is probed on
//! every insert and written twice on every eviction from small, and with
//! 8-byte entries it is a quarter of the size. The decisions are the same
//! unless two keys share a fingerprint (about one pair in 2^64 / n^2 per
//! set of n ghosts); that would send one new block to main instead of
//! small: a ranking choice, never a correctness one.
//!
//! The set is a [`ProbeTable`] (not `hashbrown`): a fingerprint's slot is a
//! function of the fingerprint, so the store starts loading the three slots
//! an eviction and the following insert touch one op ahead (the new key's
//! at reserve, the victim's and the oldest ghost's after the previous put);
//! each was a DRAM miss at a million blocks. The last two keys'
//! fingerprints are memoized: each is asked for twice (prefetch, then use).

use std::cell::Cell;
use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};

use crate::keys::BlockKey;
use crate::probe::{ProbeTable, EMPTY};

/// The ghost queue and set of one S3-FIFO order.
pub(super) struct Ghosts {
    /// Fingerprints of the keys that left small, oldest first.
    fifo: VecDeque<u64>,
    /// The fingerprints remembered (at most one entry each).
    set: ProbeTable,
    /// The keyed hash giving a key its fingerprint.
    hasher: RandomState,
    /// The last two keys fingerprinted, the newest first.
    memo: Cell<[(BlockKey, u64); 2]>,
}

impl std::fmt::Debug for Ghosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ghosts")
            .field("queued", &self.fifo.len())
            .field("remembered", &self.set.len())
            .finish()
    }
}

impl Default for Ghosts {
    fn default() -> Self {
        let hasher = RandomState::new();
        let zero = BlockKey([0u8; 32]);
        let fp = Self::fingerprint_with(&hasher, &zero);
        Ghosts {
            fifo: VecDeque::new(),
            set: ProbeTable::default(),
            hasher,
            memo: Cell::new([(zero, fp); 2]),
        }
    }
}

impl Ghosts {
    fn fingerprint_with(hasher: &RandomState, key: &BlockKey) -> u64 {
        // `EMPTY` is no slot value; its one key in 2^64 shares the next.
        hasher.hash_one(key).min(EMPTY - 1)
    }

    /// `key`'s fingerprint (memoized for the last two keys).
    fn fingerprint(&self, key: &BlockKey) -> u64 {
        let [a, b] = self.memo.get();
        if a.0 == *key {
            return a.1;
        }
        if b.0 == *key {
            return b.1;
        }
        let fp = Self::fingerprint_with(&self.hasher, key);
        self.memo.set([(*key, fp), a]);
        fp
    }

    fn position(&self, fp: u64) -> Option<usize> {
        self.set.find(fp, |s| s == fp).map(|(i, _)| i)
    }

    /// Whether `key` was a ghost; it no longer is (its queue entry stays).
    pub fn take(&mut self, key: &BlockKey) -> bool {
        match self.position(self.fingerprint(key)) {
            Some(i) => {
                self.set.remove_at(i);
                true
            }
            None => false,
        }
    }

    /// `key` left small: remember it, then trim the queue to `cap` entries.
    pub fn remember(&mut self, key: &BlockKey, cap: usize) {
        let fp = self.fingerprint(key);
        self.fifo.push_back(fp);
        if self.position(fp).is_none() {
            self.set.insert(fp);
        }
        while self.fifo.len() > cap {
            if let Some(old) = self.fifo.pop_front() {
                if let Some(i) = self.position(old) {
                    self.set.remove_at(i);
                }
            }
        }
    }

    /// Start loading the slot `take(key)` or `remember(key)` reads first.
    pub fn prefetch(&self, key: &BlockKey) {
        self.set.prefetch(self.fingerprint(key));
    }

    /// Start loading the slot of the oldest ghost (the next trim's).
    pub fn prefetch_oldest(&self) {
        if let Some(&fp) = self.fifo.front() {
            self.set.prefetch(fp);
        }
    }
}
