//! Batched read leases: [`ClusterNode::lease_many`] leases many blocks at
//! once — this node's tiers first, then each key's hinted holder (from a
//! lookup), then the holders its owner lists — with ONE `LeaseMany` RPC per
//! holder, holders in parallel. A [`LeasedBlock`] pins the block where it is
//! (a store lease here, a `HolderService` lease at a peer) until it drops.
//!
//! Remote leases are released in the background: dropping a [`LeasedBlock`]
//! queues its lease id on a channel, and the releaser task drains whatever is
//! queued and sends one `ReleaseMany` per holder. A lost release is healed by
//! the holder's lease TTL ([`READ_LEASE_TTL`]).
//!
//! The holder side (the leases this node keeps for remote readers) is
//! `holder.rs`.

use std::collections::{HashMap, VecDeque};
use std::sync::Weak;

use kvfabric_proto::internal::v1::holder_service_client::HolderServiceClient;
use kvfabric_proto::internal::v1::{LeaseManyRequest, LeaseResponse, ReleaseManyRequest};
use kvfabric_transfer::SegmentId;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::cluster::directory::{HolderEntry, HolderTier};
use crate::cluster::membership::NodeInfo;
use crate::cluster::node_state::{tier_of, ClusterNode, Release};
use crate::NodeError;
use kvfabric_store::keys::{BlockKey, KvLayout};
use kvfabric_store::ReadLease;

/// How long a holder keeps a block leased for a reader that does not release
/// it (a reader that crashed): long enough for a layer-wise load across a
/// forward pass, short enough not to pin RAM for long.
pub const READ_LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(10);

/// A block leased for reading: in this node's tiers (a store lease) or at a
/// remote holder (a HolderService lease). Dropping it releases the lease.
pub struct LeasedBlock {
    key: BlockKey,
    len: u64,
    checksum: u64,
    layout: KvLayout,
    holder: String,
    tier: HolderTier,
    pub(super) source: LeaseSource,
}

/// Where a leased block's bytes are.
pub(super) enum LeaseSource {
    /// In this node's RAM arena.
    Local(ReadLease),
    /// In a peer's transfer segment.
    Remote(RemoteLease),
}

/// A lease held at a peer; released (in the background) on drop.
pub(super) struct RemoteLease {
    /// The holder: its node id and gRPC address.
    holder: (String, String),
    pub(super) transfer_addr: String,
    pub(super) segment: SegmentId,
    pub(super) offset: u64,
    /// Secured modes: the holder's grant, shown with every READ.
    pub(super) capability: Option<kvfabric_transfer::security::Capability>,
    lease_id: u64,
    releases: mpsc::UnboundedSender<Release>,
}

impl Drop for RemoteLease {
    fn drop(&mut self) {
        // The releaser is gone only when the node is; the holder's TTL then frees it.
        let _ = self
            .releases
            .send((std::mem::take(&mut self.holder), self.lease_id));
    }
}

impl LeasedBlock {
    /// The block's key.
    pub fn key(&self) -> &BlockKey {
        &self.key
    }

    /// Block bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the block has no bytes (never true for a stored block).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// xxh3-64 of the whole block, as stored.
    pub fn checksum(&self) -> u64 {
        self.checksum
    }

    /// The block's layout.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Node id serving it.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The tier the holder listed it in (RAM once leased here).
    pub fn tier(&self) -> HolderTier {
        self.tier
    }

    /// Whether the bytes are in this node's tiers (a copy, no transfer).
    pub fn is_local(&self) -> bool {
        matches!(self.source, LeaseSource::Local(_))
    }
}

impl std::fmt::Debug for LeasedBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedBlock")
            .field("key", &self.key)
            .field("len", &self.len)
            .field("holder", &self.holder)
            .field("local", &self.is_local())
            .finish()
    }
}

impl ClusterNode {
    /// Lease many blocks: this node's tiers first, then the hinted holder
    /// (`hints[i]`, from a lookup), else the holders the key's owner lists;
    /// ONE lease RPC per holder carrying all its keys, holders in parallel.
    /// None where no holder could lease the key. A holder that fails or no
    /// longer has a block is reported stale to the key's owner.
    pub async fn lease_many(
        &self,
        keys: &[BlockKey],
        hints: &[Option<HolderEntry>],
    ) -> Vec<Option<LeasedBlock>> {
        self.lease_skipping(keys, hints, &[]).await
    }

    /// [`Self::lease_many`] never asking the nodes in `skip`.
    pub(super) async fn lease_skipping(
        &self,
        keys: &[BlockKey],
        hints: &[Option<HolderEntry>],
        skip: &[String],
    ) -> Vec<Option<LeasedBlock>> {
        let me = self.me.node_id.clone();
        let mut out: Vec<Option<LeasedBlock>> = (0..keys.len()).map(|_| None).collect();
        if !skip.contains(&me) {
            for (i, l) in self.lease_local(keys).await.into_iter().enumerate() {
                out[i] = l.map(|l| self.local_block(l));
            }
        }
        let view = self.view();
        let usable = |h: &HolderEntry| {
            h.node_id != me && !skip.contains(&h.node_id) && view.contains(&h.node_id)
        };
        let mut queue: Vec<VecDeque<HolderEntry>> = vec![VecDeque::new(); keys.len()];
        let mut located = vec![false; keys.len()];
        let mut tried: Vec<Vec<String>> = vec![Vec::new(); keys.len()];
        for (i, q) in queue.iter_mut().enumerate() {
            if let Some(Some(h)) = hints.get(i) {
                if out[i].is_none() && usable(h) {
                    q.push_back(h.clone());
                }
            }
        }
        let mut stale: Vec<(String, BlockKey)> = Vec::new();
        loop {
            let need: Vec<usize> = (0..keys.len())
                .filter(|&i| out[i].is_none() && queue[i].is_empty() && !located[i])
                .collect();
            if !need.is_empty() {
                let ks: Vec<BlockKey> = need.iter().map(|&i| keys[i]).collect();
                for (&i, holders) in need.iter().zip(self.locate(&ks).await) {
                    located[i] = true;
                    queue[i].extend(
                        holders
                            .into_iter()
                            .filter(|h| usable(h) && !tried[i].contains(&h.node_id)),
                    );
                }
            }
            let mut groups: HashMap<String, (NodeInfo, Vec<usize>, Vec<HolderEntry>)> =
                HashMap::new();
            for i in 0..keys.len() {
                if out[i].is_some() {
                    continue;
                }
                let Some(h) = queue[i].pop_front() else {
                    continue;
                };
                let Some(peer) = view.nodes.get(&h.node_id) else {
                    continue;
                };
                tried[i].push(h.node_id.clone());
                let g = groups
                    .entry(h.node_id.clone())
                    .or_insert_with(|| (peer.clone(), Vec::new(), Vec::new()));
                g.1.push(i);
                g.2.push(h);
            }
            if groups.is_empty() {
                // Keys whose queue ran dry before they were located get one more round.
                if (0..keys.len()).any(|i| out[i].is_none() && queue[i].is_empty() && !located[i]) {
                    continue;
                }
                break;
            }
            let asks = groups.into_values().map(|(peer, idx, expect)| async move {
                let ks: Vec<BlockKey> = idx.iter().map(|&i| keys[i]).collect();
                let got = self.remote_lease_many(&peer, &ks, &expect).await;
                (peer, idx, got)
            });
            for (peer, idx, got) in futures::future::join_all(asks).await {
                for (i, b) in idx.into_iter().zip(got) {
                    match b {
                        Some(b) => out[i] = Some(b),
                        None => stale.push((peer.node_id.clone(), keys[i])),
                    }
                }
            }
        }
        if !stale.is_empty() {
            self.report_stale_many(&view, stale).await;
        }
        out
    }

    fn local_block(&self, lease: ReadLease) -> LeasedBlock {
        let i = *lease.info();
        LeasedBlock {
            key: i.key,
            len: i.len,
            checksum: i.checksum,
            layout: i.layout,
            holder: self.me.node_id.clone(),
            tier: tier_of(i.tier),
            source: LeaseSource::Local(lease),
        }
    }

    fn holder_client(&self, peer: &NodeInfo) -> Result<HolderServiceClient<Channel>, NodeError> {
        let limit = 64 << 20;
        Ok(
            HolderServiceClient::new(self.channel(&peer.node_id, &peer.grpc_addr)?)
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
        )
    }

    /// One LeaseMany at `peer`; None for each key it did not lease (not held,
    /// a size other than the directory's, or the call failed or timed out).
    async fn remote_lease_many(
        &self,
        peer: &NodeInfo,
        keys: &[BlockKey],
        expect: &[HolderEntry],
    ) -> Vec<Option<LeasedBlock>> {
        let none = || (0..keys.len()).map(|_| None).collect();
        let req = LeaseManyRequest {
            keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
            ttl_ms: READ_LEASE_TTL.as_millis() as u64,
            reader: self.me.node_id.clone(),
        };
        let call = async {
            let mut c = self.holder_client(peer)?;
            c.lease_many(req).await.map_err(|s| NodeError::PeerRpc {
                op: "lease",
                peer: peer.node_id.clone(),
                status: Box::new(s),
            })
        };
        let leases = match tokio::time::timeout(self.cfg.remote_read_timeout(), call).await {
            Ok(Ok(r)) => r.into_inner().leases,
            Ok(Err(e)) => {
                tracing::info!(holder = %peer.node_id, error = %e, "lease failed; misses");
                return none();
            }
            Err(_) => {
                tracing::info!(holder = %peer.node_id, "lease timed out; misses");
                return none();
            }
        };
        if leases.len() != keys.len() {
            tracing::warn!(holder = %peer.node_id, "lease answered {} of {} keys", leases.len(), keys.len());
            for l in leases.iter().filter(|l| l.lease_id != 0) {
                let _ = self.releases.send((holder_of(peer), l.lease_id));
            }
            return none();
        }
        leases
            .into_iter()
            .zip(keys.iter().zip(expect))
            .map(|(l, (k, e))| self.remote_block(peer, *k, e, l))
            .collect()
    }

    fn remote_block(
        &self,
        peer: &NodeInfo,
        key: BlockKey,
        expect: &HolderEntry,
        l: LeaseResponse,
    ) -> Option<LeasedBlock> {
        if l.lease_id == 0 {
            return None;
        }
        let remote = RemoteLease {
            holder: holder_of(peer),
            transfer_addr: peer.transfer_addr.clone(),
            segment: SegmentId(l.segment_id),
            offset: l.offset,
            capability: kvfabric_transfer::security::Capability::decode(&l.capability),
            lease_id: l.lease_id,
            releases: self.releases.clone(),
        };
        // From here on, dropping `remote` releases the lease.
        if l.checksum != expect.checksum {
            // Other bytes than the key's directory entry recorded: the
            // holder's copy is not the writer's (or it is not who it says).
            tracing::warn!(holder = %peer.node_id, key = ?key, "leased checksum is not the recorded one");
            self.integrity.holder_mismatches.inc();
            return None;
        }
        if l.size != expect.size || l.size == 0 {
            tracing::info!(holder = %peer.node_id, "leased size {} != directory's {}", l.size, expect.size);
            return None;
        }
        let layout = match l.layout.as_ref().map(KvLayout::try_from) {
            Some(Ok(layout)) => layout,
            _ => {
                tracing::info!(holder = %peer.node_id, "lease without a valid layout");
                return None;
            }
        };
        Some(LeasedBlock {
            key,
            len: l.size,
            // Verified against the directory's record, never the holder's word.
            checksum: expect.checksum,
            layout,
            holder: peer.node_id.clone(),
            tier: expect.tier,
            source: LeaseSource::Remote(remote),
        })
    }
}

/// Drain queued releases into one ReleaseMany per holder, until every
/// sender (the node and its leased blocks) is gone.
pub(super) async fn releaser(node: Weak<ClusterNode>, mut rx: mpsc::UnboundedReceiver<Release>) {
    while let Some(first) = rx.recv().await {
        let mut by_holder: HashMap<(String, String), Vec<u64>> = HashMap::new();
        by_holder.entry(first.0).or_default().push(first.1);
        while let Ok((addr, id)) = rx.try_recv() {
            by_holder.entry(addr).or_default().push(id);
        }
        let Some(n) = node.upgrade() else { return };
        let sends = by_holder.into_iter().map(|((holder, addr), lease_ids)| {
            let n = &n;
            async move {
                let Ok(ch) = n.channel(&holder, &addr) else {
                    return;
                };
                let mut c = HolderServiceClient::new(ch);
                let call = c.release_many(ReleaseManyRequest { lease_ids });
                if !matches!(
                    tokio::time::timeout(n.cfg.rpc_timeout(), call).await,
                    Ok(Ok(_))
                ) {
                    tracing::debug!(holder = %addr, "release failed; the lease TTL frees it");
                }
            }
        });
        futures::future::join_all(sends).await;
    }
}

/// The (node id, gRPC address) a release of `peer`'s lease goes to.
fn holder_of(peer: &NodeInfo) -> (String, String) {
    (peer.node_id.clone(), peer.grpc_addr.clone())
}
