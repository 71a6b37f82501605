//! Eviction order of a tier: LRU (default) or S3-FIFO.
//!
//! The order only ranks blocks; whether a candidate may go (pins, leases,
//! in-flight I/O) is the caller's `eligible` predicate, so pinned blocks are
//! skipped rather than removed from the order.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use crate::config::EvictionPolicy;
use crate::keys::BlockKey;

/// Ranking of the blocks of one tier.
#[derive(Debug)]
pub enum EvictionOrder {
    Lru(Lru),
    S3Fifo(S3Fifo),
}

impl EvictionOrder {
    /// An empty order of the configured kind.
    pub fn new(policy: EvictionPolicy) -> Self {
        match policy {
            EvictionPolicy::Lru => EvictionOrder::Lru(Lru::default()),
            EvictionPolicy::S3fifo => EvictionOrder::S3Fifo(S3Fifo::default()),
        }
    }

    /// A block entered the tier.
    pub fn insert(&mut self, key: BlockKey) {
        match self {
            EvictionOrder::Lru(l) => l.touch(key),
            EvictionOrder::S3Fifo(s) => s.insert(key),
        }
    }

    /// A block of the tier was read.
    pub fn touch(&mut self, key: BlockKey) {
        match self {
            EvictionOrder::Lru(l) => l.touch(key),
            EvictionOrder::S3Fifo(s) => s.touch(key),
        }
    }

    /// A block left the tier (removed, or evicted by the caller).
    pub fn remove(&mut self, key: &BlockKey) {
        match self {
            EvictionOrder::Lru(l) => l.remove(key),
            EvictionOrder::S3Fifo(s) => s.remove(key),
        }
    }

    /// The next block to evict among those `eligible`; it stays in the order until `remove`.
    pub fn victim(&mut self, eligible: impl FnMut(&BlockKey) -> bool) -> Option<BlockKey> {
        match self {
            EvictionOrder::Lru(l) => l.victim(eligible),
            EvictionOrder::S3Fifo(s) => s.victim(eligible),
        }
    }
}

/// Least recently used: a tick per access, oldest tick first.
#[derive(Debug, Default)]
pub struct Lru {
    tick: u64,
    by_tick: BTreeMap<u64, BlockKey>,
    ticks: HashMap<BlockKey, u64>,
}

impl Lru {
    fn touch(&mut self, key: BlockKey) {
        self.tick += 1;
        if let Some(old) = self.ticks.insert(key, self.tick) {
            self.by_tick.remove(&old);
        }
        self.by_tick.insert(self.tick, key);
    }

    fn remove(&mut self, key: &BlockKey) {
        if let Some(t) = self.ticks.remove(key) {
            self.by_tick.remove(&t);
        }
    }

    fn victim(&mut self, mut eligible: impl FnMut(&BlockKey) -> bool) -> Option<BlockKey> {
        self.by_tick.values().find(|k| eligible(k)).copied()
    }
}

/// S3-FIFO (Yang et al., SOSP'23): new blocks enter a small FIFO (10%); those
/// read again there move to the main FIFO, the rest leave and are remembered
/// in a ghost queue; a ghost that comes back goes straight to main. Main
/// reinserts blocks read since they were last at its head.
#[derive(Debug, Default)]
pub struct S3Fifo {
    small: VecDeque<BlockKey>,
    main: VecDeque<BlockKey>,
    freq: HashMap<BlockKey, u8>,
    in_main: HashSet<BlockKey>,
    ghost: VecDeque<BlockKey>,
    ghost_set: HashSet<BlockKey>,
}

impl S3Fifo {
    fn insert(&mut self, key: BlockKey) {
        if self.freq.contains_key(&key) {
            self.touch(key);
            return;
        }
        self.freq.insert(key, 0);
        if self.ghost_set.remove(&key) {
            self.main.push_back(key);
            self.in_main.insert(key);
        } else {
            self.small.push_back(key);
        }
    }

    fn touch(&mut self, key: BlockKey) {
        if let Some(f) = self.freq.get_mut(&key) {
            *f = (*f + 1).min(3);
        }
    }

    fn remove(&mut self, key: &BlockKey) {
        if self.freq.remove(key).is_none() {
            return;
        }
        if self.in_main.remove(key) {
            self.main.retain(|k| k != key);
        } else {
            self.small.retain(|k| k != key);
            self.ghost.push_back(*key);
            self.ghost_set.insert(*key);
            let cap = (self.freq.len()).max(64);
            while self.ghost.len() > cap {
                if let Some(old) = self.ghost.pop_front() {
                    self.ghost_set.remove(&old);
                }
            }
        }
    }

    fn victim(&mut self, mut eligible: impl FnMut(&BlockKey) -> bool) -> Option<BlockKey> {
        // Bounded: every block is looked at a few times at most.
        let budget = 4 * (self.small.len() + self.main.len()) + 4;
        for _ in 0..budget {
            let total = self.small.len() + self.main.len();
            let from_small =
                !self.small.is_empty() && (self.small.len() * 10 >= total || self.main.is_empty());
            if from_small {
                let key = self.small.pop_front()?;
                let f = self.freq.get(&key).copied().unwrap_or(0);
                if f > 0 {
                    self.freq.insert(key, 0);
                    self.main.push_back(key);
                    self.in_main.insert(key);
                } else {
                    self.small.push_back(key);
                    if eligible(&key) {
                        return Some(key);
                    }
                }
            } else {
                let key = self.main.pop_front()?;
                let f = self.freq.get(&key).copied().unwrap_or(0);
                self.main.push_back(key);
                if f > 0 {
                    self.freq.insert(key, f - 1);
                } else if eligible(&key) {
                    return Some(key);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(i: u8) -> BlockKey {
        BlockKey([i; 32])
    }

    #[test]
    fn lru_evicts_least_recent_and_skips_ineligible() {
        let mut o = EvictionOrder::new(EvictionPolicy::Lru);
        for i in 0..4 {
            o.insert(k(i));
        }
        o.touch(k(0));
        assert_eq!(o.victim(|_| true), Some(k(1)));
        assert_eq!(o.victim(|x| *x != k(1)), Some(k(2)));
        o.remove(&k(1));
        o.remove(&k(2));
        o.remove(&k(3));
        assert_eq!(o.victim(|_| true), Some(k(0)));
        assert_eq!(o.victim(|_| false), None);
    }

    #[test]
    fn s3fifo_keeps_reread_blocks_over_one_hit_wonders() {
        let mut o = EvictionOrder::new(EvictionPolicy::S3fifo);
        for i in 0..10 {
            o.insert(k(i));
        }
        o.touch(k(0));
        o.touch(k(1));
        // Evict 8 one-hit wonders: the two re-read blocks must survive.
        for _ in 0..8 {
            let v = o.victim(|_| true).unwrap();
            assert!(v != k(0) && v != k(1), "evicted a re-read block");
            o.remove(&v);
        }
        assert_eq!(o.victim(|_| false), None);
        // A ghost coming back goes to main.
        o.insert(k(5));
        if let EvictionOrder::S3Fifo(s) = &o {
            assert!(s.in_main.contains(&k(5)));
        }
    }
}
