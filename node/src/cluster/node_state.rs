//! The state of one node's cluster side: the [`ClusterNode`] struct every
//! responsibility works on (start and locate in `node.rs`, batched leases in
//! `lease.rs`, reads in `read.rs`, announcements in `announce.rs`, the
//! internal RPCs in `rpc.rs`), and the conversions between directory
//! entries and their protobuf form. Roles whose state is their own are
//! fields of their own type: the holder's leases ([`HolderLeases`],
//! `holder.rs`) and the announcer's bookkeeping ([`Announcer`],
//! `refresh.rs`), neither of which knows the node.
//!
//! It imports none of the modules that work on it, so they can all import
//! it without an import loop (`node.rs` imports `lease` and `announce` to
//! start their tasks).

use std::collections::HashMap;
use std::sync::Arc;

use kvfabric_proto::v1::{Holder, Tier};
use kvfabric_transfer::security::NodeIdentity;
use kvfabric_transfer::{SegmentId, TransferEngine};
use parking_lot::Mutex;
use tokio::sync::watch;
use tonic::transport::Channel;

use crate::cluster::cluster_config::ClusterConfig;
use crate::cluster::directory::{DirectoryShard, HolderEntry, HolderTier};
use crate::cluster::holder::HolderLeases;
use crate::cluster::integrity::IntegrityCounters;
use crate::cluster::membership::{Membership, MembershipView, NodeInfo};
use crate::cluster::read_staging::Staging;
use crate::cluster::refresh::Announcer;
use kvfabric_store::Store;

/// A remote lease to give back: the holder (node id, gRPC address) and
/// the lease id.
pub(super) type Release = ((String, String), u64);

/// One node's cluster state.
pub struct ClusterNode {
    pub(super) me: NodeInfo,
    pub(super) cfg: ClusterConfig,
    /// Secured modes: this node's certificate identity (gRPC and transfer).
    pub(super) identity: Option<Arc<NodeIdentity>>,
    pub(super) store: Store,
    pub(super) membership: Mutex<Option<Membership>>,
    pub(super) view_rx: watch::Receiver<Arc<MembershipView>>,
    pub(super) transfer: TransferEngine,
    pub(super) ram_segment: SegmentId,
    pub(super) staging: Arc<Staging>,
    pub(super) shard: Mutex<DirectoryShard>,
    pub(super) channels: Mutex<HashMap<(String, String), Channel>>,
    /// The leases this node keeps for remote readers (`holder.rs`).
    pub(super) holder: HolderLeases,
    /// Blocks refused for other bytes than recorded (`integrity.rs`).
    pub(super) integrity: IntegrityCounters,
    /// The announcer's state and wake-up (`refresh.rs`; its work: `announce.rs`).
    pub(super) announcer: Announcer,
    /// Remote leases to give back (drained by the releaser task).
    pub(super) releases: tokio::sync::mpsc::UnboundedSender<Release>,
}

pub(crate) fn tier_of(t: kvfabric_store::Tier) -> HolderTier {
    use kvfabric_store::Tier as T;
    match t {
        T::Vram => HolderTier::Vram,
        T::Disk => HolderTier::Disk,
        _ => HolderTier::Ram,
    }
}

pub(crate) fn tier_store(t: HolderTier) -> kvfabric_store::Tier {
    use kvfabric_store::Tier as T;
    match t {
        HolderTier::Vram => T::Vram,
        HolderTier::Ram => T::Ram,
        HolderTier::Disk => T::Disk,
    }
}

pub(crate) fn tier_pb(t: HolderTier) -> Tier {
    crate::wire::tier_to_proto(tier_store(t))
}

pub(crate) fn holder_pb(e: &HolderEntry) -> Holder {
    Holder {
        node_id: e.node_id.clone(),
        tier: tier_pb(e.tier) as i32,
        size: e.size,
        checksum: e.checksum,
    }
}

pub(crate) fn holder_entry(h: &Holder) -> HolderEntry {
    HolderEntry {
        node_id: h.node_id.clone(),
        tier: tier_of(crate::wire::tier_from_proto(
            Tier::try_from(h.tier).unwrap_or(Tier::Ram),
        )),
        size: h.size,
        checksum: h.checksum,
    }
}
