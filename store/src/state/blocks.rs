//! `BlockMap`: the store's block index, key -> [`Block`], split in two so a
//! lookup at a million blocks costs one cache miss per part, and the misses
//! of both parts can be started together.
//!
//! The records (key and block together) live in a slab; an entry's index
//! there (a [`Rec`]) is stable while its key is stored, and freed entries
//! are reused last-in first-out (a put that evicts a block writes its
//! record where the victim's was, which the eviction just read). The index
//! from key to record is a [`ProbeTable`] (open addressing, linear probing)
//! of 8-byte slots (32 bits of the key's hash, the record's index): at 1M
//! blocks 2^21 slots, 16 MB, and a probe reads one line.
//!
//! Why not `hashbrown::HashTable<u32>` (what this replaces): its probe
//! reads a control group, then the bucket, then the record: three dependent
//! misses at 1M, and a caller that knows which key it needs next cannot
//! start the loads early (the table has no prefetch). Here the slot of a
//! key is a function of its hash alone ([`BlockMap::prefetch_key`]), and a
//! caller that holds a `Rec` (the eviction orders keep their blocks' `Rec`s)
//! reaches the record with no probe ([`BlockMap::prefetch_rec`],
//! [`BlockMap::at`]): the eviction of a victim loads its record and its
//! index slot in parallel. The key is compared in the record only when 32
//! bits of hash match, so a lookup reads a record that is not the key's
//! about once per 2^(32 - log2 slots) slots it passes.
//!
//! Keys come from clients, so the hash is keyed (SipHash, seeded per map):
//! nobody can pick keys that pile onto one run of slots. The last key's
//! hash is memoized: an op asks about the same key several times (reserve,
//! commit, evict), and a 32-byte compare costs less than SipHash.
//! Both parts live on huge pages (`huge_alloc`). The methods are those of
//! the map this replaces, with the same meaning, plus the `Rec` ones.

use std::cell::Cell;
use std::hash::{BuildHasher, RandomState};

use allocator_api2::vec::Vec as HugeVec;

use super::block::Block;
use crate::huge_alloc::{prefetch, HugeAlloc};
use crate::keys::BlockKey;
use crate::probe::ProbeTable;

use crate::rec::Rec;

/// One slab entry: a key and its record, or a free entry (`block` None).
#[derive(Debug)]
struct Entry {
    key: BlockKey,
    block: Option<Block>,
}

/// The upper 32 bits of a key's hash: the table position is its top bits,
/// and all 32 are compared before a record is read.
fn hash32(h: u64) -> u32 {
    (h >> 32) as u32
}

/// The index slot of a record: `hash32 << 32 | rec` (never `probe::EMPTY`:
/// no record has index `u32::MAX`, see `insert`).
fn slot(h32: u32, rec: Rec) -> u64 {
    (u64::from(h32) << 32) | u64::from(rec)
}

/// The store's block index (see the module doc).
pub(crate) struct BlockMap {
    hasher: RandomState,
    /// Key -> record, by `slot`.
    index: ProbeTable,
    entries: HugeVec<Entry, HugeAlloc>,
    /// Indices of free entries, the last freed on top.
    free: Vec<Rec>,
    /// The last key hashed and its hash.
    memo: Cell<(BlockKey, u64)>,
}

impl Default for BlockMap {
    fn default() -> Self {
        let hasher = RandomState::new();
        let zero = BlockKey([0u8; 32]);
        let memo = Cell::new((zero, hasher.hash_one(zero)));
        BlockMap {
            hasher,
            index: ProbeTable::default(),
            entries: HugeVec::new_in(HugeAlloc),
            free: Vec::new(),
            memo,
        }
    }
}

impl BlockMap {
    /// `key`'s hash (memoized for the last key asked about).
    fn hash(&self, key: &BlockKey) -> u64 {
        let (k, h) = self.memo.get();
        if k == *key {
            return h;
        }
        let h = self.hasher.hash_one(key);
        self.memo.set((*key, h));
        h
    }

    /// The index position holding `key` and its record, if it is stored.
    fn find(&self, key: &BlockKey) -> Option<(usize, Rec)> {
        let h32 = hash32(self.hash(key));
        self.index
            .find(slot(h32, 0), |s| {
                hash32(s) == h32 && self.entries[s as Rec as usize].key == *key
            })
            .map(|(i, s)| (i, s as Rec))
    }

    /// Start loading the index slot of `key` (a hint: a lookup, insert or
    /// removal of it follows soon). Costs the key's hash, which is memoized.
    pub fn prefetch_key(&self, key: &BlockKey) {
        self.index.prefetch(slot(hash32(self.hash(key)), 0));
    }

    /// Start loading the record `rec` (a hint, like `prefetch_key`).
    pub fn prefetch_rec(&self, rec: Rec) {
        if let Some(e) = self.entries.get(rec as usize) {
            prefetch(e);
        }
    }

    /// The record of `key`, if it is stored.
    #[cfg(test)]
    pub fn rec(&self, key: &BlockKey) -> Option<Rec> {
        self.find(key).map(|(_, r)| r)
    }

    /// The key and block at `rec`, if a key is stored there.
    pub fn at(&self, rec: Rec) -> Option<(&BlockKey, &Block)> {
        let e = self.entries.get(rec as usize)?;
        e.block.as_ref().map(|b| (&e.key, b))
    }

    /// The block at `rec`, if a key is stored there.
    pub fn at_mut(&mut self, rec: Rec) -> Option<&mut Block> {
        self.entries.get_mut(rec as usize)?.block.as_mut()
    }

    pub fn get(&self, key: &BlockKey) -> Option<&Block> {
        let (_, rec) = self.find(key)?;
        self.entries[rec as usize].block.as_ref()
    }

    pub fn get_mut(&mut self, key: &BlockKey) -> Option<&mut Block> {
        let (_, rec) = self.find(key)?;
        self.entries[rec as usize].block.as_mut()
    }

    /// The record of `key` and its block, if it is stored.
    pub fn get_mut_rec(&mut self, key: &BlockKey) -> Option<(Rec, &mut Block)> {
        let (_, rec) = self.find(key)?;
        let b = self.entries[rec as usize].block.as_mut()?;
        Some((rec, b))
    }

    pub fn contains_key(&self, key: &BlockKey) -> bool {
        self.find(key).is_some()
    }

    /// Store `block` under `key`: its record, and the block it replaces, if any.
    pub fn insert(&mut self, key: BlockKey, block: Block) -> (Rec, Option<Block>) {
        if let Some((_, rec)) = self.find(&key) {
            return (rec, self.entries[rec as usize].block.replace(block));
        }
        let entry = Entry {
            key,
            block: Some(block),
        };
        let rec = match self.free.pop() {
            Some(rec) => {
                self.entries[rec as usize] = entry;
                rec
            }
            None => {
                let rec = Rec::try_from(self.entries.len())
                    .ok()
                    .filter(|&r| r != Rec::MAX)
                    .expect("more than 2^32 - 1 blocks in one store");
                self.entries.push(entry);
                rec
            }
        };
        self.index.insert(slot(hash32(self.hash(&key)), rec));
        (rec, None)
    }

    /// Free the index position `i` and the record `rec` it names; the block.
    fn take(&mut self, i: usize, rec: Rec) -> Option<Block> {
        self.index.remove_at(i);
        self.free.push(rec);
        self.entries[rec as usize].block.take()
    }

    /// Forget `key`; its block, if it was stored.
    pub fn remove(&mut self, key: &BlockKey) -> Option<Block> {
        let (i, rec) = self.find(key)?;
        self.take(i, rec)
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
            owner: Default::default(),
            ram_owner_slot: 0,
            disk_owner_slot: 0,
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
                0..=5 => {
                    let old = m.insert(k, block(step)).1.map(|b| b.len);
                    assert_eq!(old, want.insert(k, step), "insert at step {step}");
                }
                6..=12 => {
                    let old = m.remove(&k).map(|b| b.len);
                    assert_eq!(old, want.remove(&k), "remove at step {step}");
                }
                _ => {
                    assert_eq!(m.get(&k).map(|b| b.len), want.get(&k).copied());
                    assert_eq!(m.contains_key(&k), want.contains_key(&k));
                    if let Some(r) = m.rec(&k) {
                        let (at_key, b) = m.at(r).unwrap();
                        assert_eq!((*at_key, Some(b.len)), (k, want.get(&k).copied()));
                    }
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
        assert!(m.index.is_clear(), "a slot outlived its key");
    }

    /// A freed entry is the next one used: a put after an eviction writes
    /// where the victim's record was.
    #[test]
    fn last_freed_entry_is_reused_first() {
        let mut m = BlockMap::default();
        for i in 0..10 {
            m.insert(key(i), block(i));
        }
        let at = m.rec(&key(3)).unwrap();
        m.remove(&key(3));
        assert_eq!(m.insert(key(42), block(42)).0, at);
        assert_eq!(m.rec(&key(42)), Some(at));
        assert_eq!(m.entries.len(), 10);
    }
}
