//! One engine's KV pool as `bench sim` models it: the engine's local prefix
//! cache (`kvfabric_engine::kv`), which an engine consults before the
//! fabric. It holds the blocks of what the engine computed and what it
//! loaded, and when full it drops the least recently used. A block found
//! here crosses no link. Without it the model moved every hit held by
//! another engine, though the real engines found many of those blocks in
//! their own pools: it predicted 1.85x the bytes of a 3-host run
//! (docs/BENCHMARKS.md, "`bench sim` against the 3-host run").
//!
//! The model runs one request per engine at a time, so the whole pool is
//! cache between requests; the engine's in-use blocks are not set aside.

use std::collections::{BTreeMap, HashMap};

use kvfabric_store::BlockKey;

/// The keys one engine's pool holds, least recently used first out.
#[derive(Debug, Default)]
pub struct LocalPool {
    capacity: usize,
    stamp_of: HashMap<BlockKey, u64>,
    by_stamp: BTreeMap<u64, BlockKey>,
    clock: u64,
}

impl LocalPool {
    /// A pool of `capacity` blocks (0: the engine keeps no prefix cache).
    pub fn new(capacity: usize) -> LocalPool {
        LocalPool {
            capacity,
            ..LocalPool::default()
        }
    }

    /// How many of `keys`, from the first, the pool holds (the engine's
    /// longest cached prefix).
    pub fn prefix(&self, keys: &[BlockKey]) -> usize {
        keys.iter()
            .take_while(|k| self.stamp_of.contains_key(k))
            .count()
    }

    /// The engine used `keys` (computed or loaded them): each becomes the
    /// most recently used, in order, dropping the oldest past capacity.
    pub fn touch(&mut self, keys: &[BlockKey]) {
        if self.capacity == 0 {
            return;
        }
        for k in keys {
            self.clock += 1;
            if let Some(old) = self.stamp_of.insert(*k, self.clock) {
                self.by_stamp.remove(&old);
            }
            self.by_stamp.insert(self.clock, *k);
            while self.stamp_of.len() > self.capacity {
                let Some((_, oldest)) = self.by_stamp.pop_first() else {
                    break;
                };
                self.stamp_of.remove(&oldest);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.stamp_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stamp_of.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u8) -> BlockKey {
        BlockKey([i; 32])
    }

    #[test]
    fn the_prefix_stops_at_the_first_missing_block() {
        let mut p = LocalPool::new(10);
        p.touch(&[key(1), key(2), key(4)]);
        assert_eq!(p.prefix(&[key(1), key(2), key(3), key(4)]), 2);
        assert_eq!(p.prefix(&[key(2), key(1)]), 2);
        assert_eq!(p.prefix(&[key(3), key(1)]), 0);
    }

    #[test]
    fn a_full_pool_drops_the_least_recently_used() {
        let mut p = LocalPool::new(3);
        p.touch(&[key(1), key(2), key(3)]);
        p.touch(&[key(1)]);
        p.touch(&[key(4)]);
        assert_eq!(p.len(), 3);
        assert_eq!(p.prefix(&[key(2)]), 0, "2 was the oldest");
        assert_eq!(p.prefix(&[key(1), key(3), key(4)]), 3);
    }

    #[test]
    fn a_pool_of_nothing_keeps_nothing() {
        let mut p = LocalPool::new(0);
        p.touch(&[key(1)]);
        assert!(p.is_empty());
        assert_eq!(p.prefix(&[key(1)]), 0);
    }
}
