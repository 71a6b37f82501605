//! `adaptive`'s shadow caches: metadata-only caches (keys and links, no
//! data) run by one order each, replaying the tier's sampled lookups and
//! puts, and what waits for them until the tier's size is known.
//!
//! A shadow evicts as the tier does: once full (`Size::cap`, the most the
//! tier has held) it drops victims down to `Size::low`, the tier's low
//! watermark in the same proportion, so its hits are those of a tier of
//! its order at the tier's watermarks. Evicting one key at a time instead
//! kept each shadow a burst's worth fuller than the tier, and an order can
//! lead there and trail at the tier's size: at 5% of the Mooncake synthetic
//! trace the LIRS shadow led LRU's one at a time while a LIRS tier evicting
//! in bursts trailed an LRU tier, and the tier that followed it fell below
//! LRU (docs/BENCHMARKS.md, session 32). A burst costs one victim per key
//! it drops, so a put is still O(1) amortized.

use hashbrown::HashMap;

use super::door::Door;
use super::lirs::Lirs;
use super::list::Slot;
use super::lru::Lru;
use crate::keys::BlockKey;

/// The order a shadow runs.
#[derive(Debug)]
pub(super) enum ShadowOrder {
    Lirs(Lirs),
    Lru(Lru),
    Door(Door),
}

impl ShadowOrder {
    fn insert(&mut self, key: BlockKey) -> Slot {
        match self {
            ShadowOrder::Lirs(o) => o.insert(key, 0),
            ShadowOrder::Lru(o) => o.insert(key, 0),
            ShadowOrder::Door(o) => o.insert(key, 0),
        }
    }

    fn touch(&mut self, slot: Slot, key: &BlockKey) {
        match self {
            ShadowOrder::Lirs(o) => o.touch(slot, key),
            ShadowOrder::Lru(o) => o.touch(slot, key),
            ShadowOrder::Door(o) => o.touch(slot, key),
        }
    }

    fn remove(&mut self, slot: Slot, key: &BlockKey) {
        match self {
            ShadowOrder::Lirs(o) => o.remove(slot, key),
            ShadowOrder::Lru(o) => o.remove(slot, key),
            ShadowOrder::Door(o) => o.remove(slot, key),
        }
    }

    /// The next key to drop (every key is eligible in a shadow).
    fn victim(&mut self) -> Option<BlockKey> {
        match self {
            ShadowOrder::Lirs(o) => o.victim_at(|_, _| true),
            ShadowOrder::Lru(o) => o.victim(|_, _| true),
            ShadowOrder::Door(o) => o.victim(|_, _| true),
        }
    }
}

/// How many keys a shadow holds: at most `cap`; once full, a put drops
/// keys until fewer than `low` are held (`low` = `cap`: one at a time).
#[derive(Clone, Copy, Debug)]
pub(super) struct Size {
    pub cap: usize,
    pub low: usize,
}

impl Size {
    /// `cap` keys, evicting down to `burst` times it when full (the tier's
    /// low watermark over its high one; 1: one key at a time).
    pub fn new(cap: usize, burst: f64) -> Self {
        let cap = cap.max(1);
        let low = ((cap as f64 * burst.clamp(0.0, 1.0)).round() as usize).clamp(1, cap);
        Size { cap, low }
    }
}

/// A metadata-only cache run by one order.
#[derive(Debug)]
pub(super) struct Shadow {
    order: ShadowOrder,
    slots: HashMap<BlockKey, Slot>,
}

impl Shadow {
    pub fn new(order: ShadowOrder) -> Self {
        Shadow {
            order,
            slots: HashMap::new(),
        }
    }

    /// A lookup of `keys` (sampled, prefix order) whose first `found` the
    /// tier held: the shadow's held prefix is touched and is the hit. A key
    /// it lacks among the tier's `found` is put now (the tier holds it, so
    /// no put follows); one past them is put when the tier puts it.
    pub fn lookup(&mut self, keys: &[BlockKey], found: usize, size: Size) -> usize {
        let mut hits = 0;
        let mut broken = false;
        for (i, key) in keys.iter().enumerate() {
            match self.slots.get(key) {
                Some(&slot) if !broken => {
                    self.order.touch(slot, key);
                    hits += 1;
                }
                Some(_) => {}
                None if i < found => {
                    broken = true;
                    self.insert(*key, size);
                }
                None => broken = true,
            }
        }
        hits
    }

    /// A put of `key`: held keys are untouched.
    pub fn put(&mut self, key: BlockKey, size: Size) {
        if !self.slots.contains_key(&key) {
            self.insert(key, size);
        }
    }

    fn insert(&mut self, key: BlockKey, size: Size) {
        if self.slots.len() >= size.cap {
            while self.slots.len() >= size.low {
                let Some(victim) = self.order.victim() else {
                    break;
                };
                match self.slots.remove(&victim) {
                    Some(slot) => self.order.remove(slot, &victim),
                    None => break,
                }
            }
        }
        let slot = self.order.insert(key);
        self.slots.insert(key, slot);
    }

    /// The keys held (tests).
    #[cfg(test)]
    pub fn keys(&self) -> impl Iterator<Item = BlockKey> + '_ {
        self.slots.keys().copied()
    }
}

/// Whether `key` is in the shadows' sample (hash below `threshold`).
pub(super) fn sampled(threshold: u64, key: &BlockKey) -> bool {
    threshold == u64::MAX || crate::keys::spot(key) < threshold
}

/// The sampled lookups and puts of a tier still filling: keys, and per
/// event its first key, key count and the keys the tier held (lookups) or
/// [`PUT`].
#[derive(Debug, Default)]
pub(super) struct Pending {
    pub keys: Vec<BlockKey>,
    pub events: Vec<(u32, u32, u32)>,
}

/// A `Pending` event that is a put.
pub(super) const PUT: u32 = u32::MAX;
