//! S3-FIFO (Yang et al., SOSP'23) over slab-linked queues.
//!
//! New blocks enter a small FIFO (10%); those read again there move to the
//! main FIFO, the rest leave and are remembered in a ghost queue; a ghost
//! that comes back goes straight to main. Main reinserts blocks read since
//! they were last at its head.
//!
//! The ghost queue keeps the earlier implementation's exact behaviour (and
//! with it the same decisions): a returning ghost leaves the ghost set but
//! its queue entry stays until it ages out, and the queue, stale entries
//! included, is trimmed to the number of live blocks (at least 64) on every
//! removal from small, so it stays bounded.
//!
//! Ghosts are kept as 64-bit fingerprints of their keys (a keyed hash, seeded
//! per order), not as the 32-byte keys: at a million blocks the ghost set is
//! probed on every insert and written twice on every eviction from small,
//! and with 8-byte entries its table is a quarter of the size (16 MB instead
//! of 64 MB), so far more of those probes hit the cache. The decisions are
//! the same unless two keys share a fingerprint (about one pair in 2^64 /
//! n^2 per set of n ghosts); that would send one new block to main instead
//! of small: a ranking choice, never a correctness one.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};

use super::list::{Queues, Slot};
use crate::huge_alloc::HugeAlloc;
use crate::keys::BlockKey;
use crate::state::Rec;

const SMALL: usize = 0;
const MAIN: usize = 1;

/// S3-FIFO ranking of one tier's blocks.
#[derive(Debug)]
pub struct S3Fifo {
    /// Small and main; a node's counter is its read frequency (0..=3).
    queues: Queues<2>,
    /// Fingerprints of the keys that left small, oldest first.
    ghost: VecDeque<u64>,
    /// The fingerprints remembered (on huge pages: up to one per block).
    ghost_set: hashbrown::HashSet<u64, hashbrown::DefaultHashBuilder, HugeAlloc>,
    /// The keyed hash giving a key its fingerprint.
    fingerprint: RandomState,
}

impl Default for S3Fifo {
    fn default() -> Self {
        S3Fifo {
            queues: Queues::default(),
            ghost: VecDeque::new(),
            ghost_set: hashbrown::HashSet::with_hasher_in(Default::default(), HugeAlloc),
            fingerprint: RandomState::new(),
        }
    }
}

impl S3Fifo {
    pub(super) fn insert(&mut self, key: BlockKey, rec: Rec) -> Slot {
        let q = if self.ghost_set.remove(&self.fingerprint.hash_one(key)) {
            MAIN
        } else {
            SMALL
        };
        self.queues.push_back(q, key, rec)
    }

    pub(super) fn touch(&mut self, s: Slot, key: &BlockKey) {
        debug_assert!(self.queues.holds(s, key), "stale slot {s} for {key:?}");
        let f = self.queues.freq(s);
        self.queues.set_freq(s, (f + 1).min(3));
    }

    pub(super) fn remove(&mut self, s: Slot, key: &BlockKey) {
        debug_assert!(self.queues.holds(s, key), "stale slot {s} for {key:?}");
        let (queue, _) = self.queues.remove(s);
        if queue == SMALL {
            let fp = self.fingerprint.hash_one(key);
            self.ghost.push_back(fp);
            self.ghost_set.insert(fp);
            let cap = self.queues.total().max(64);
            while self.ghost.len() > cap {
                if let Some(old) = self.ghost.pop_front() {
                    self.ghost_set.remove(&old);
                }
            }
        }
    }

    pub(super) fn prefetch(&self, s: Slot) {
        self.queues.prefetch(s);
    }

    pub(super) fn victim(
        &mut self,
        mut eligible: impl FnMut(&BlockKey, Rec) -> bool,
    ) -> Option<BlockKey> {
        // Bounded: every block is looked at a few times at most.
        let budget = 4 * self.queues.total() + 4;
        for _ in 0..budget {
            let (small, total) = (self.queues.len(SMALL), self.queues.total());
            let from_small = small > 0 && (small * 10 >= total || self.queues.len(MAIN) == 0);
            if from_small {
                let s = self.queues.front(SMALL)?;
                if self.queues.freq(s) > 0 {
                    self.queues.set_freq(s, 0);
                    self.queues.move_to_back(s, MAIN);
                } else {
                    self.queues.move_to_back(s, SMALL);
                    let key = self.queues.key(s);
                    if eligible(&key, self.queues.rec(s)) {
                        return Some(key);
                    }
                }
            } else {
                let s = self.queues.front(MAIN)?;
                let f = self.queues.freq(s);
                self.queues.move_to_back(s, MAIN);
                if f > 0 {
                    self.queues.set_freq(s, f - 1);
                } else {
                    let key = self.queues.key(s);
                    if eligible(&key, self.queues.rec(s)) {
                        return Some(key);
                    }
                }
            }
        }
        None
    }

    /// The key and record `victim` looks at first, when it would not move
    /// that block first (its read counter is 0).
    pub(super) fn peek(&self) -> Option<(BlockKey, Rec)> {
        let (small, total) = (self.queues.len(SMALL), self.queues.total());
        let from_small = small > 0 && (small * 10 >= total || self.queues.len(MAIN) == 0);
        let s = self.queues.front(if from_small { SMALL } else { MAIN })?;
        (self.queues.freq(s) == 0).then(|| (self.queues.key(s), self.queues.rec(s)))
    }

    /// Whether the key at `s` is in the main queue.
    #[cfg(test)]
    pub(super) fn in_main(&self, s: Slot) -> bool {
        self.queues.queue(s) == MAIN
    }
}
