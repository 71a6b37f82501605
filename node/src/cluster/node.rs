//! `ClusterNode`: one node's cluster side — membership, its directory shard,
//! the transfer engine with the RAM arena registered, and the cluster-wide
//! read path (locate at owners, read from the best holder).
//!
//! Whole-block reads (local, else remote holders) live in `read.rs`;
//! announcements and membership handling in `announce.rs`.
//!
//! Directory entries are soft state kept in step with what the store holds
//! by the announcer (`announce.rs`): the store reports each put, tier change
//! and removal on a [`ChangeFeed`]; [`ClusterNode::sync`] re-reads those keys
//! and sends one batched Announce / Withdraw per owner (the gRPC put path
//! calls it before acknowledging). Nothing periodic scans the store; a paced,
//! chunked full refresh (`refresh.rs`) re-seeds owners after a membership
//! change or when an owner's directory epoch changes (it restarted).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kvfabric_proto::internal::v1::directory_service_client::DirectoryServiceClient;
use kvfabric_proto::internal::v1::LocateRequest;
use kvfabric_transfer::security::NodeIdentity;
use kvfabric_transfer::{SegmentId, SharedRegion, TransferEngine};
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use tonic::transport::{Channel, Endpoint};

use crate::cluster::cluster_config::ClusterConfig;
use crate::cluster::directory::{Announced, DirectoryShard, HolderEntry};
use crate::cluster::holder::{HolderLeases, PeerLease};
use crate::cluster::integrity::IntegrityCounters;
use crate::cluster::membership::{Membership, MembershipView, NodeInfo};
pub use crate::cluster::node_state::ClusterNode;
use crate::cluster::node_state::{holder_entry, tier_of};
pub use crate::cluster::read::{FetchedBlock, RangeRead, ReadTarget};
use crate::cluster::read_staging::Staging;
use crate::cluster::refresh::Announcer;
use crate::{BadNodeConfig, NodeError};
use kvfabric_store::keys::BlockKey;
use kvfabric_store::ReadLease;
use kvfabric_store::Store;

impl ClusterNode {
    /// Start the transfer engine (RAM arena registered), the staging region and
    /// membership; `grpc_addr` is the bound gRPC address (advertised unless
    /// `advertise_grpc` says otherwise).
    pub async fn start(
        store: Store,
        cfg: ClusterConfig,
        grpc_addr: SocketAddr,
        registry: &mut Registry,
    ) -> Result<Arc<Self>, NodeError> {
        cfg.validate()?;
        let node_id = store.config().node_id.clone();
        let identity = crate::cluster::security::load(&cfg, &node_id)?;
        if let Some(id) = &identity {
            id.watch_revocations();
        }
        let transfer =
            TransferEngine::start(cfg.transfer_config(&node_id, identity.clone())?, registry)
                .await?;
        let ram_segment = transfer.register(store.region().clone());
        let staging_region = Arc::new(SharedRegion::create(
            "kvfabric-staging",
            cfg.staging_capacity.as_u64() as usize,
        )?);
        let staging = Staging::new(staging_region.clone(), transfer.register(staging_region));
        let me = NodeInfo {
            node_id,
            grpc_addr: cfg
                .advertise_grpc
                .clone()
                .unwrap_or_else(|| grpc_addr.to_string()),
            transfer_addr: cfg
                .advertise_transfer
                .clone()
                .unwrap_or_else(|| transfer.local_addr().to_string()),
        };
        let membership = Membership::start(me.clone(), cfg.membership_source()?).await?;
        let view_rx = membership.subscribe();
        crate::cluster::membership_metrics::register(registry, &membership);
        tracing::info!(node = %me.node_id, grpc = %me.grpc_addr, transfer = %me.transfer_addr, "cluster node started");
        let (releases, release_rx) = tokio::sync::mpsc::unbounded_channel();
        let announcer = Announcer::watch(&store);
        // `adaptive` judges the cluster's lookups of the keys this node's
        // shard owns (`order_feed`), not only this node's.
        if super::order_feed::order_fed(store.config()) {
            store.feed_order_from_cluster();
        }
        let node = Arc::new(ClusterNode {
            me,
            cfg,
            identity,
            store,
            membership: Mutex::new(Some(membership)),
            view_rx,
            transfer,
            ram_segment,
            staging,
            shard: Mutex::new(DirectoryShard::default()),
            channels: Mutex::new(HashMap::new()),
            holder: HolderLeases::new(registry),
            integrity: IntegrityCounters::new(registry),
            announcer,
            releases,
        });
        tokio::spawn(crate::cluster::lease::releaser(
            Arc::downgrade(&node),
            release_rx,
        ));
        tokio::spawn(crate::cluster::announce::background(
            Arc::downgrade(&node),
            node.view_rx.clone(),
        ));
        Ok(node)
    }

    /// This node as peers see it.
    pub fn info(&self) -> &NodeInfo {
        &self.me
    }

    /// The local store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// This node's certificate identity (None in security mode `none`).
    pub fn identity(&self) -> Option<&NodeIdentity> {
        self.identity.as_deref()
    }

    /// [`Self::identity`], shared (the gRPC interceptors keep one).
    pub fn shared_identity(&self) -> Option<Arc<NodeIdentity>> {
        self.identity.clone()
    }

    /// The cluster settings.
    pub fn config(&self) -> &ClusterConfig {
        &self.cfg
    }

    /// The transfer engine (its RAM arena is registered).
    pub fn transfer(&self) -> &TransferEngine {
        &self.transfer
    }

    /// The transfer segment id of this node's RAM arena.
    pub fn ram_segment(&self) -> SegmentId {
        self.ram_segment
    }

    /// The current membership view.
    pub fn view(&self) -> Arc<MembershipView> {
        self.view_rx.borrow().clone()
    }

    /// The store's stats with the blocks served to peers filled in.
    pub fn stats(&self) -> kvfabric_proto::v1::StatsResponse {
        let mut s = crate::wire::stats_to_proto(self.store.stats());
        s.served_blocks = self.holder_lease_counts().1;
        (s.transfer_in_bytes, s.transfer_out_bytes) = self.transfer.metrics().bytes_in_out();
        s
    }

    /// Leave the cluster cleanly (etcd: the lease is revoked, peers see it at once).
    pub async fn leave(&self) {
        let m = self.membership.lock().take();
        if let Some(m) = m {
            m.leave().await;
        }
    }

    /// The gRPC channel to node `node_id` at `addr`; secured, the server
    /// must prove it is that node (its certificate's own DNS name), so a
    /// membership record naming another node's address gets no answer.
    pub(crate) fn channel(&self, node_id: &str, addr: &str) -> Result<Channel, NodeError> {
        let at = (node_id.to_string(), addr.to_string());
        if let Some(c) = self.channels.lock().get(&at) {
            return Ok(c.clone());
        }
        let scheme = if self.identity.is_some() {
            "https"
        } else {
            "http"
        };
        let mut ep = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| {
                NodeError::Config(BadNodeConfig::PeerAddress {
                    addr: addr.to_string(),
                    source: e,
                })
            })?
            .connect_timeout(self.cfg.rpc_timeout())
            .tcp_nodelay(true);
        if let Some(id) = &self.identity {
            ep = ep
                .tls_config(crate::cluster::security::client_tls(id, Some(node_id)))
                .map_err(|e| {
                    NodeError::Config(BadNodeConfig::Tls {
                        what: "peer channel tls",
                        source: e,
                    })
                })?;
        }
        let ch = ep.connect_lazy();
        self.channels.lock().insert(at, ch.clone());
        Ok(ch)
    }

    pub(super) fn directory_client(
        &self,
        owner: &NodeInfo,
    ) -> Result<DirectoryServiceClient<Channel>, NodeError> {
        let limit = 256 << 20;
        Ok(
            DirectoryServiceClient::new(self.channel(&owner.node_id, &owner.grpc_addr)?)
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
        )
    }

    // ---- directory shard (owner side) ----

    pub(crate) fn shard_announce(&self, entries: Vec<(BlockKey, HolderEntry)>) -> usize {
        let n = entries.len();
        let (entered, held, refused) = {
            let mut shard = self.shard.lock();
            let mut entered = Vec::new();
            let mut refused = 0;
            for (k, e) in entries {
                match shard.announce(k, e) {
                    Announced::NowInRam => entered.push(k),
                    Announced::Entered => {}
                    Announced::Conflict => refused += 1,
                }
            }
            (entered, shard.in_ram_len(), refused)
        };
        if refused > 0 {
            tracing::warn!(
                refused,
                "announcements of other bytes than a key's recorded checksum refused"
            );
            self.integrity.conflicting_announces.inc_by(refused as u64);
        }
        self.feed_order_puts(&entered, held);
        n - refused
    }

    pub(crate) fn shard_withdraw(&self, node_id: &str, keys: &[BlockKey]) -> usize {
        let mut shard = self.shard.lock();
        keys.iter().filter(|k| shard.withdraw(node_id, k)).count()
    }

    /// Holders of `keys` in this node's shard, best first, live nodes only.
    /// Entries naming this node for blocks it no longer stores are dropped.
    pub(crate) fn shard_locate(&self, keys: &[BlockKey]) -> Vec<Vec<HolderEntry>> {
        let view = self.view();
        let mut out: Vec<Vec<HolderEntry>> = {
            let shard = self.shard.lock();
            keys.iter()
                .map(|k| {
                    shard
                        .locate(k)
                        .iter()
                        .filter(|h| view.contains(&h.node_id))
                        .cloned()
                        .collect()
                })
                .collect()
        };
        let mine: Vec<usize> = (0..keys.len())
            .filter(|&i| out[i].iter().any(|h| h.node_id == self.me.node_id))
            .collect();
        if !mine.is_empty() {
            let probe: Vec<BlockKey> = mine.iter().map(|&i| keys[i]).collect();
            let present = self.store.exists(&probe);
            let mut gone = Vec::new();
            for (&i, here) in mine.iter().zip(present) {
                if !here {
                    out[i].retain(|h| h.node_id != self.me.node_id);
                    gone.push(keys[i]);
                }
            }
            self.shard_withdraw(&self.me.node_id.clone(), &gone);
        }
        out
    }

    // ---- cluster-wide reads ----

    /// Holders of each key anywhere in the cluster, best first (this node
    /// first, then remote RAM, then remote disk). One Locate per owner, in
    /// parallel; an owner that fails to answer yields no holders (misses).
    pub async fn locate(&self, keys: &[BlockKey]) -> Vec<Vec<HolderEntry>> {
        self.locate_for(keys, false).await
    }

    /// [`Self::locate`]; `lookup`: the keys are a client lookup's, which
    /// each owner replays on its eviction order's shadows (`order_feed`).
    async fn locate_for(&self, keys: &[BlockKey], lookup: bool) -> Vec<Vec<HolderEntry>> {
        let view = self.view();
        let local = self.store.block_infos(keys);
        let mut out: Vec<Vec<HolderEntry>> = local
            .iter()
            .map(|i| {
                i.iter()
                    .map(|i| HolderEntry {
                        node_id: self.me.node_id.clone(),
                        tier: tier_of(i.tier),
                        size: i.len,
                        checksum: i.checksum,
                    })
                    .collect()
            })
            .collect();
        let mut by_owner: HashMap<String, (NodeInfo, Vec<usize>)> = HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            if let Some(owner) = view.owner(k) {
                by_owner
                    .entry(owner.node_id.clone())
                    .or_insert_with(|| (owner.clone(), Vec::new()))
                    .1
                    .push(i);
            }
        }
        let asks = by_owner.into_values().map(|(owner, idx)| async move {
            let ks: Vec<BlockKey> = idx.iter().map(|&i| keys[i]).collect();
            let found = if owner.node_id == self.me.node_id {
                let found = self.shard_locate(&ks);
                if lookup {
                    self.feed_order_lookup(&ks, &found);
                }
                found
            } else {
                self.remote_locate(&owner, &ks, lookup).await
            };
            (idx, found)
        });
        for (idx, found) in futures::future::join_all(asks).await {
            for (i, holders) in idx.into_iter().zip(found) {
                for h in holders {
                    if h.node_id != self.me.node_id && view.contains(&h.node_id) {
                        out[i].push(h);
                    }
                }
            }
        }
        for holders in &mut out {
            if holders.len() > 2 {
                holders[1..]
                    .sort_by(|a, b| a.tier.cmp(&b.tier).then_with(|| a.node_id.cmp(&b.node_id)));
            }
        }
        out
    }

    async fn remote_locate(
        &self,
        owner: &NodeInfo,
        keys: &[BlockKey],
        lookup: bool,
    ) -> Vec<Vec<HolderEntry>> {
        let req = LocateRequest {
            keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
            lookup,
        };
        let call = async {
            let mut c = self.directory_client(owner)?;
            c.locate(req).await.map_err(|s| NodeError::PeerRpc {
                op: "locate",
                peer: owner.node_id.clone(),
                status: Box::new(s),
            })
        };
        match tokio::time::timeout(self.cfg.rpc_timeout(), call).await {
            Ok(Ok(resp)) => {
                let located = resp.into_inner().located;
                if located.len() != keys.len() {
                    tracing::warn!(owner = %owner.node_id, "locate answered {} of {} keys", located.len(), keys.len());
                    return vec![Vec::new(); keys.len()];
                }
                located
                    .iter()
                    .map(|l| l.holders.iter().map(holder_entry).collect())
                    .collect()
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "locate failed: counted as misses");
                vec![Vec::new(); keys.len()]
            }
            Err(_) => {
                tracing::debug!(owner = %owner.node_id, "locate timed out: counted as misses");
                vec![Vec::new(); keys.len()]
            }
        }
    }

    /// Longest prefix of `keys` present anywhere, with the best holder of each
    /// of its blocks. Counts the hits and misses in the node's lookup metrics,
    /// feeds this node's part of the lookup to its store's capacity planner
    /// (a cluster node's lookups do not go through `Store::lookup`), and
    /// each key's owner replays its keys on its RAM order's shadows (the
    /// locate says it is a lookup; `order_feed`).
    pub async fn lookup(&self, keys: &[BlockKey]) -> Vec<HolderEntry> {
        let located = self.locate_for(keys, true).await;
        let (mine, here) = self.own_part(keys, &located);
        self.store.note_lookup(&mine, here);
        let prefix: Vec<HolderEntry> = located
            .into_iter()
            .map_while(|mut h| (!h.is_empty()).then(|| h.swap_remove(0)))
            .collect();
        self.store
            .count_lookup(prefix.len() as u64, (keys.len() - prefix.len()) as u64);
        prefix
    }

    /// What this node's tier has to do with a lookup of `keys` (`located`):
    /// the blocks of the found prefix it holds, and every key from the first
    /// one missing everywhere on (the engine computes those and puts them
    /// here), in order; and how many of them lead the found prefix: what the
    /// capacity planner's what-if tiers of this node see. A block only other
    /// nodes hold is theirs to keep: counted here it would break this node's
    /// prefix (a shared system prompt saved on another node).
    fn own_part(&self, keys: &[BlockKey], located: &[Vec<HolderEntry>]) -> (Vec<BlockKey>, usize) {
        let mut mine = Vec::with_capacity(keys.len());
        let mut here = 0;
        let mut found = true;
        for (k, holders) in keys.iter().zip(located) {
            // `locate` lists this node first where it holds a block.
            match holders.first() {
                _ if !found => mine.push(*k),
                Some(h) if h.node_id == self.me.node_id => {
                    mine.push(*k);
                    here += 1;
                }
                Some(_) => {}
                None => {
                    found = false;
                    mine.push(*k);
                }
            }
        }
        (mine, here)
    }

    /// Presence of each key anywhere in the cluster.
    pub async fn exists(&self, keys: &[BlockKey]) -> Vec<bool> {
        self.locate(keys)
            .await
            .into_iter()
            .map(|h| !h.is_empty())
            .collect()
    }

    // ---- holder side (state and work in `holder.rs`) ----

    /// (lease RPCs served as a holder, blocks leased to remote readers) so far.
    pub fn holder_lease_counts(&self) -> (u64, u64) {
        self.holder.counts()
    }

    /// Leases this node holds for remote readers right now.
    pub fn remote_leases_held(&self) -> usize {
        self.holder.len()
    }

    /// Store leases of `keys` held here (None where not stored).
    pub(crate) async fn lease_local(&self, keys: &[BlockKey]) -> Vec<Option<ReadLease>> {
        HolderLeases::lease_local(&self.store, keys).await
    }

    /// Lease `keys` for a remote reader (promoting from disk if needed);
    /// None when not stored here.
    pub(crate) async fn lease_for_peer(
        &self,
        keys: &[BlockKey],
        ttl: Duration,
    ) -> Vec<Option<PeerLease>> {
        let leases = self.lease_local(keys).await;
        self.holder.keep(leases, self.ram_segment, ttl)
    }

    /// End the holder leases `ids` (a reader's Release).
    pub(crate) fn release_leases(&self, ids: &[u64]) {
        self.holder.release(&self.transfer, ids)
    }

    /// End the holder leases past their deadline.
    pub(super) fn reap_leases(&self) {
        self.holder.reap(&self.transfer)
    }
}
