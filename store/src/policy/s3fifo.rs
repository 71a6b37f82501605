//! S3-FIFO (Yang et al., SOSP'23) over slab-linked queues.
//!
//! New blocks enter a small FIFO (10%); those read again there move to the
//! main FIFO, the rest leave and are remembered in a ghost queue; a ghost
//! that comes back goes straight to main. Main reinserts blocks read since
//! they were last at its head.
//!
//! The ghost queue (`ghosts`) remembers fingerprints of the keys that
//! left small; it says why they are fingerprints in a prefetchable table.
//!
//! At a million blocks every node the victim search reaches is a DRAM miss,
//! and unlinking a queue's head writes the node after it (its `prev`): the
//! store calls `prefetch_eviction` after a put, which starts loading the
//! node after each queue's head and the ghost slots the next eviction
//! writes, and `peek` follows the small queue's head past blocks that would
//! move to main, so the store can prefetch the record of the block that
//! will actually be evicted.

use super::ghosts::Ghosts;
use super::list::{Queues, Slot};
use crate::keys::BlockKey;
use crate::rec::Rec;

const SMALL: usize = 0;
const MAIN: usize = 1;

/// S3-FIFO ranking of one tier's blocks.
#[derive(Debug, Default)]
pub struct S3Fifo {
    /// Small and main; a node's counter is its read frequency (0..=3).
    queues: Queues<2>,
    /// The keys that left small.
    ghosts: Ghosts,
}

/// How far `peek` follows the small queue past blocks that move to main.
const PEEK_STEPS: usize = 4;

impl S3Fifo {
    pub(super) fn insert(&mut self, key: BlockKey, rec: Rec) -> Slot {
        let q = if self.ghosts.take(&key) { MAIN } else { SMALL };
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
            self.ghosts.remember(key, self.queues.total().max(64));
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
            let (small, main) = (self.queues.len(SMALL), self.queues.len(MAIN));
            if Self::from_small(small, main, self.queues.total()) {
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

    /// Whether `victim` takes its next candidate from small, with `small`
    /// of the `total` blocks there and `main` in main.
    fn from_small(small: usize, main: usize, total: usize) -> bool {
        small > 0 && (small * 10 >= total || main == 0)
    }

    /// The key and record `victim` looks at first, when it can tell within
    /// `PEEK_STEPS` nodes without changing the order (see `peek_slot`).
    pub(super) fn peek(&self) -> Option<(BlockKey, Rec)> {
        self.peek_slot()
            .map(|s| (self.queues.key(s), self.queues.rec(s)))
    }

    /// The slot `victim` looks at first: it follows small past read blocks
    /// (which `victim` moves to main) and stops at a read block of main
    /// (which `victim` moves to main's back).
    fn peek_slot(&self) -> Option<Slot> {
        let (mut small, mut main) = (self.queues.len(SMALL), self.queues.len(MAIN));
        let total = self.queues.total();
        let mut head = self.queues.front(SMALL);
        for _ in 0..PEEK_STEPS {
            let s = if Self::from_small(small, main, total) {
                head?
            } else {
                self.queues.front(MAIN)?
            };
            if self.queues.freq(s) == 0 {
                return Some(s);
            }
            // A read block of small moves to main's back (unless main was
            // empty: then it is main's head, and this walk stops); one of
            // main would go to main's back: stop.
            if self.queues.queue(s) != SMALL || main == 0 {
                return None;
            }
            (small, main) = (small - 1, main + 1);
            head = self.queues.next(s);
        }
        None
    }

    /// Start loading what the next eviction touches first: the nodes after
    /// each queue's head (unlinking a head writes the node after it; an
    /// eviction may move a read block of small to main first, so small is
    /// loaded two deep: the nearer one was loaded by the previous call), and
    /// the ghost slots an eviction from small writes (the victim's and the
    /// oldest ghost's, which the trim removes).
    pub(super) fn prefetch_eviction(&self) {
        let after = |s: Slot| self.queues.next(s);
        if let Some(second) = self.queues.front(SMALL).and_then(after) {
            self.queues.prefetch(second);
            if let Some(third) = after(second) {
                self.queues.prefetch(third);
            }
        }
        if let Some(second) = self.queues.front(MAIN).and_then(after) {
            self.queues.prefetch(second);
        }
        if let Some(s) = self.peek_slot().filter(|&s| self.queues.queue(s) == SMALL) {
            self.ghosts.prefetch(&self.queues.key(s));
            self.ghosts.prefetch_oldest();
        }
    }

    /// Start loading the ghost slot `insert(key)` tests.
    pub(super) fn prefetch_insert(&self, key: &BlockKey) {
        self.ghosts.prefetch(key);
    }

    /// Whether the key at `s` is in the main queue.
    #[cfg(test)]
    pub(super) fn in_main(&self, s: Slot) -> bool {
        self.queues.queue(s) == MAIN
    }
}
