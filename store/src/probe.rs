//! `ProbeTable`: an open-addressing table of 8-byte slots with linear
//! probing, the part of a hash index whose position a caller can compute
//! (and so prefetch) before it needs the entry.
//!
//! A slot is any `u64` but [`EMPTY`]; its upper bits are its hash: a slot's
//! home is the top `log2(len)` bits, so a caller that knows the hash knows
//! where the probe starts ([`ProbeTable::prefetch`]) without reading the
//! table. What the other bits mean is the owner's: the block index keeps
//! 32 hash bits and a record index, S3-FIFO's ghost set a 64-bit
//! fingerprint. At most 3/4 of the slots are used (a probe reads ~1.5 slots
//! on average, one cache line), and removal shifts the following slots
//! back (no tombstones, so the table never needs a cleanup pass).
//!
//! Why not `hashbrown`: its probe reads a control group, then the bucket:
//! two dependent misses at a million entries, and no position a caller can
//! load early. The table lives on huge pages (`huge_alloc`).

use allocator_api2::vec::Vec as HugeVec;

use crate::huge_alloc::{prefetch, HugeAlloc};

/// A slot holding nothing.
pub(crate) const EMPTY: u64 = u64::MAX;

/// The smallest table (a power of two).
const MIN_SLOTS: usize = 16;

/// Slots whose upper bits are their hash (see the module doc).
pub(crate) struct ProbeTable {
    /// `slots.len()` is a power of two, at most 3/4 of it used.
    slots: HugeVec<u64, HugeAlloc>,
    /// log2 of `slots.len()`.
    bits: u32,
    /// Slots used.
    len: usize,
}

impl Default for ProbeTable {
    fn default() -> Self {
        let mut slots = HugeVec::new_in(HugeAlloc);
        slots.resize(MIN_SLOTS, EMPTY);
        ProbeTable {
            slots,
            bits: MIN_SLOTS.trailing_zeros(),
            len: 0,
        }
    }
}

impl ProbeTable {
    /// The slot a hash (or a slot carrying it) starts probing at.
    fn home(&self, h: u64) -> usize {
        (h >> (64 - self.bits)) as usize
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Slots used.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The first slot from `h`'s home for which `is` holds, before an empty
    /// one: its position and value.
    #[inline]
    pub fn find(&self, h: u64, mut is: impl FnMut(u64) -> bool) -> Option<(usize, u64)> {
        let mut i = self.home(h);
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if is(s) {
                return Some((i, s));
            }
            i = (i + 1) & self.mask();
        }
    }

    /// Start loading the line a probe for `h` reads first (a hint).
    #[inline]
    pub fn prefetch(&self, h: u64) {
        prefetch(&self.slots[self.home(h)]);
    }

    /// Add `slot` (not [`EMPTY`]; the caller knows no equal entry is there).
    pub fn insert(&mut self, slot: u64) {
        debug_assert_ne!(slot, EMPTY, "EMPTY is not a slot value");
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        self.place(slot);
        self.len += 1;
    }

    /// Empty position `i` (a `find` result) and shift the run after it
    /// back, so that every slot stays reachable from its home without
    /// passing an empty one.
    pub fn remove_at(&mut self, mut i: usize) {
        let mask = self.mask();
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let s = self.slots[j];
            if s == EMPTY {
                break;
            }
            // `s` may move back to `i` when `i` lies between its home and `j`.
            let home = self.home(s);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(i) & mask) {
                self.slots[i] = s;
                i = j;
            }
        }
        self.slots[i] = EMPTY;
        self.len -= 1;
    }

    /// Whether every position is empty.
    #[cfg(test)]
    pub fn is_clear(&self) -> bool {
        self.slots.iter().all(|&s| s == EMPTY)
    }

    /// Put `slot` into the first empty position from its home.
    fn place(&mut self, slot: u64) {
        let mut i = self.home(slot);
        while self.slots[i] != EMPTY {
            i = (i + 1) & self.mask();
        }
        self.slots[i] = slot;
    }

    /// Twice the positions; every slot moves to its new home (nothing else
    /// is read: the slot carries the hash bits its position comes from).
    fn grow(&mut self) {
        let mut bigger = HugeVec::new_in(HugeAlloc);
        bigger.resize(self.slots.len() * 2, EMPTY);
        let old = std::mem::replace(&mut self.slots, bigger);
        self.bits += 1;
        for s in old.into_iter().filter(|&s| s != EMPTY) {
            self.place(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// Random inserts and removals (many sharing a home, so runs wrap and
    /// shift) agree with a `HashSet` at every step.
    #[test]
    fn agrees_with_a_hash_set_through_growth_and_backward_shifts() {
        let mut t = ProbeTable::default();
        let mut model = HashSet::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for step in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct upper bits: long runs and wrap-around.
            let v = (x & 0xf000_0000_0000_00ff) | u64::from(step % 7);
            let found = t.find(v, |s| s == v);
            assert_eq!(found.is_some(), model.contains(&v), "step {step}");
            match found {
                Some((i, _)) if x & 1 == 0 => {
                    t.remove_at(i);
                    model.remove(&v);
                }
                None if v != EMPTY => {
                    t.insert(v);
                    model.insert(v);
                }
                _ => {}
            }
            assert_eq!(t.len(), model.len());
        }
        for v in &model {
            assert!(t.find(*v, |s| s == *v).is_some());
        }
    }
}
