//! The VRAM tier as the store's upper tier (`crate::upper`): the store's
//! readers see VRAM blocks (`info`) and get them copied down into RAM
//! (`copy_down`: a remote READ or a gRPC get of a block held only in VRAM is
//! served from the registered RAM arena, filled through the d2h staging);
//! and the store's change feed hears of blocks entering and leaving VRAM
//! (`announce`), so the cluster directory lists VRAM-only blocks too.

use std::sync::{Arc, Weak};

use crate::tier::Tier;

use super::movement::Demoted;
use super::{VramShared, VramTier};
use crate::block_info::BlockInfo;
use crate::changes::BlockChange;
use crate::keys::BlockKey;
use crate::upper::UpperTier;
use crate::StoreError;

impl UpperTier for VramShared {
    fn info(&self, key: &BlockKey) -> Option<BlockInfo> {
        let g = self.inner.lock();
        g.block(key).map(|(_, b)| b.info(key))
    }

    fn copy_down(&self, key: &BlockKey) -> Result<bool, StoreError> {
        let mut g = self.inner.lock();
        let Some((_, b)) = g.block(key) else {
            return Ok(false);
        };
        let block = *b;
        g.lease(block.extent);
        drop(g);
        let copied = self.copy_to_ram(key, &block);
        self.inner.lock().unlease(block.extent);
        match copied? {
            Demoted::Held => {
                self.count(&self.metrics.hits);
                Ok(true)
            }
            Demoted::Corrupt => {
                self.count(&self.metrics.checksum_failures);
                tracing::warn!("VRAM block {key:?} failed its checksum on its way to RAM; dropped");
                self.drop_blocks(&[*key]);
                Ok(false)
            }
        }
    }
}

impl VramShared {
    /// Tell the store's change feed (if it has a subscriber) that `key`
    /// entered VRAM (`in_vram`) or left it. Called with the tier's lock released.
    pub(super) fn announce(&self, key: &BlockKey, in_vram: bool) {
        let g = self.store.shared.inner.lock();
        let Some(feed) = &g.changes else { return };
        let below = g.blocks.get(key).map(|b| match b.ram {
            Some(_) => Tier::Ram,
            None => Tier::Disk,
        });
        // A VRAM-only block counts to nobody (the VRAM tier keeps no owners).
        let owner = g
            .blocks
            .get(key)
            .filter(|_| feed.has_subscribers())
            .and_then(|b| g.shares.name_of(b.owner));
        match (in_vram, below) {
            (true, None) => feed.push(*key, BlockChange::Stored, Tier::Vram, owner),
            (true, Some(_)) => feed.push(*key, BlockChange::Tier, Tier::Vram, owner),
            (false, Some(tier)) => feed.push(*key, BlockChange::Tier, tier, owner),
            (false, None) => feed.push(*key, BlockChange::Removed, Tier::Absent, owner),
        }
    }

    /// Drop `keys` from VRAM and announce each that was there; how many.
    pub(super) fn drop_blocks(&self, keys: &[BlockKey]) -> usize {
        let mut g = self.inner.lock();
        let gone: Vec<BlockKey> = keys
            .iter()
            .filter(|k| g.remove(k).is_some())
            .copied()
            .collect();
        self.publish(&g);
        drop(g);
        for k in &gone {
            self.announce(k, false);
        }
        gone.len()
    }
}

impl VramTier {
    /// Link the tier into its store (see the module doc).
    pub(super) fn link(&self) {
        let me: Arc<dyn UpperTier> = self.shared.clone();
        let weak: Weak<dyn UpperTier> = Arc::downgrade(&me);
        self.shared.store.shared.inner.lock().upper.set(weak);
    }
}
