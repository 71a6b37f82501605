//! Announcements: keeping the owners' directory entries in step with what
//! this node's store holds (holder side), and trimming this node's shard when
//! membership changes (owner side). Soft state throughout.
//!
//! Event-driven: the store reports each change (put, tier change, removal)
//! on its [`ChangeFeed`](crate::ChangeFeed); the announcer re-reads those
//! keys and sends one Announce / Withdraw per owner. Nothing periodic scans
//! the store. A full refresh (every held key re-announced) runs only when an
//! owner may have lost entries — at start, on a membership change, when an
//! owner's directory epoch changes (it restarted or dropped entries), or when
//! it missed more announcements than are retried — and walks the held keys
//! in chunks of `refresh_chunk_blocks`, `refresh_chunks_per_period` chunks
//! per period, taking the store's lock once per chunk.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use kvfabric_proto::internal::v1::{AnnounceRequest, DirectoryEntry, WithdrawRequest};
use tokio::sync::watch;

use crate::cluster::directory::HolderEntry;
use crate::cluster::membership::{MembershipView, NodeInfo};
use crate::cluster::node_state::{holder_pb, tier_of, ClusterNode};
use crate::cluster::refresh::{Owners, SyncState};
use kvfabric_store::keys::BlockKey;
use kvfabric_store::ChangeFeed;

impl ClusterNode {
    /// The store's change feed (announcer queue and KV-event publisher).
    pub fn change_feed(&self) -> &Arc<ChangeFeed> {
        &self.announcer.changes
    }

    /// Ask for a reconcile soon (e.g. after a put that bypassed the gRPC API).
    pub fn kick(&self) {
        self.announcer.kick.notify_one();
    }
}

/// Where the directory refresh stands ([`ClusterNode::refresh_status`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefreshStatus {
    /// Keys the refresh under way has walked; None when none is under way.
    pub walked: Option<usize>,
    /// Full refreshes finished since the node started.
    pub done: u64,
    /// Keys the announcer knows this node holds.
    pub held: usize,
}

/// Response header carrying the owner's directory epoch.
pub(crate) const EPOCH_HEADER: &str = "kvfabric-directory-epoch";

type Adds = HashMap<String, (NodeInfo, Vec<(BlockKey, HolderEntry)>)>;
type Withdraws = HashMap<String, (NodeInfo, Vec<BlockKey>)>;

impl ClusterNode {
    // ---- announcements (holder side) ----

    /// Announce every change the store reported so far (new blocks, tier
    /// changes) to the keys' owners and withdraw blocks that are gone;
    /// returns once the owners answered. Work is proportional to the
    /// changes, not to what the store holds.
    pub async fn sync(&self) {
        let mut st = self.announcer.state.lock().await;
        let keys: Vec<BlockKey> = self
            .announcer
            .changes
            .take()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        if !keys.is_empty() {
            self.push_state(&mut st, keys, None).await;
        }
    }

    /// Register `keys` (just stored here) with their owners now, along with
    /// every other change reported so far; returns once the owners answered.
    /// Keys no longer stored are withdrawn if they were announced.
    pub async fn announce_keys(&self, keys: &[BlockKey]) {
        let mut st = self.announcer.state.lock().await;
        let mut all: Vec<BlockKey> = self
            .announcer
            .changes
            .take()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        all.extend_from_slice(keys);
        self.push_state(&mut st, all, None).await;
    }

    /// Start a full refresh: every held block is re-announced, paced
    /// (`refresh_chunk_blocks` per chunk, `refresh_chunks_per_period` chunks
    /// per period). Needed only where an owner lost entries unseen.
    pub async fn full_refresh(&self) {
        self.announcer.state.lock().await.request_refresh(None);
    }

    /// Where the directory refresh stands.
    pub async fn refresh_status(&self) -> RefreshStatus {
        let st = self.announcer.state.lock().await;
        RefreshStatus {
            walked: st.walked(),
            done: st.refreshes_done,
            held: st.held.len(),
        }
    }

    /// One chunk of the refresh under way, if any.
    pub(super) async fn refresh_step(&self) {
        let mut st = self.announcer.state.lock().await;
        if let Some((keys, owners)) = st.next_chunk(self.cfg.refresh_chunk_blocks) {
            self.push_state(&mut st, keys, owners.as_ref()).await;
        }
    }

    /// The periodic part: reap leases, retry failed announcements, and ask
    /// owners not heard from this period for their directory epoch (an
    /// empty Announce). Cost: the retries and one RPC per peer.
    pub(super) async fn period(&self, period: Duration) {
        self.reap_leases();
        let mut st = self.announcer.state.lock().await;
        let retry = st.take_retry(self.cfg.refresh_chunk_blocks);
        if !retry.is_empty() {
            self.push_state(&mut st, retry, None).await;
        }
        let view = self.view();
        st.retain_owners(|o| view.contains(o));
        let now = Instant::now();
        let quiet: Vec<&NodeInfo> = view
            .nodes
            .values()
            .filter(|n| n.node_id != self.me.node_id)
            .filter(|n| st.last_seen(&n.node_id).is_none_or(|t| now - t >= period))
            .collect();
        let probes = quiet
            .into_iter()
            .map(|o| async move { (o.node_id.clone(), self.announce_to(o, Vec::new()).await) });
        for (owner, epoch) in futures::future::join_all(probes).await {
            if let Some(e) = epoch {
                st.saw_owner(&owner, e, Instant::now());
            }
        }
    }

    /// Read `keys`' current state from the store (one short lock per
    /// `refresh_chunk_blocks` keys), announce the ones held to their owners
    /// (only owners in `only`, when given) and withdraw the ones gone that
    /// were held. Failed announcements are kept for a retry.
    async fn push_state(
        &self,
        st: &mut SyncState,
        mut keys: Vec<BlockKey>,
        only: Option<&BTreeSet<String>>,
    ) {
        keys.sort_unstable();
        keys.dedup();
        let view = self.view();
        let mut adds: Adds = HashMap::new();
        let mut withdraws: Withdraws = HashMap::new();
        for chunk in keys.chunks(self.cfg.refresh_chunk_blocks.max(1)) {
            for (k, info) in chunk.iter().zip(self.store.block_infos(chunk)) {
                let Some(owner) = view.owner(k) else { continue };
                match info {
                    Some(info) => {
                        st.held.insert(*k);
                        if only.is_some_and(|o| !o.contains(&owner.node_id)) {
                            continue;
                        }
                        let entry = HolderEntry {
                            node_id: self.me.node_id.clone(),
                            tier: tier_of(info.tier),
                            size: info.len,
                            checksum: info.checksum,
                        };
                        adds.entry(owner.node_id.clone())
                            .or_insert_with(|| (owner.clone(), Vec::new()))
                            .1
                            .push((*k, entry));
                    }
                    None if st.held.remove(k) => withdraws
                        .entry(owner.node_id.clone())
                        .or_insert_with(|| (owner.clone(), Vec::new()))
                        .1
                        .push(*k),
                    None => {}
                }
            }
        }
        let sends = adds.into_values().map(|(owner, entries)| async move {
            let keys: Vec<BlockKey> = entries.iter().map(|(k, _)| *k).collect();
            let epoch = self.announce_to(&owner, entries).await;
            (owner.node_id, keys, epoch)
        });
        let withdraw_sends = withdraws.into_values().map(|(owner, keys)| async move {
            tracing::debug!(owner = %owner.node_id, blocks = keys.len(), "withdrawing gone blocks");
            self.withdraw_at(&owner, keys).await;
        });
        let (results, _) = futures::future::join(
            futures::future::join_all(sends),
            futures::future::join_all(withdraw_sends),
        )
        .await;
        let now = Instant::now();
        for (owner, keys, epoch) in results {
            match epoch {
                Some(e) => st.saw_owner(&owner, e, now),
                None => st.failed(&owner, keys.into_iter()),
            }
        }
    }

    /// Announce `entries` to `owner` (an empty list only asks); the
    /// owner's directory epoch when it answered, None when it did not.
    async fn announce_to(
        &self,
        owner: &NodeInfo,
        entries: Vec<(BlockKey, HolderEntry)>,
    ) -> Option<u64> {
        if owner.node_id == self.me.node_id {
            self.shard_announce(entries);
            return Some(self.directory_epoch());
        }
        let req = AnnounceRequest {
            node_id: self.me.node_id.clone(),
            entries: entries
                .iter()
                .map(|(k, e)| DirectoryEntry {
                    key: k.as_bytes().to_vec(),
                    holder: Some(holder_pb(e)),
                })
                .collect(),
        };
        let mut c = self.directory_client(owner).ok()?;
        match tokio::time::timeout(self.cfg.rpc_timeout(), c.announce(req)).await {
            Ok(Ok(resp)) => Some(
                resp.metadata()
                    .get(EPOCH_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
            ),
            Ok(Err(s)) => {
                tracing::debug!(owner = %owner.node_id, status = %s, "announce failed; retried later");
                None
            }
            Err(_) => None,
        }
    }

    async fn withdraw_at(&self, owner: &NodeInfo, keys: Vec<BlockKey>) {
        if owner.node_id == self.me.node_id {
            self.shard_withdraw(&self.me.node_id.clone(), &keys);
            return;
        }
        let req = WithdrawRequest {
            node_id: self.me.node_id.clone(),
            keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
        };
        if let Ok(mut c) = self.directory_client(owner) {
            let _ = tokio::time::timeout(self.cfg.rpc_timeout(), c.withdraw(req)).await;
        }
    }

    /// This node's directory epoch: changes when it starts and whenever its
    /// shard drops entries it was not told to (a node left, keys moved), so
    /// holders that see it change re-announce what it owns.
    pub(crate) fn directory_epoch(&self) -> u64 {
        self.announcer.epoch.load(Ordering::Relaxed)
    }

    /// A new view: drop entries of nodes that left and keys no longer owned.
    pub(super) fn apply_view(&self, old: &MembershipView, new: &MembershipView) {
        let mut shard = self.shard.lock();
        let mut dropped = 0;
        for id in old.nodes.keys().filter(|id| !new.contains(id)) {
            let n = shard.drop_node(id);
            dropped += n;
            tracing::info!(node = %id, entries = n, "node left: its directory entries dropped");
        }
        let me = self.me.node_id.as_str();
        dropped += shard.retain_owned(|k| new.owner(k).is_some_and(|o| o.node_id == me));
        if dropped > 0 {
            self.announcer.epoch.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// After a view change: keys whose owner may have changed are
    /// re-announced by a paced refresh — of the nodes that joined (they
    /// took keys from others), of everyone when a node left (its keys went
    /// to the others).
    async fn after_view_change(&self, old: &MembershipView, new: &MembershipView) {
        let left = old.nodes.keys().any(|id| !new.contains(id));
        let joined: BTreeSet<String> = new
            .nodes
            .keys()
            .filter(|id| !old.contains(id))
            .cloned()
            .collect();
        let owners: Owners = if left { None } else { Some(joined) };
        if owners.as_ref().is_some_and(BTreeSet::is_empty) {
            return;
        }
        self.announcer.state.lock().await.request_refresh(owners);
    }
}

/// What woke the announcer.
enum Wake {
    View,
    MembershipGone,
    Period,
    Pace,
    Changes,
}

/// Membership changes, store changes (announced as they come, in batches
/// of whatever queued meanwhile), the paced refresh, and the periodic part
/// (retries, owner epochs, lease expiry), until the node drops.
pub(super) async fn background(
    node: Weak<ClusterNode>,
    mut views: watch::Receiver<Arc<MembershipView>>,
) {
    let (period, pace) = match node.upgrade() {
        Some(n) => {
            let p = Duration::from_millis(n.cfg.reconcile_interval_ms);
            let per = n.cfg.refresh_chunks_per_period.max(1) as u32;
            (p, (p / per).max(Duration::from_millis(1)))
        }
        None => return,
    };
    let mut last = views.borrow().clone();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pacer = tokio::time::interval(pace);
    pacer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut membership = true;
    loop {
        let Some(n) = node.upgrade() else { return };
        let wake = tokio::select! {
            r = views.changed(), if membership => match r {
                Ok(()) => Wake::View,
                Err(_) => Wake::MembershipGone,
            },
            _ = tick.tick() => Wake::Period,
            _ = pacer.tick() => Wake::Pace,
            _ = n.announcer.changes.ready() => Wake::Changes,
            _ = n.announcer.kick.notified() => Wake::Changes,
        };
        match wake {
            // The node left: keep its last view and go on serving reads.
            Wake::MembershipGone => membership = false,
            Wake::View => {
                let new = views.borrow_and_update().clone();
                n.apply_view(&last, &new);
                n.after_view_change(&last, &new).await;
                last = new;
                n.refresh_step().await;
            }
            Wake::Period => n.period(period).await,
            Wake::Pace => n.refresh_step().await,
            Wake::Changes => n.sync().await,
        }
    }
}
