//! The store's link to a tier above it (the VRAM tier, `vram`, feature
//! `cuda`): what the store asks of it, so a block held only in VRAM is a
//! stored block to every reader of the store (`lookup`, `exists`,
//! `block_infos`, `lease`, `get_into`, and through them the gRPC service and
//! remote READs), and the store's change feed keeps reporting a block the
//! RAM tier drops while VRAM still holds it.
//!
//! A trait, not the VRAM type, so the store builds without the feature and
//! depends on nothing above it; the link is a `Weak` (the tier holds the
//! store, not the other way round). Lock order: the store's lock may be held
//! while the upper tier's is taken (`info`), never the reverse, so the upper
//! tier calls into the store only with its own lock released.

use std::sync::{Arc, Weak};

use crate::block_info::BlockInfo;
use crate::keys::BlockKey;
use crate::StoreError;

/// What the store needs of the tier above it.
pub(crate) trait UpperTier: Send + Sync {
    /// Facts about `key` if the tier holds it (`tier` names it).
    fn info(&self, key: &BlockKey) -> Option<BlockInfo>;
    /// Copy `key` into the store's RAM tier, keeping it above (a reader of
    /// the store wants it in RAM: a remote READ, a gRPC get). False: the
    /// tier does not hold it, or its copy failed its checksum.
    fn copy_down(&self, key: &BlockKey) -> Result<bool, StoreError>;
}

/// The store's side of the link: none, or the tier set at its open.
#[derive(Default)]
pub(crate) struct UpperLink(Option<Weak<dyn UpperTier>>);

impl UpperLink {
    /// Link `tier` (replaces an earlier one).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // only the VRAM tier links
    pub fn set(&mut self, tier: Weak<dyn UpperTier>) {
        self.0 = Some(tier);
    }

    /// The tier, while it is open.
    pub fn get(&self) -> Option<Arc<dyn UpperTier>> {
        self.0.as_ref().and_then(Weak::upgrade)
    }

    /// [`UpperTier::info`] of the linked tier (None without one).
    pub fn info(&self, key: &BlockKey) -> Option<BlockInfo> {
        self.0.as_ref()?.upgrade()?.info(key)
    }
}
