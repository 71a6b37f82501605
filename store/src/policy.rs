//! Eviction order of a tier: adaptive (default: LIRS or LRU, whichever
//! leads on the recent lookups; `adaptive`), LIRS, LRU or S3-FIFO.
//!
//! The order only ranks blocks; whether a candidate may go (pins, leases,
//! in-flight I/O) is the caller's `eligible` predicate, so pinned blocks are
//! skipped rather than removed from the order.
//!
//! LRU and S3-FIFO keep their queues as linked lists through one slab
//! (`list::Queues`), LIRS its stack and queues as index links through its own
//! slab (`lirs`), so insert, touch and remove are O(1) (amortized for LIRS'
//! stack pruning) and a victim costs the candidates it looks at, whatever
//! the number of blocks in the tier. `lirs` says why LIRS, `adaptive` why not LIRS alone
//! (`bench eviction`'s figures are in docs/BENCHMARKS.md).
//! `insert` hands back the key's [`Slot`]; the caller keeps it (the store in
//! the block's record) and names the key by it to `touch` and `remove`, so
//! the order needs no key index of its own. The other way round, `insert`
//! takes the block's record index ([`Rec`]) and `victim_at` hands each
//! candidate's to the eligibility test, so the store reads the candidate's
//! record without probing its block index (at a million blocks the probe
//! was two dependent cache misses before the record's own).
//! `peek` names the block `victim` looks at first, so the store can start
//! loading its record an op ahead.
//! The decisions are those of the earlier `BTreeMap` LRU and `VecDeque`
//! S3-FIFO; `tests` replays random operations against both and compares.

mod adaptive;
#[cfg(test)]
mod adaptive_tests;
mod door;
#[cfg(test)]
mod door_tests;
mod ghosts;
mod lirs;
#[cfg(test)]
mod lirs_tests;
mod list;
mod lru;
mod s3fifo;
mod shadow;
#[cfg(test)]
mod tests;

use crate::keys::BlockKey;
use crate::node_config::{EvictionPolicy, NodeConfig};
use crate::rec::Rec;

pub use adaptive::{Adaptive, AdaptiveKnobs, AdaptiveMode, AdaptiveStats};
pub use door::Door;
pub use lirs::Lirs;
pub(crate) use list::Queues;
pub use list::Slot;
pub use lru::Lru;
pub use s3fifo::S3Fifo;

/// Ranking of the blocks of one tier.
#[derive(Debug)]
pub enum EvictionOrder {
    Lru(Lru),
    S3Fifo(S3Fifo),
    Lirs(Lirs),
    Adaptive(Box<Adaptive>),
    Door(Door),
}

impl EvictionOrder {
    /// An empty order of the configured kind (and knobs).
    pub fn new(cfg: &NodeConfig) -> Self {
        match cfg.eviction {
            EvictionPolicy::Lru => EvictionOrder::Lru(Lru::default()),
            EvictionPolicy::S3fifo => EvictionOrder::S3Fifo(S3Fifo::default()),
            EvictionPolicy::Door => EvictionOrder::Door(Door::default()),
            EvictionPolicy::Lirs => EvictionOrder::Lirs(Lirs::new(
                cfg.lirs_hir_percent,
                cfg.lirs_history as usize,
                cfg.lirs_idle_factor,
            )),
            EvictionPolicy::Adaptive => {
                EvictionOrder::Adaptive(Box::new(Adaptive::new(AdaptiveKnobs {
                    hir_percent: cfg.lirs_hir_percent,
                    history: cfg.lirs_history as usize,
                    idle_factor: cfg.lirs_idle_factor,
                    window: cfg.adaptive_window,
                    margin: cfg.adaptive_margin,
                    sample_rate: cfg.adaptive_sample_rate,
                    confidence: cfg.adaptive_confidence,
                    start: cfg.adaptive_start,
                    burst: cfg.low_watermark / cfg.high_watermark,
                })))
            }
        }
    }

    /// The disk tier's order: the configured one, except that `adaptive`
    /// runs LIRS there (its shadows replay lookups, which the RAM tier sees).
    pub fn for_disk(cfg: &NodeConfig) -> Self {
        match cfg.eviction {
            EvictionPolicy::Adaptive => EvictionOrder::new(&NodeConfig {
                eviction: EvictionPolicy::Lirs,
                ..cfg.clone()
            }),
            _ => EvictionOrder::new(cfg),
        }
    }

    /// The store looked up `keys` (prefix order) and held the first `found`:
    /// `adaptive` replays it on
    /// its shadows; the other orders ignore it.
    pub fn lookup(&mut self, keys: &[BlockKey], found: usize) {
        if let EvictionOrder::Adaptive(a) = self {
            a.lookup(keys, found);
        }
    }

    /// A cluster node's directory shard feeds `adaptive`'s shadows from now
    /// on (see `adaptive`); the other orders have none.
    pub fn feed_from_cluster(&mut self) {
        if let EvictionOrder::Adaptive(a) = self {
            a.feed_from_cluster();
        }
    }

    /// A cluster lookup of the shard's `keys` (chain order), the first
    /// `found` held in the cluster: `adaptive` fed by the cluster replays it.
    pub fn cluster_lookup(&mut self, keys: &[BlockKey], found: usize) {
        if let EvictionOrder::Adaptive(a) = self {
            a.cluster_lookup(keys, found);
        }
    }

    /// The shard's `keys` entered the cluster, `held` of its keys are held
    /// now: `adaptive` fed by the cluster puts them in its shadows.
    pub fn cluster_put(&mut self, keys: &[BlockKey], held: usize) {
        if let EvictionOrder::Adaptive(a) = self {
            a.cluster_put(keys, held);
        }
    }

    /// `adaptive`'s mode and shadow hits (None for the other orders).
    pub fn adaptive_stats(&self) -> Option<AdaptiveStats> {
        match self {
            EvictionOrder::Adaptive(a) => Some(a.stats()),
            _ => None,
        }
    }

    /// A block entered the tier (it is not in the order; its record in the
    /// store's block index is `rec`); its slot, valid until `remove`.
    pub fn insert(&mut self, key: BlockKey, rec: Rec) -> Slot {
        match self {
            EvictionOrder::Lru(l) => l.insert(key, rec),
            EvictionOrder::S3Fifo(s) => s.insert(key, rec),
            EvictionOrder::Lirs(l) => l.insert(key, rec),
            EvictionOrder::Adaptive(a) => a.insert(key, rec),
            EvictionOrder::Door(d) => d.insert(key, rec),
        }
    }

    /// The block of the tier at `slot` (`key`) was read.
    pub fn touch(&mut self, slot: Slot, key: &BlockKey) {
        match self {
            EvictionOrder::Lru(l) => l.touch(slot, key),
            EvictionOrder::S3Fifo(s) => s.touch(slot, key),
            EvictionOrder::Lirs(l) => l.touch(slot, key),
            EvictionOrder::Adaptive(a) => a.touch(slot, key),
            EvictionOrder::Door(d) => d.touch(slot, key),
        }
    }

    /// The block at `slot` (`key`) left the tier (removed, or evicted by the caller).
    pub fn remove(&mut self, slot: Slot, key: &BlockKey) {
        match self {
            EvictionOrder::Lru(l) => l.remove(slot, key),
            EvictionOrder::S3Fifo(s) => s.remove(slot, key),
            EvictionOrder::Lirs(l) => l.remove(slot, key),
            EvictionOrder::Adaptive(a) => a.remove(slot, key),
            EvictionOrder::Door(d) => d.remove(slot, key),
        }
    }

    /// Start loading the order's node at `slot` (a hint: a `touch` or
    /// `remove` of it follows soon, and at a million blocks the node is a
    /// DRAM miss that the work between can overlap).
    pub fn prefetch(&self, slot: Slot) {
        match self {
            EvictionOrder::Lru(l) => l.prefetch(slot),
            EvictionOrder::S3Fifo(s) => s.prefetch(slot),
            EvictionOrder::Lirs(l) => l.prefetch(slot),
            EvictionOrder::Adaptive(a) => a.prefetch(slot),
            EvictionOrder::Door(d) => d.prefetch(slot),
        }
    }

    /// Start loading what inserting `key` reads first (a hint, given when a
    /// put of `key` begins; S3-FIFO tests its ghosts, the others read
    /// nothing of their own).
    pub fn prefetch_insert(&self, key: &BlockKey) {
        if let EvictionOrder::S3Fifo(s) = self {
            s.prefetch_insert(key);
        }
    }

    /// Start loading the order's own parts the next `victim` touches (a
    /// hint, given after a put that leaves the tier full, before `peek`).
    /// LIRS and adaptive prefetch nothing here.
    pub fn prefetch_eviction(&self) {
        match self {
            EvictionOrder::Lru(l) => l.prefetch_eviction(),
            EvictionOrder::S3Fifo(s) => s.prefetch_eviction(),
            EvictionOrder::Door(d) => d.prefetch_eviction(),
            EvictionOrder::Lirs(_) | EvictionOrder::Adaptive(_) => {}
        }
    }

    /// The next block to evict among those `eligible`; it stays in the order until `remove`.
    pub fn victim(&mut self, mut eligible: impl FnMut(&BlockKey) -> bool) -> Option<BlockKey> {
        self.victim_at(|k, _| eligible(k))
    }

    /// `victim`, with each candidate's record (as given to `insert`) passed
    /// to `eligible` beside its key.
    pub fn victim_at(&mut self, eligible: impl FnMut(&BlockKey, Rec) -> bool) -> Option<BlockKey> {
        match self {
            EvictionOrder::Lru(l) => l.victim(eligible),
            EvictionOrder::S3Fifo(s) => s.victim(eligible),
            EvictionOrder::Lirs(l) => l.victim_at(eligible),
            EvictionOrder::Adaptive(a) => a.victim_at(eligible),
            EvictionOrder::Door(d) => d.victim(eligible),
        }
    }

    /// The key and record `victim` looks at first, if it can tell without
    /// changing the order (LRU: the oldest; S3-FIFO: the first block of the
    /// queue it takes from that has not been read, within a few; LIRS: none).
    pub fn peek(&self) -> Option<(BlockKey, Rec)> {
        match self {
            EvictionOrder::Lru(l) => l.peek(),
            EvictionOrder::S3Fifo(s) => s.peek(),
            EvictionOrder::Lirs(_) => None,
            EvictionOrder::Adaptive(a) => a.peek(),
            EvictionOrder::Door(d) => d.peek(),
        }
    }
}
