//! A directory shard: which nodes hold the blocks this node owns.
//!
//! Soft state, rebuilt from holders' announcements: an entry is created when a
//! holder announces a block, dropped when the holder withdraws it, reports it
//! stale (a failed read), or leaves the cluster. Holders are kept best first
//! (RAM before disk, then by node id for determinism) so a reader takes the
//! first one.
//!
//! The checksum of a key is the first holder's (its writer's, as announced
//! under its own certificate): a later holder announcing other bytes for the
//! key is refused ([`Announced::Conflict`]) while any holder of the recorded
//! checksum remains, and readers verify what any holder serves against the
//! recorded checksum, so a holder cannot get other bytes read as the key's.

use std::collections::HashMap;

use kvfabric_store::keys::BlockKey;

/// Where a holder keeps a block, fastest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HolderTier {
    Vram,
    Ram,
    Disk,
}

/// One holder of one block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderEntry {
    pub node_id: String,
    pub tier: HolderTier,
    pub size: u64,
    pub checksum: u64,
}

/// The entries of the keys one node owns.
#[derive(Default, Debug)]
pub struct DirectoryShard {
    entries: HashMap<BlockKey, Vec<HolderEntry>>,
    /// Keys with a holder in RAM (or VRAM).
    in_ram: usize,
}

/// Whether some holder in `holders` (best first) has the block in RAM or VRAM.
pub fn in_ram(holders: &[HolderEntry]) -> bool {
    holders.first().is_some_and(|h| h.tier <= HolderTier::Ram)
}

/// What an announcement did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Announced {
    /// Entered; the key had no holder in RAM and has one now.
    NowInRam,
    /// Entered.
    Entered,
    /// Refused: another holder recorded other bytes (checksum) for the key.
    Conflict,
}

impl DirectoryShard {
    /// Record that `entry.node_id` holds `key` (replacing its previous entry
    /// for the key), unless another holder recorded another checksum.
    pub fn announce(&mut self, key: BlockKey, entry: HolderEntry) -> Announced {
        let holders = self.entries.entry(key).or_default();
        if holders
            .iter()
            .any(|h| h.node_id != entry.node_id && h.checksum != entry.checksum)
        {
            return Announced::Conflict;
        }
        let was = in_ram(holders);
        holders.retain(|h| h.node_id != entry.node_id);
        holders.push(entry);
        holders.sort_by(|a, b| a.tier.cmp(&b.tier).then_with(|| a.node_id.cmp(&b.node_id)));
        let now = in_ram(holders);
        self.in_ram = self.in_ram + usize::from(now) - usize::from(was);
        if now && !was {
            Announced::NowInRam
        } else {
            Announced::Entered
        }
    }

    /// Forget that `node_id` holds `key`; true when an entry was removed.
    pub fn withdraw(&mut self, node_id: &str, key: &BlockKey) -> bool {
        let Some(holders) = self.entries.get_mut(key) else {
            return false;
        };
        let before = holders.len();
        let was = in_ram(holders);
        holders.retain(|h| h.node_id != node_id);
        let removed = holders.len() != before;
        self.in_ram = self.in_ram + usize::from(in_ram(holders)) - usize::from(was);
        if holders.is_empty() {
            self.entries.remove(key);
        }
        removed
    }

    /// Number of keys with a holder in RAM (or VRAM).
    pub fn in_ram_len(&self) -> usize {
        self.in_ram
    }

    /// Holders of `key`, best first (empty when none).
    pub fn locate(&self, key: &BlockKey) -> &[HolderEntry] {
        self.entries.get(key).map_or(&[], Vec::as_slice)
    }

    /// Drop every entry of a node that left; returns how many were dropped.
    pub fn drop_node(&mut self, node_id: &str) -> usize {
        let mut dropped = 0;
        self.entries.retain(|_, holders| {
            let before = holders.len();
            holders.retain(|h| h.node_id != node_id);
            dropped += before - holders.len();
            !holders.is_empty()
        });
        self.recount();
        dropped
    }

    fn recount(&mut self) {
        self.in_ram = self.entries.values().filter(|h| in_ram(h)).count();
    }

    /// Drop the entries of keys this node no longer owns (their new owner gets
    /// them from the holders' re-announcements); returns how many keys went.
    pub fn retain_owned(&mut self, mut owns: impl FnMut(&BlockKey) -> bool) -> usize {
        let before = self.entries.len();
        self.entries.retain(|k, _| owns(k));
        self.recount();
        before - self.entries.len()
    }

    /// Number of keys with at least one holder.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the shard holds no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(i: u8) -> BlockKey {
        BlockKey([i; 32])
    }

    fn e(node: &str, tier: HolderTier) -> HolderEntry {
        HolderEntry {
            node_id: node.into(),
            tier,
            size: 10,
            checksum: 1,
        }
    }

    #[test]
    fn best_holder_first_and_reannounce_replaces() {
        let mut d = DirectoryShard::default();
        d.announce(k(1), e("b", HolderTier::Disk));
        d.announce(k(1), e("a", HolderTier::Disk));
        d.announce(k(1), e("c", HolderTier::Ram));
        let ids: Vec<_> = d.locate(&k(1)).iter().map(|h| h.node_id.as_str()).collect();
        assert_eq!(ids, ["c", "a", "b"]);
        d.announce(k(1), e("b", HolderTier::Ram));
        assert_eq!(d.locate(&k(1)).len(), 3);
        assert_eq!(d.locate(&k(1))[0].node_id, "b");
    }

    #[test]
    fn withdraw_drop_node_and_retain_owned() {
        let mut d = DirectoryShard::default();
        d.announce(k(1), e("a", HolderTier::Ram));
        d.announce(k(2), e("a", HolderTier::Ram));
        d.announce(k(2), e("b", HolderTier::Ram));
        assert!(d.withdraw("a", &k(1)));
        assert!(!d.withdraw("a", &k(1)));
        assert!(d.locate(&k(1)).is_empty());
        assert_eq!(d.drop_node("a"), 1);
        assert_eq!(d.locate(&k(2)).len(), 1);
        d.announce(k(3), e("c", HolderTier::Disk));
        assert_eq!(d.retain_owned(|key| *key == k(3)), 1);
        assert_eq!(d.len(), 1);
    }

    /// Keys held in RAM are counted, and an announce says when a key
    /// enters RAM (first RAM holder): what the eviction order's shadows
    /// take as a put (`order_feed`).
    #[test]
    fn keys_in_ram_are_counted_and_entering_ram_is_told() {
        let mut d = DirectoryShard::default();
        let now_in_ram = Announced::NowInRam;
        assert_eq!(d.announce(k(1), e("a", HolderTier::Ram)), now_in_ram);
        assert_ne!(
            d.announce(k(1), e("b", HolderTier::Ram)),
            now_in_ram,
            "a copy"
        );
        assert_ne!(
            d.announce(k(2), e("a", HolderTier::Disk)),
            now_in_ram,
            "disk only"
        );
        assert_eq!(d.in_ram_len(), 1);
        assert_eq!(
            d.announce(k(2), e("b", HolderTier::Ram)),
            now_in_ram,
            "promoted"
        );
        assert_eq!(d.in_ram_len(), 2);
        assert_ne!(
            d.announce(k(1), e("a", HolderTier::Disk)),
            now_in_ram,
            "b keeps k1 in RAM"
        );
        assert!(d.withdraw("b", &k(1)));
        assert_eq!(d.in_ram_len(), 1, "k1 on disk alone");
        assert!(d.withdraw("a", &k(1)));
        assert_eq!(d.drop_node("b"), 1);
        assert_eq!(d.in_ram_len(), 0, "k2 on a's disk alone");
        d.announce(k(3), e("c", HolderTier::Ram));
        d.retain_owned(|key| *key != k(3));
        assert_eq!(d.in_ram_len(), 0);
    }

    /// The first holder's checksum is the key's: another holder announcing
    /// other bytes is refused while a holder of the recorded bytes remains;
    /// a holder may change its own entry when alone.
    #[test]
    fn another_holders_other_bytes_are_refused() {
        let mut d = DirectoryShard::default();
        let with = |node: &str, sum: u64| HolderEntry {
            checksum: sum,
            ..e(node, HolderTier::Ram)
        };
        assert_eq!(d.announce(k(1), with("a", 7)), Announced::NowInRam);
        assert_eq!(d.announce(k(1), with("c", 8)), Announced::Conflict);
        assert_eq!(d.locate(&k(1)).len(), 1, "c not entered");
        assert_eq!(d.announce(k(1), with("b", 7)), Announced::Entered);
        assert!(d.locate(&k(1)).iter().all(|h| h.checksum == 7));
        assert!(d.withdraw("a", &k(1)) && d.withdraw("b", &k(1)));
        assert_eq!(
            d.announce(k(1), with("c", 8)),
            Announced::NowInRam,
            "gone, then new"
        );
        assert_eq!(
            d.announce(k(1), with("c", 9)),
            Announced::Entered,
            "its own entry"
        );
    }
}
