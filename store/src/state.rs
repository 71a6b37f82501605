//! The store's mutable state (`Inner`, behind one mutex) and its bookkeeping
//! rules: which copies a block has, which extents are leased (being read or
//! written to disk) and therefore must not be freed or reused yet.
//!
//! Critical sections are short: no I/O and no block-sized copies happen while
//! the lock is held. Extents that are freed while leased are "doomed" and go
//! back to their allocator when the last lease ends, so a reader never sees
//! its bytes reused under it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicU8;
use std::sync::Arc;
use std::time::Instant;

use crate::changes::{BlockChange, ChangeFeed};
use crate::extent::{Extent, ExtentAllocator};
use crate::keys::BlockKey;
use crate::node_config::NodeConfig;
use crate::policy::EvictionOrder;
use crate::rec::Rec;
use crate::tenant_shares::{Owner, Shares, TierIx};
use crate::upper::UpperLink;

mod block;
mod blocks;
pub(crate) use block::Block;
pub(crate) use blocks::BlockMap;

/// A reservation's shared state word: lets the reaper and the owner race safely.
pub(crate) const RES_IDLE: u8 = 0;
pub(crate) const RES_WRITING: u8 = 1;
pub(crate) const RES_CLOSED: u8 = 2;

/// The store's record of an open reservation (the owner holds a `Reservation`).
pub(crate) struct ReservationSlot {
    pub extent: Extent,
    pub deadline: Instant,
    pub state: Arc<AtomicU8>,
}

/// Bounded memory of keys that were dropped from RAM without being admitted to
/// disk, so a block seen again is admitted under "seen-twice".
#[derive(Default)]
pub(crate) struct SeenKeys {
    order: VecDeque<BlockKey>,
    set: HashSet<BlockKey>,
}

impl SeenKeys {
    const CAP: usize = 1 << 16;

    pub fn insert(&mut self, key: BlockKey) {
        if self.set.insert(key) {
            self.order.push_back(key);
            while self.order.len() > Self::CAP {
                if let Some(k) = self.order.pop_front() {
                    self.set.remove(&k);
                }
            }
        }
    }

    pub fn contains(&self, key: &BlockKey) -> bool {
        self.set.contains(key)
    }
}

/// Everything behind the store's mutex.
pub(crate) struct Inner {
    pub blocks: BlockMap,
    pub ram: ExtentAllocator,
    pub ram_order: EvictionOrder,
    pub ram_leases: HashMap<u64, u32>,
    pub ram_doomed: HashMap<u64, Extent>,
    pub disk: ExtentAllocator,
    pub disk_order: EvictionOrder,
    pub disk_reads: HashMap<u64, u32>,
    pub disk_doomed: HashMap<u64, Extent>,
    pub reservations: HashMap<u64, ReservationSlot>,
    pub next_reservation: u64,
    pub seen: SeenKeys,
    /// Where changes of what is stored go, for [`crate::Store::watch_changes`].
    pub changes: Option<Arc<ChangeFeed>>,
    /// Bytes per owner per tier, and the owners' queues (`shares`).
    pub shares: Shares,
    /// The tier above RAM, if one is open (`upper`).
    pub upper: UpperLink,
}

impl Inner {
    pub fn new(cfg: &NodeConfig, ram_capacity: u64, disk_capacity: u64, align: u64) -> Self {
        Inner {
            blocks: BlockMap::default(),
            ram: ExtentAllocator::new(ram_capacity, align),
            ram_order: EvictionOrder::new(cfg),
            ram_leases: HashMap::new(),
            ram_doomed: HashMap::new(),
            disk: ExtentAllocator::new(disk_capacity, align),
            disk_order: EvictionOrder::for_disk(cfg),
            disk_reads: HashMap::new(),
            disk_doomed: HashMap::new(),
            reservations: HashMap::new(),
            next_reservation: 0,
            seen: SeenKeys::default(),
            changes: None,
            shares: Shares::new(cfg.tenants_file.is_some(), ram_capacity, disk_capacity),
            upper: UpperLink::default(),
        }
    }

    /// Count one more lease (reader or disk writer) on a RAM extent.
    pub fn lease_ram(&mut self, ext: Extent) {
        *self.ram_leases.entry(ext.offset).or_insert(0) += 1;
    }

    /// End a lease; a doomed extent goes back to the allocator with its last lease.
    pub fn unlease_ram(&mut self, ext: Extent) {
        if let Some(n) = self.ram_leases.get_mut(&ext.offset) {
            *n -= 1;
            if *n == 0 {
                self.ram_leases.remove(&ext.offset);
                if let Some(d) = self.ram_doomed.remove(&ext.offset) {
                    self.ram.free(d);
                }
            }
        }
    }

    /// Free a RAM extent now, or when its last lease ends.
    pub fn release_ram(&mut self, ext: Extent) {
        if self.ram_leases.contains_key(&ext.offset) {
            self.ram_doomed.insert(ext.offset, ext);
        } else {
            self.ram.free(ext);
        }
    }

    pub fn lease_disk(&mut self, ext: Extent) {
        *self.disk_reads.entry(ext.offset).or_insert(0) += 1;
    }

    pub fn unlease_disk(&mut self, ext: Extent) {
        if let Some(n) = self.disk_reads.get_mut(&ext.offset) {
            *n -= 1;
            if *n == 0 {
                self.disk_reads.remove(&ext.offset);
                if let Some(d) = self.disk_doomed.remove(&ext.offset) {
                    self.disk.free(d);
                }
            }
        }
    }

    pub fn release_disk(&mut self, ext: Extent) {
        if self.disk_reads.contains_key(&ext.offset) {
            self.disk_doomed.insert(ext.offset, ext);
        } else {
            self.disk.free(ext);
        }
    }

    /// Drop the RAM copy of `key`; the block goes away if it had no other copy.
    pub fn drop_ram_copy(&mut self, key: &BlockKey) {
        let Some(b) = self.blocks.get_mut(key) else {
            return;
        };
        let Some(ext) = b.ram.take() else { return };
        let gone = b.disk.is_none();
        let owner = b.owner;
        self.ram_order.remove(b.ram_slot, key);
        self.shares
            .leave(TierIx::Ram, owner, b.ram_owner_slot, ext.len);
        self.release_ram(ext);
        if gone {
            self.blocks.remove(key);
            self.note(key, BlockChange::Removed, owner);
        } else {
            self.note(key, BlockChange::Tier, owner);
        }
    }

    /// Drop the disk copy of `key` (the caller deletes the index entry).
    pub fn drop_disk_copy(&mut self, key: &BlockKey) {
        let Some(b) = self.blocks.get_mut(key) else {
            return;
        };
        let Some(ext) = b.disk.take() else { return };
        let gone = b.ram.is_none();
        let owner = b.owner;
        self.disk_order.remove(b.disk_slot, key);
        self.shares
            .leave(TierIx::Disk, owner, b.disk_owner_slot, ext.len);
        self.release_disk(ext);
        if gone {
            self.blocks.remove(key);
            self.note(key, BlockChange::Removed, owner);
        }
    }

    /// A block of the disk index found at start (its disk copy claimed):
    /// indexed and queued in the disk order, counted to the owner its
    /// record names (`block.owner`; nobody for records without one).
    pub fn recover(&mut self, key: BlockKey, block: Block) {
        let len = block.disk.map_or(0, |e| e.len);
        let owner = block.owner;
        let (rec, _) = self.blocks.insert(key, block);
        let disk_slot = self.disk_order.insert(key, rec);
        let owner_slot = self.shares.enter(TierIx::Disk, owner, key, rec, len);
        if let Some(b) = self.blocks.at_mut(rec) {
            b.disk_slot = disk_slot;
            b.disk_owner_slot = owner_slot;
        }
    }

    /// Tell the changes subscriber, if any, what happened to `key` (a block
    /// of `owner`).
    pub fn note(&self, key: &BlockKey, change: BlockChange, owner: Owner) {
        if let Some(feed) = &self.changes {
            let tier = match self.blocks.get(key) {
                Some(b) if b.ram.is_some() => crate::tier::Tier::Ram,
                Some(_) => crate::tier::Tier::Disk,
                None => crate::tier::Tier::Absent,
            };
            let name = feed
                .has_subscribers()
                .then(|| self.shares.name_of(owner))
                .flatten();
            // A block the tier above still holds stays stored, in that tier.
            match self.upper.info(key) {
                Some(up) if change == BlockChange::Removed => {
                    feed.push(*key, BlockChange::Tier, up.tier, name)
                }
                Some(up) => feed.push(*key, change, up.tier, name),
                None => feed.push(*key, change, tier, name),
            }
        }
    }

    /// Forget `key` entirely; true when it was stored.
    pub fn remove_block(&mut self, key: &BlockKey) -> Option<Block> {
        let b = self.blocks.remove(key)?;
        self.note(key, BlockChange::Removed, b.owner);
        if let Some(e) = b.ram {
            self.ram_order.remove(b.ram_slot, key);
            self.shares
                .leave(TierIx::Ram, b.owner, b.ram_owner_slot, e.len);
            self.release_ram(e);
        }
        if let Some(e) = b.disk {
            self.disk_order.remove(b.disk_slot, key);
            self.shares
                .leave(TierIx::Disk, b.owner, b.disk_owner_slot, e.len);
            self.release_disk(e);
        }
        Some(b)
    }

    /// A RAM-resident block that may be evicted now.
    ///
    /// Each candidate's record is read through the record index the order
    /// keeps (no index probe), and its index slot is prefetched meanwhile:
    /// the eviction removes the key from the index next.
    pub fn ram_victim(&mut self, now: Instant) -> Option<BlockKey> {
        let Inner {
            blocks,
            ram_order,
            ram_leases,
            shares,
            ..
        } = self;
        let eligible = |k: &BlockKey, rec: Rec| {
            blocks.at(rec).is_some_and(|(key, b)| {
                debug_assert_eq!(key, k, "order and index disagree on record {rec}");
                !b.pinned(now)
                    && !b.flushing
                    && b.ram.is_some_and(|e| !ram_leases.contains_key(&e.offset))
            })
        };
        let proposed = ram_order.victim_at(|k, rec| {
            blocks.prefetch_rec(rec);
            blocks.prefetch_key(k);
            eligible(k, rec)
        })?;
        Some(instead(shares, TierIx::Ram, blocks, proposed, eligible))
    }

    /// Start loading what the next RAM eviction reads first: the record and
    /// the index slot of the block the order would look at first (a hint:
    /// the loads overlap with the work until that eviction).
    pub fn prefetch_ram_victim(&self) {
        self.ram_order.prefetch_eviction();
        if let Some((key, rec)) = self.ram_order.peek() {
            self.blocks.prefetch_rec(rec);
            self.blocks.prefetch_key(&key);
        }
    }

    /// Where in the arena the block `peek` names lies (its record was
    /// prefetched by `prefetch_ram_victim` after the previous put, so this
    /// read is cheap by the time a new put begins): the put that evicts it
    /// writes that extent, whose first touch is a TLB and a cache miss.
    pub fn peeked_ram_offset(&self) -> Option<u64> {
        let (_, rec) = self.ram_order.peek()?;
        self.blocks.at(rec)?.1.ram.map(|e| e.offset)
    }

    /// A disk-resident block whose disk copy may be dropped now.
    pub fn disk_victim(&mut self, now: Instant) -> Option<BlockKey> {
        let Inner {
            blocks,
            disk_order,
            disk_reads,
            shares,
            ..
        } = self;
        let eligible = |k: &BlockKey, rec: Rec| {
            blocks.at(rec).is_some_and(|(key, b)| {
                debug_assert_eq!(key, k, "order and index disagree on record {rec}");
                !b.pinned(now) && b.disk.is_some_and(|e| !disk_reads.contains_key(&e.offset))
            })
        };
        let proposed = disk_order.victim_at(eligible)?;
        Some(instead(shares, TierIx::Disk, blocks, proposed, eligible))
    }
}

/// The victim to take in `tier` when the order proposed `proposed`: an
/// over-share owner's least recently read eligible block when `proposed`'s
/// owner is at or under its share (`shares`), else `proposed`.
fn instead(
    shares: &Shares,
    tier: TierIx,
    blocks: &BlockMap,
    proposed: BlockKey,
    eligible: impl FnMut(&BlockKey, Rec) -> bool,
) -> BlockKey {
    if !shares.active() {
        return proposed;
    }
    let Some(owner) = blocks.get(&proposed).map(|b| b.owner) else {
        return proposed;
    };
    shares
        .instead_of(tier, owner)
        .and_then(|over| shares.oldest(tier, over, eligible))
        .unwrap_or(proposed)
}
