//! [`Block`]: what the store knows of one stored block (layout, length,
//! checksum, its RAM and disk copies and their places in the eviction
//! orders).

use std::time::Instant;

use crate::disk_codec::DiskCodec;
use crate::extent::Extent;
use crate::keys::KvLayout;
use crate::policy::Slot;
use crate::tenant_shares::Owner;

/// One stored block and where its copies are.
#[derive(Debug)]
pub(crate) struct Block {
    pub layout: KvLayout,
    pub len: u64,
    /// xxh3-64 of the bytes (computed at commit, fused with the copy).
    pub checksum: u64,
    pub tokens: u32,
    pub ram: Option<Extent>,
    pub disk: Option<Extent>,
    /// How the disk copy's bytes are stored (valid while `disk` is Some).
    pub disk_codec: DiskCodec,
    /// The block's slot in `Inner::ram_order`, valid while `ram` is Some
    /// (kept here so the order needs no key index: see `policy`).
    pub ram_slot: Slot,
    /// The block's slot in `Inner::disk_order`, valid while `disk` is Some.
    pub disk_slot: Slot,
    /// Who the block counts to in the tiers' shares (`shares`).
    pub owner: Owner,
    /// Its slots in its owner's RAM and disk queues (`Shares::enter`).
    pub ram_owner_slot: Slot,
    pub disk_owner_slot: Slot,
    pub hard_pin: bool,
    pub soft_pin_until: Option<Instant>,
    /// Puts and reads seen (disk admission "seen-twice").
    pub accesses: u32,
    /// A write of this block to disk is in flight (demotion, write-through or durable put).
    pub flushing: bool,
}

impl Block {
    /// Hard-pinned, or soft-pinned with an unexpired TTL.
    pub fn pinned(&self, now: Instant) -> bool {
        self.hard_pin || self.soft_pin_until.is_some_and(|t| t > now)
    }
}
