//! `BlockMap`: the store's block index, key -> [`Block`], split in two so a
//! lookup at a million blocks costs one cache miss, not three or four.
//!
//! A `hashbrown::HashMap<BlockKey, Block>` keeps the records in its buckets:
//! 152 bytes each, so at 1M blocks the bucket array is ~300 MB, every probe
//! lands in DRAM, and a record spans 3 lines (perf of the metadata-scale
//! bench: the map's `get`/`get_mut`/`contains_key` were ~520 ns of a 1M op
//! against ~120 ns at 10k). Here the hash table holds only a `u32` per key
//! (the index of its record in a slab): at 1M blocks its buckets and
//! control bytes are ~10 MB and mostly stay in the last-level cache, and
//! the record (key and block together) is one slab entry, reached with one
//! miss. The key is compared in the slab entry (the table keeps hashbrown's
//! 7-bit tags, so a probe reads an entry that is not the key's about once
//! in 128 lookups).
//!
//! A freed entry is reused last-in first-out: a put that evicts a block
//! writes its record where the victim's was, which the eviction just read.
//! Both parts live on huge pages (`huge_alloc`). The methods are those of
//! the map this replaces, with the same meaning.

use std::hash::{BuildHasher, RandomState};

use allocator_api2::vec::Vec as HugeVec;
use hashbrown::HashTable;

use crate::huge_alloc::HugeAlloc;
use crate::keys::BlockKey;
use crate::state::Block;

/// One slab entry: a key and its record, or a free entry (`block` None).
#[derive(Debug)]
struct Entry {
    key: BlockKey,
    block: Option<Block>,
}

/// The store's block index (see the module doc).
pub(crate) struct BlockMap {
    hasher: RandomState,
    /// Hash of a key -> index of its entry in `entries`.
    index: HashTable<u32, HugeAlloc>,
    entries: HugeVec<Entry, HugeAlloc>,
    /// Indices of free entries, the last freed on top.
    free: Vec<u32>,
}

impl Default for BlockMap {
    fn default() -> Self {
        BlockMap {
            hasher: RandomState::new(),
            index: HashTable::new_in(HugeAlloc),
            entries: HugeVec::new_in(HugeAlloc),
            free: Vec::new(),
        }
    }
}

impl BlockMap {
    /// Where `key`'s entry is, if it is stored.
    fn find(&self, key: &BlockKey) -> Option<usize> {
        let entries = &self.entries;
        self.index
            .find(self.hasher.hash_one(key), |&i| {
                entries[i as usize].key == *key
            })
            .map(|&i| i as usize)
    }

    pub fn get(&self, key: &BlockKey) -> Option<&Block> {
        self.find(key).and_then(|i| self.entries[i].block.as_ref())
    }

    pub fn get_mut(&mut self, key: &BlockKey) -> Option<&mut Block> {
        let i = self.find(key)?;
        self.entries[i].block.as_mut()
    }

    pub fn contains_key(&self, key: &BlockKey) -> bool {
        self.find(key).is_some()
    }

    /// Store `block` under `key`; the block it replaces, if any.
    pub fn insert(&mut self, key: BlockKey, block: Block) -> Option<Block> {
        let BlockMap {
            hasher,
            index,
            entries,
            free,
        } = self;
        let hash = hasher.hash_one(key);
        let eq = |&i: &u32| entries[i as usize].key == key;
        if let Some(&i) = index.find(hash, eq) {
            return entries[i as usize].block.replace(block);
        }
        let entry = Entry {
            key,
            block: Some(block),
        };
        let i = match free.pop() {
            Some(i) => {
                entries[i as usize] = entry;
                i
            }
            None => {
                let i = u32::try_from(entries.len()).expect("more than 2^32 blocks in one store");
                entries.push(entry);
                i
            }
        };
        index.insert_unique(hash, i, |&j| hasher.hash_one(entries[j as usize].key));
        None
    }

    /// Forget `key`; its block, if it was stored.
    pub fn remove(&mut self, key: &BlockKey) -> Option<Block> {
        let BlockMap {
            hasher,
            index,
            entries,
            free,
        } = self;
        let hash = hasher.hash_one(key);
        let found = index.find_entry(hash, |&i| entries[i as usize].key == *key);
        let (i, _) = found.ok()?.remove();
        free.push(i);
        entries[i as usize].block.take()
    }

    /// Stored keys, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &BlockKey> {
        self.entries
            .iter()
            .filter(|e| e.block.is_some())
            .map(|e| &e.key)
    }

    /// Stored blocks, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &Block> {
        self.entries.iter().filter_map(|e| e.block.as_ref())
    }

    /// Number of stored blocks.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.index.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::keys::{BlockOrder, DType, KvLayout};

    fn block(tag: u64) -> Block {
        Block {
            layout: KvLayout {
                layers: 1,
                kv_heads: 1,
                head_dim: 8,
                dtype: DType::F32,
                block_tokens: 1,
                order: BlockOrder::LayerKvTokenHead,
            },
            len: tag,
            checksum: tag ^ 0x5a5a,
            tokens: 1,
            ram: None,
            disk: None,
            disk_codec: Default::default(),
            ram_slot: 0,
            disk_slot: 0,
            hard_pin: false,
            soft_pin_until: None,
            accesses: 0,
            flushing: false,
        }
    }

    fn key(i: u64) -> BlockKey {
        let mut k = [0u8; 32];
        k[..8].copy_from_slice(&i.to_le_bytes());
        BlockKey(k)
    }

    /// Random inserts, replacements, removals and reads against a std
    /// `HashMap`: the same answers at every step, the same contents at the
    /// end, and the slab does not grow past the most keys held at once.
    #[test]
    fn matches_a_hash_map_under_random_ops() {
        let mut m = BlockMap::default();
        let mut want: HashMap<BlockKey, u64> = HashMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut most = 0;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = key(x % 5000);
            match x >> 60 {
                0..=6 => {
                    let old = m.insert(k, block(step)).map(|b| b.len);
                    assert_eq!(old, want.insert(k, step), "insert at step {step}");
                }
                7..=12 => {
                    let old = m.remove(&k).map(|b| b.len);
                    assert_eq!(old, want.remove(&k), "remove at step {step}");
                }
                _ => {
                    assert_eq!(m.get(&k).map(|b| b.len), want.get(&k).copied());
                    assert_eq!(m.contains_key(&k), want.contains_key(&k));
                    if let Some(b) = m.get_mut(&k) {
                        b.accesses += 1;
                        assert_eq!(m.get(&k).map(|b| b.accesses), Some(1));
                        m.get_mut(&k).unwrap().accesses = 0;
                    }
                }
            }
            assert_eq!(m.len(), want.len());
            most = most.max(want.len());
        }
        assert!(
            m.entries.len() <= most,
            "{} entries for at most {most} keys",
            m.entries.len()
        );
        let mut got: Vec<(BlockKey, u64)> =
            m.keys().copied().zip(m.values().map(|b| b.len)).collect();
        let mut exp: Vec<(BlockKey, u64)> = want.into_iter().collect();
        got.sort();
        exp.sort();
        assert_eq!(got, exp);
        for (k, _) in &exp {
            assert!(m.remove(k).is_some());
        }
        assert_eq!((m.len(), m.keys().count(), m.values().count()), (0, 0, 0));
    }

    /// A freed entry is the next one used: a put after an eviction writes
    /// where the victim's record was.
    #[test]
    fn last_freed_entry_is_reused_first() {
        let mut m = BlockMap::default();
        for i in 0..10 {
            m.insert(key(i), block(i));
        }
        let at = m.find(&key(3)).unwrap();
        m.remove(&key(3));
        m.insert(key(42), block(42));
        assert_eq!(m.find(&key(42)), Some(at));
        assert_eq!(m.entries.len(), 10);
    }
}
