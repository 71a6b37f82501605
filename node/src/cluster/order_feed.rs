//! What a cluster node's directory shard tells its RAM tier's eviction
//! order: the `adaptive` order's shadows (LIRS and LRU, see
//! `policy::adaptive`) replay the cluster's lookups and puts of the keys
//! this node owns, not the lookups and puts of this node's tier.
//!
//! Why: on a cluster a tier's blocks are read by every node (a peer leases
//! them, `lease_for_peer`), a block missing everywhere is computed and put
//! on the node that looked it up, and the directory forgets a block once
//! its holder evicts it. Fed from its own node, a tier's shadows saw none
//! of its peers' reads, and never a lookup of a block it had evicted (that
//! goes to whoever looks it up next): the order it did not run could never
//! show what it would have kept, so `adaptive` stayed where it started (LRU)
//! on `bench agentic --compare-eviction` (docs/BENCHMARKS.md). A key's
//! owner instead sees every lookup of it (each lookup locates its keys at
//! their owners) and every first holder's announcement, whether or not any
//! tier holds it: its shadows replay the cluster as one cache over the
//! owned keys (rendezvous hashing samples about 1/N of them, SHARDS-style),
//! sized to the most owned keys the cluster's RAM tiers held at once. Each node applies
//! its shard's verdict to its own tier; every node's shard samples the same
//! cluster-wide traffic, so they agree where the two orders are not close.
//!
//! The cache they model is the cluster's RAM: a key "enters" it when it
//! gets its first holder in RAM (a put, or a promotion from disk), and a
//! lookup's hit in a shadow is the longest held prefix of the owned keys in
//! chain order, those of them leading with a RAM holder counted as found.
//! Only lookups' locates feed it (the `lookup` flag of `LocateRequest`), not
//! those of reads, exists or fan-outs.

use crate::cluster::directory::{in_ram, HolderEntry};
use crate::cluster::node_state::ClusterNode;
use kvfabric_store::keys::BlockKey;
use kvfabric_store::{EvictionPolicy, NodeConfig};

/// Whether a node with `config` feeds its RAM order from its shard: only
/// `adaptive` has shadows, and `adaptive_cluster_feed` may turn it off.
/// Checked before every feed, so a node that does not feed never takes
/// the store's lock for it (each announce and lookup locate reaches here).
pub(crate) fn order_fed(config: &NodeConfig) -> bool {
    config.adaptive_cluster_feed && config.eviction == EvictionPolicy::Adaptive
}

impl ClusterNode {
    /// A lookup located the shard's `keys` (chain order): `located[i]` are
    /// the live holders of `keys[i]`, best first. Its prefix held in RAM is
    /// what the cluster had.
    pub(crate) fn feed_order_lookup(&self, keys: &[BlockKey], located: &[Vec<HolderEntry>]) {
        if !order_fed(self.store.config()) {
            return;
        }
        let found = located.iter().take_while(|h| in_ram(h)).count();
        self.store.note_cluster_lookup(keys, found);
    }

    /// `entered` keys of the shard got their first holder in RAM; `held`
    /// keys of the shard have one now. Nothing entered: `held` did not
    /// grow either (it counts entries), so there is nothing to tell.
    pub(crate) fn feed_order_puts(&self, entered: &[BlockKey], held: usize) {
        if entered.is_empty() || !order_fed(self.store.config()) {
            return;
        }
        self.store.note_cluster_put(entered, held);
    }
}
