//! The state of one node's cluster side: the [`ClusterNode`] struct every
//! responsibility works on (start and locate in `node.rs`, batched leases in
//! `lease.rs`, reads in `read.rs`, announcements in `announce.rs`, the
//! internal RPCs in `rpc.rs`), and the conversions between directory
//! entries and their protobuf form.
//!
//! It imports none of those modules, so they can all import it without an
//! import loop (the struct used to live in `node.rs`, which imports `lease`
//! and `announce` to start their tasks, while they imported it back).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvfabric_proto::v1::{Holder, Tier};
use kvfabric_transfer::security::NodeIdentity;
use kvfabric_transfer::{SegmentId, TransferEngine};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{watch, Notify};
use tonic::transport::Channel;

use crate::cluster::cluster_config::ClusterConfig;
use crate::cluster::directory::{DirectoryShard, HolderEntry, HolderTier};
use crate::cluster::membership::{Membership, MembershipView, NodeInfo};
use crate::cluster::read_staging::Staging;
use crate::cluster::refresh::SyncState;
use kvfabric_store::ChangeFeed;
use kvfabric_store::ReadLease;
use kvfabric_store::Store;

/// A remote lease to give back: (holder's gRPC address, lease id).
pub(super) type Release = (String, u64);

/// Longest a holder keeps a block leased for a reader.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(60);

/// A lease a holder keeps for a remote reader until Release or expiry.
pub(super) struct HeldLease {
    pub(super) _lease: ReadLease,
    pub(super) deadline: Instant,
}

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
    pub(super) channels: Mutex<HashMap<String, Channel>>,
    pub(super) leases: Mutex<HashMap<u64, HeldLease>>,
    pub(super) next_lease: AtomicU64,
    /// What the store reported and the announcer has not taken yet.
    pub(super) changes: Arc<ChangeFeed>,
    /// The announcer's state (held keys, retries, the refresh under way);
    /// held across an announcement's RPCs, so announcements go out in the
    /// order the store changed.
    pub(super) sync_state: tokio::sync::Mutex<SyncState>,
    /// This node's directory epoch (see [`ClusterNode::directory_epoch`]).
    pub(super) epoch: AtomicU64,
    pub(super) kick: Notify,
    /// Remote leases to give back (drained by the releaser task).
    pub(super) releases: tokio::sync::mpsc::UnboundedSender<Release>,
    /// Lease RPCs this node served as a holder (Lease and LeaseMany).
    pub(super) lease_requests: Counter,
    /// Blocks this node leased to remote readers.
    pub(super) leased_blocks: Counter,
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
