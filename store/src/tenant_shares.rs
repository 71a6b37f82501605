//! Per-tenant shares of the RAM and disk tiers: which owner each
//! block counts to, the bytes each owner uses in each tier, and the victim
//! an eviction takes instead when the eviction order proposes a block of an
//! owner at or under its guaranteed share while another owner is over its.
//!
//! Owners are the tenants file's ([`kvfabric_tenants::shares`]): a tenant
//! outside shared namespaces, or a shared namespace. Owner 0 is nobody
//! (single-tenant mode, trusted callers that name no owner, blocks the disk
//! index recorded with no owner) and has no share, so its blocks go first
//! when a tenant's would otherwise. The disk index records each block's
//! owner by name ([`Shares::name_of`]), so a restart keeps the counts.
//!
//! With a tenants file (`[node] tenants_file`), each owner keeps its blocks
//! of each tier in a queue of its own (least recently read first), so the
//! victim taken instead is the over-share owner's least recently read
//! eligible block, found without scanning other owners' blocks: an eviction
//! costs the order's proposal, one pass over the owners (a handful) and the
//! over-share owner's front. Without a tenants file nothing is queued here
//! and the store runs exactly as before (only bytes are counted).

use std::collections::HashMap;
use std::sync::Arc;

use kvfabric_tenants::shares::{resolve, OwnerShares, Share};
#[cfg(doc)]
use kvfabric_tenants::Identity;

use crate::keys::BlockKey;
use crate::policy::{Queues, Slot};
use crate::rec::Rec;

/// Who a block counts to (made by `Store::owner`, `tenant_usage.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Owner(u32);

impl Owner {
    /// Nobody: no share, evicted first when a tenant's block would be.
    pub const NONE: Owner = Owner(0);
}

/// A tier, as an index into an owner's per-tier state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TierIx {
    Ram = 0,
    Disk = 1,
}

/// One owner's use of one tier.
#[derive(Debug, Default)]
struct TierUse {
    used: u64,
    share: u64,
    /// Its blocks in the tier, least recently read first (only with shares on).
    order: Queues<1>,
}

#[derive(Debug)]
struct OwnerState {
    name: Arc<str>,
    tiers: [TierUse; 2],
}

/// One owner's bytes in one tier (metrics, Stats).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierUsage {
    pub owner: Arc<str>,
    pub ram_used: u64,
    pub ram_share: u64,
    pub disk_used: u64,
    pub disk_share: u64,
}

/// Every owner's use of the tiers; part of the store's locked state.
#[derive(Debug)]
pub(crate) struct Shares {
    /// Shares enforced (a tenants file is configured).
    active: bool,
    capacity: [u64; 2],
    owners: Vec<OwnerState>,
    by_name: HashMap<Arc<str>, Owner>,
}

/// Owner label of [`Owner::NONE`].
const NOBODY: &str = "default";

impl Shares {
    pub fn new(active: bool, ram_capacity: u64, disk_capacity: u64) -> Self {
        let mut s = Shares {
            active,
            capacity: [ram_capacity, disk_capacity],
            owners: Vec::new(),
            by_name: HashMap::new(),
        };
        s.owner(NOBODY);
        s
    }

    /// Whether shares are enforced (a tenants file is configured).
    pub fn active(&self) -> bool {
        self.active
    }

    /// The owner named `name` (made on first use; owners are never dropped,
    /// a name no longer in the file keeps no share).
    pub fn owner(&mut self, name: &str) -> Owner {
        if let Some(&o) = self.by_name.get(name) {
            return o;
        }
        let o = Owner(self.owners.len() as u32);
        let name: Arc<str> = name.into();
        self.owners.push(OwnerState {
            name: name.clone(),
            tiers: Default::default(),
        });
        self.by_name.insert(name, o);
        o
    }

    /// The name of `owner` as the disk index records it; None for nobody.
    pub fn name_of(&self, owner: Owner) -> Option<Arc<str>> {
        if owner == Owner::NONE {
            return None;
        }
        self.owners.get(owner.0 as usize).map(|o| o.name.clone())
    }

    /// Take the shares of `owners` (the tenants file in force); every other
    /// owner's share is 0.
    pub fn configure(&mut self, owners: &[OwnerShares]) {
        for st in &mut self.owners {
            for t in &mut st.tiers {
                t.share = 0;
            }
        }
        let pick: [fn(&OwnerShares) -> Option<Share>; 2] = [|o| o.ram, |o| o.disk];
        for (tier, pick) in pick.into_iter().enumerate() {
            let bytes = resolve(owners, self.capacity[tier], pick);
            for (o, b) in owners.iter().zip(bytes) {
                let id = self.owner(&o.owner);
                self.owners[id.0 as usize].tiers[tier].share = b;
            }
        }
    }

    fn at(&mut self, tier: TierIx, owner: Owner) -> &mut TierUse {
        &mut self.owners[owner.0 as usize].tiers[tier as usize]
    }

    /// `key` (record `rec`, `bytes` of the tier) entered `tier` for
    /// `owner`; its slot in the owner's queue (0 with shares off).
    pub fn enter(
        &mut self,
        tier: TierIx,
        owner: Owner,
        key: BlockKey,
        rec: Rec,
        bytes: u64,
    ) -> Slot {
        let active = self.active;
        let t = self.at(tier, owner);
        t.used += bytes;
        if active {
            t.order.push_back(0, key, rec)
        } else {
            0
        }
    }

    /// The block at `slot` of `owner`'s queue left `tier`, freeing `bytes`.
    pub fn leave(&mut self, tier: TierIx, owner: Owner, slot: Slot, bytes: u64) {
        let active = self.active;
        let t = self.at(tier, owner);
        t.used = t.used.saturating_sub(bytes);
        if active {
            t.order.remove(slot);
        }
    }

    /// The block at `slot` of `owner`'s queue in `tier` was read.
    pub fn touch(&mut self, tier: TierIx, owner: Owner, slot: Slot) {
        if self.active {
            self.at(tier, owner).order.move_to_back(slot, 0);
        }
    }

    /// Whether blocks of `owner` are protected from eviction in `tier` while
    /// some owner is over its share: the owner most over its share (by bytes)
    /// to evict from instead, when `owner` is at or under its share.
    pub fn instead_of(&self, tier: TierIx, owner: Owner) -> Option<Owner> {
        if !self.active {
            return None;
        }
        let t = tier as usize;
        let mine = &self.owners[owner.0 as usize].tiers[t];
        if mine.used > mine.share {
            return None;
        }
        self.owners
            .iter()
            .enumerate()
            .map(|(i, o)| (i, &o.tiers[t]))
            .filter(|(_, t)| t.used > t.share && t.order.total() > 0)
            .max_by_key(|(_, t)| t.used - t.share)
            .map(|(i, _)| Owner(i as u32))
    }

    /// `owner`'s least recently read block in `tier` that is `eligible`.
    pub fn oldest(
        &self,
        tier: TierIx,
        owner: Owner,
        mut eligible: impl FnMut(&BlockKey, Rec) -> bool,
    ) -> Option<BlockKey> {
        let q = &self.owners[owner.0 as usize].tiers[tier as usize].order;
        let mut at = q.front(0);
        while let Some(s) = at {
            let key = q.key(s);
            if eligible(&key, q.rec(s)) {
                return Some(key);
            }
            at = q.next(s);
        }
        None
    }

    /// Every owner's bytes and shares.
    pub fn usage(&self) -> Vec<TierUsage> {
        self.owners
            .iter()
            .map(|o| TierUsage {
                owner: o.name.clone(),
                ram_used: o.tiers[0].used,
                ram_share: o.tiers[0].share,
                disk_used: o.tiers[1].used,
                disk_share: o.tiers[1].share,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(shares: &[(&str, Option<Share>)]) -> Vec<OwnerShares> {
        shares
            .iter()
            .map(|(n, s)| OwnerShares {
                owner: (*n).into(),
                ram: *s,
                disk: None,
            })
            .collect()
    }

    #[test]
    fn an_owner_under_its_share_points_at_the_one_most_over() {
        let mut s = Shares::new(true, 1000, 0);
        s.configure(&owners(&[
            ("a", None),
            ("b", None),
            ("c", Some(Share::Bytes(100))),
        ]));
        let (a, b, c) = (s.owner("a"), s.owner("b"), s.owner("c"));
        let k = |i: u8| BlockKey([i; 32]);
        let sa = s.enter(TierIx::Ram, a, k(1), 1, 600);
        s.enter(TierIx::Ram, b, k(2), 2, 100);
        s.enter(TierIx::Ram, c, k(3), 3, 150);
        // a: 600 > 450; c: 150 > 100; b: 100 <= 450.
        assert_eq!(s.instead_of(TierIx::Ram, b), Some(a));
        assert_eq!(
            s.instead_of(TierIx::Ram, a),
            None,
            "a is over: its own block goes"
        );
        assert_eq!(s.oldest(TierIx::Ram, a, |_, _| true), Some(k(1)));
        s.leave(TierIx::Ram, a, sa, 600);
        assert_eq!(s.instead_of(TierIx::Ram, b), Some(c));
        assert_eq!(s.instead_of(TierIx::Disk, b), None);
        // Nobody has no share.
        assert_eq!(s.instead_of(TierIx::Ram, Owner::NONE), Some(c));
    }

    #[test]
    fn off_without_a_tenants_file() {
        let mut s = Shares::new(false, 1000, 0);
        let a = s.owner("a");
        s.enter(TierIx::Ram, a, BlockKey([1; 32]), 1, 2000);
        assert_eq!(s.instead_of(TierIx::Ram, Owner::NONE), None);
        assert_eq!(s.usage()[1].ram_used, 2000);
    }
}
