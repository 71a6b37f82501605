//! Eviction order of a tier: LIRS (default), LRU or S3-FIFO.
//!
//! The order only ranks blocks; whether a candidate may go (pins, leases,
//! in-flight I/O) is the caller's `eligible` predicate, so pinned blocks are
//! skipped rather than removed from the order.
//!
//! LRU and S3-FIFO keep their queues as linked lists through one slab
//! (`list::Queues`), LIRS its stack and queues as index links through its own
//! slab (`lirs`), so insert, touch and remove are O(1) (amortized for LIRS'
//! stack pruning) and a victim costs the candidates it looks at, whatever
//! the number of blocks in the tier. `lirs` says why it is the default
//! (`bench eviction`'s figures are in docs/BENCHMARKS.md).
//! `insert` hands back the key's [`Slot`]; the caller keeps it (the store in
//! the block's record) and names the key by it to `touch` and `remove`, so
//! the order needs no key index of its own.
//! The decisions are those of the earlier `BTreeMap` LRU and `VecDeque`
//! S3-FIFO; `tests` replays random operations against both and compares.

mod lirs;
#[cfg(test)]
mod lirs_tests;
mod list;
mod s3fifo;
#[cfg(test)]
mod tests;

use crate::keys::BlockKey;
use crate::node_config::{EvictionPolicy, NodeConfig};

pub use lirs::Lirs;
use list::Queues;
pub use list::Slot;
pub use s3fifo::S3Fifo;

/// Ranking of the blocks of one tier.
#[derive(Debug)]
pub enum EvictionOrder {
    Lru(Lru),
    S3Fifo(S3Fifo),
    Lirs(Lirs),
}

impl EvictionOrder {
    /// An empty order of the configured kind (and knobs).
    pub fn new(cfg: &NodeConfig) -> Self {
        match cfg.eviction {
            EvictionPolicy::Lru => EvictionOrder::Lru(Lru::default()),
            EvictionPolicy::S3fifo => EvictionOrder::S3Fifo(S3Fifo::default()),
            EvictionPolicy::Lirs => EvictionOrder::Lirs(Lirs::new(
                cfg.lirs_hir_percent,
                cfg.lirs_history as usize,
                cfg.lirs_idle_factor,
            )),
        }
    }

    /// A block entered the tier (it is not in the order); its slot, valid
    /// until `remove`.
    pub fn insert(&mut self, key: BlockKey) -> Slot {
        match self {
            EvictionOrder::Lru(l) => l.queue.push_back(0, key),
            EvictionOrder::S3Fifo(s) => s.insert(key),
            EvictionOrder::Lirs(l) => l.insert(key),
        }
    }

    /// The block of the tier at `slot` (`key`) was read.
    pub fn touch(&mut self, slot: Slot, key: &BlockKey) {
        match self {
            EvictionOrder::Lru(l) => l.touch(slot, key),
            EvictionOrder::S3Fifo(s) => s.touch(slot, key),
            EvictionOrder::Lirs(l) => l.touch(slot, key),
        }
    }

    /// The block at `slot` (`key`) left the tier (removed, or evicted by the caller).
    pub fn remove(&mut self, slot: Slot, key: &BlockKey) {
        match self {
            EvictionOrder::Lru(l) => l.remove(slot, key),
            EvictionOrder::S3Fifo(s) => s.remove(slot, key),
            EvictionOrder::Lirs(l) => l.remove(slot, key),
        }
    }

    /// Start loading the order's node at `slot` (a hint: a `touch` or
    /// `remove` of it follows soon, and at a million blocks the node is a
    /// DRAM miss that the work between can overlap).
    pub fn prefetch(&self, slot: Slot) {
        match self {
            EvictionOrder::Lru(l) => l.queue.prefetch(slot),
            EvictionOrder::S3Fifo(s) => s.prefetch(slot),
            EvictionOrder::Lirs(l) => l.prefetch(slot),
        }
    }

    /// The next block to evict among those `eligible`; it stays in the order until `remove`.
    pub fn victim(&mut self, eligible: impl FnMut(&BlockKey) -> bool) -> Option<BlockKey> {
        match self {
            EvictionOrder::Lru(l) => l.victim(eligible),
            EvictionOrder::S3Fifo(s) => s.victim(eligible),
            EvictionOrder::Lirs(l) => l.victim(eligible),
        }
    }
}

/// Least recently used: one queue, oldest access at the front.
#[derive(Debug, Default)]
pub struct Lru {
    queue: Queues<1>,
}

impl Lru {
    fn touch(&mut self, s: Slot, key: &BlockKey) {
        debug_assert!(self.queue.holds(s, key), "stale slot {s} for {key:?}");
        self.queue.move_to_back(s, 0);
    }

    fn remove(&mut self, s: Slot, key: &BlockKey) {
        debug_assert!(self.queue.holds(s, key), "stale slot {s} for {key:?}");
        self.queue.remove(s);
    }

    fn victim(&mut self, mut eligible: impl FnMut(&BlockKey) -> bool) -> Option<BlockKey> {
        let mut at = self.queue.front(0);
        while let Some(s) = at {
            let key = self.queue.key(s);
            if eligible(&key) {
                return Some(key);
            }
            at = self.queue.next(s);
        }
        None
    }
}
