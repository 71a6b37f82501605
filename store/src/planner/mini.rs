//! Miniature simulations (Waldspurger et al., ATC '17): one scaled-down
//! cache per curve point, run by the node's own eviction order
//! ([`EvictionOrder`], the code the tiers run) on the sampled key stream.
//!
//! A point models the node holding `bytes` of blocks; with sampling rate
//! `R` its mini-cache holds `R * bytes * fill / block_bytes` blocks (`fill`:
//! the share of a tier eviction keeps it at, between the watermarks). The
//! mean block size comes from the sampled puts, so the capacity follows the
//! blocks the node actually stores. A looked-up key the mini-cache holds is
//! a hit (and touched, as the connector's read of a hit does) unless an
//! earlier key of the same lookup missed; one it does not hold is a miss and
//! is inserted (the engine computes and puts it). A put inserts a key not
//! held (answer blocks, which no lookup saw first).

use std::collections::HashMap;

use crate::keys::BlockKey;
use crate::node_config::NodeConfig;
use crate::policy::{EvictionOrder, Slot};

/// One curve point's mini-cache.
#[derive(Debug)]
pub(super) struct Mini {
    /// Capacity multiplier of the tier this point scales.
    pub scale: f64,
    /// Bytes of blocks the node holds at this point (all tiers).
    pub bytes: f64,
    order: EvictionOrder,
    slots: HashMap<BlockKey, Slot>,
    /// A lookup's keys for an `adaptive` order (kept to reuse its memory).
    scratch: Vec<BlockKey>,
    /// Sampled lookups of keys this mini-cache did not hold.
    pub misses: u64,
}

impl Mini {
    pub fn new(cfg: &NodeConfig, scale: f64, bytes: f64) -> Self {
        Mini {
            scale,
            bytes,
            order: EvictionOrder::new(cfg),
            slots: HashMap::new(),
            scratch: Vec::new(),
            misses: 0,
        }
    }

    /// A lookup's sampled keys, in prefix order; `blocks_per_byte` sizes the
    /// mini-cache. The hit is the longest held prefix: past the first miss,
    /// keys are misses, held ones untouched (the store reads only the
    /// prefix it found, then puts the rest: a put of a held key changes nothing).
    pub fn lookup<'k>(
        &mut self,
        keys: impl Iterator<Item = &'k BlockKey> + Clone,
        blocks_per_byte: f64,
    ) {
        if matches!(self.order, EvictionOrder::Adaptive(_)) {
            // `adaptive` chooses by replaying lookups (and what was held).
            self.scratch.clear();
            self.scratch.extend(keys.clone().copied());
            let slots = &self.slots;
            let found = self
                .scratch
                .iter()
                .take_while(|k| slots.contains_key(*k))
                .count();
            self.order.lookup(&self.scratch, found);
        }
        let mut broken = false;
        for key in keys {
            match self.slots.get(key) {
                Some(&slot) if !broken => self.order.touch(slot, key),
                Some(_) => self.misses += 1,
                None => {
                    broken = true;
                    self.misses += 1;
                    self.insert(*key, blocks_per_byte);
                }
            }
        }
    }

    /// A sampled put of `key`.
    pub fn put(&mut self, key: &BlockKey, blocks_per_byte: f64) {
        if !self.slots.contains_key(key) {
            self.insert(*key, blocks_per_byte);
        }
    }

    /// Room first (as the store evicts before the new block is in its order), then the key.
    fn insert(&mut self, key: BlockKey, blocks_per_byte: f64) {
        let cap = ((self.bytes * blocks_per_byte).round() as usize).max(1);
        while self.slots.len() >= cap {
            let Some(victim) = self.order.victim(|_| true) else {
                break;
            };
            match self.slots.remove(&victim) {
                Some(slot) => self.order.remove(slot, &victim),
                None => break,
            }
        }
        // No block records here (the victims' keys are all it needs).
        let slot = self.order.insert(key, 0);
        self.slots.insert(key, slot);
    }
}
