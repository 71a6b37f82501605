//! Least recently used: one slab-linked queue, the oldest access at the
//! front. The baseline order, and the second order the adaptive order keeps
//! (its shadow and its residents' list).

use super::list::{Queues, Slot};
use crate::keys::BlockKey;
use crate::rec::Rec;

/// Least recently used: one queue, oldest access at the front.
#[derive(Debug, Default)]
pub struct Lru {
    queue: Queues<1>,
}

impl Lru {
    pub(super) fn insert(&mut self, key: BlockKey, rec: Rec) -> Slot {
        self.queue.push_back(0, key, rec)
    }

    /// Blocks queued.
    pub(super) fn len(&self) -> usize {
        self.queue.total()
    }

    pub(super) fn prefetch(&self, s: Slot) {
        self.queue.prefetch(s);
    }

    /// The oldest block, which `victim` looks at first.
    pub(super) fn peek(&self) -> Option<(BlockKey, Rec)> {
        self.queue
            .front(0)
            .map(|s| (self.queue.key(s), self.queue.rec(s)))
    }

    /// Start loading the node after the oldest (evicting the oldest
    /// unlinks it, which writes that node).
    pub(super) fn prefetch_eviction(&self) {
        if let Some(next) = self.queue.front(0).and_then(|s| self.queue.next(s)) {
            self.queue.prefetch(next);
        }
    }

    pub(super) fn touch(&mut self, s: Slot, key: &BlockKey) {
        debug_assert!(self.queue.holds(s, key), "stale slot {s} for {key:?}");
        self.queue.move_to_back(s, 0);
    }

    pub(super) fn remove(&mut self, s: Slot, key: &BlockKey) {
        debug_assert!(self.queue.holds(s, key), "stale slot {s} for {key:?}");
        self.queue.remove(s);
    }

    pub(super) fn victim(
        &mut self,
        mut eligible: impl FnMut(&BlockKey, Rec) -> bool,
    ) -> Option<BlockKey> {
        let mut at = self.queue.front(0);
        while let Some(s) = at {
            let key = self.queue.key(s);
            if eligible(&key, self.queue.rec(s)) {
                return Some(key);
            }
            at = self.queue.next(s);
        }
        None
    }
}
