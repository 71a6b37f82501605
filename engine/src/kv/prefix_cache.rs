//! Block allocation with a local prefix cache keyed by the fabric's block keys.
//!
//! Every block is either free (never holding a reusable prefix), in use
//! (reference count > 0, held by sequences' block tables), or cached (count 0
//! but registered under its `BlockKey`, reusable by a later request with the
//! same prefix). Allocation takes plain free blocks first, then evicts the
//! least recently released cached block. Keys come from
//! `kvfabric_types::KeyChain`, so the same prefix has the same name here, in
//! the fabric and on other nodes.
//!
//! The counts are private to the `kv` module: the engine holds references
//! through the owned handles of [`super::blocks`], which release on drop.

use std::collections::{BTreeMap, HashMap};

use kvfabric_types::BlockKey;

use super::pool::BlockId;

#[derive(Clone, Debug, Default)]
struct Meta {
    refs: u32,
    key: Option<BlockKey>,
    /// LRU stamp while cached (refs == 0 and key set).
    stamp: u64,
}

/// Reference counts, free list and key -> block map of a pool's blocks.
#[derive(Debug)]
pub(super) struct BlockManager {
    meta: Vec<Meta>,
    free: Vec<BlockId>,
    by_key: HashMap<BlockKey, BlockId>,
    lru: BTreeMap<u64, BlockId>,
    clock: u64,
}

impl BlockManager {
    /// Manage `blocks` blocks, all free.
    pub(super) fn new(blocks: usize) -> BlockManager {
        BlockManager {
            meta: vec![Meta::default(); blocks],
            free: (0..blocks as BlockId).rev().collect(),
            by_key: HashMap::new(),
            lru: BTreeMap::new(),
            clock: 0,
        }
    }

    /// Blocks that can be allocated now (free + cached).
    pub(super) fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Blocks currently holding a cached prefix with no user.
    pub(super) fn cached(&self) -> usize {
        self.lru.len()
    }

    /// Take a block (count 1), evicting the least recently used cached block if needed.
    pub(super) fn allocate(&mut self) -> Option<BlockId> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (&stamp, &b) = self.lru.iter().next()?;
                self.lru.remove(&stamp);
                if let Some(k) = self.meta[b as usize].key.take() {
                    self.by_key.remove(&k);
                }
                b
            }
        };
        self.meta[b as usize].refs = 1;
        Some(b)
    }

    /// The longest run of leading `keys` present in the cache; each hit block's count is raised.
    pub(super) fn lookup(&mut self, keys: &[BlockKey]) -> Vec<BlockId> {
        let mut hits = Vec::new();
        for k in keys {
            let Some(&b) = self.by_key.get(k) else { break };
            let m = &mut self.meta[b as usize];
            if m.refs == 0 {
                self.lru.remove(&m.stamp);
            }
            m.refs += 1;
            hits.push(b);
        }
        hits
    }

    /// Take one more reference to a block in use (the connector pins a
    /// block this way while it saves it).
    pub(super) fn retain(&mut self, block: BlockId) {
        let m = &mut self.meta[block as usize];
        assert!(m.refs > 0, "retain of an unreferenced block");
        m.refs += 1;
    }

    /// Name a fully computed block; a key already held by another block is left as is.
    pub(super) fn register(&mut self, block: BlockId, key: BlockKey) {
        if self.by_key.contains_key(&key) || self.meta[block as usize].key.is_some() {
            return;
        }
        self.by_key.insert(key, block);
        self.meta[block as usize].key = Some(key);
    }

    /// The key a block is registered under.
    pub(super) fn key_of(&self, block: BlockId) -> Option<BlockKey> {
        self.meta[block as usize].key
    }

    /// Drop one reference; at zero the block becomes cached (if named) or free.
    pub(super) fn release(&mut self, block: BlockId) {
        let m = &mut self.meta[block as usize];
        assert!(m.refs > 0, "release of an unreferenced block");
        m.refs = m.refs.saturating_sub(1);
        if m.refs > 0 {
            return;
        }
        if m.key.is_some() {
            self.clock += 1;
            m.stamp = self.clock;
            self.lru.insert(self.clock, block);
        } else {
            self.free.push(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u8) -> BlockKey {
        BlockKey([i; 32])
    }

    #[test]
    fn cached_blocks_are_reused_and_evicted_lru() {
        let mut m = BlockManager::new(3);
        let a = m.allocate().expect("a");
        let b = m.allocate().expect("b");
        m.register(a, key(1));
        m.register(b, key(2));
        m.release(a);
        m.release(b);
        assert_eq!(m.available(), 3);
        assert_eq!(m.cached(), 2);
        // Prefix lookup stops at the first miss.
        let hits = m.lookup(&[key(1), key(9), key(2)]);
        assert_eq!(hits, vec![a]);
        m.release(a);
        // a was released after b: b is the least recently used.
        let c = m.allocate().expect("plain free block first");
        assert!(c != a && c != b);
        let d = m.allocate().expect("evicts b");
        assert_eq!(d, b);
        assert!(m.lookup(&[key(2)]).is_empty());
        assert_eq!(m.lookup(&[key(1)]), vec![a]);
        assert!(m.allocate().is_none(), "all blocks in use");
    }

    #[test]
    fn duplicate_keys_keep_the_first_block() {
        let mut m = BlockManager::new(2);
        let a = m.allocate().expect("a");
        let b = m.allocate().expect("b");
        m.register(a, key(1));
        m.register(b, key(1));
        m.release(b);
        assert_eq!(m.cached(), 0, "unnamed block goes back to the free list");
        assert_eq!(m.key_of(a), Some(key(1)));
    }
}
