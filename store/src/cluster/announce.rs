//! Announcements: keeping the owners' directory entries in step with what
//! this node's store holds (holder side), and trimming this node's shard when
//! membership changes (owner side). Soft state throughout: a failed announce
//! is retried by the next reconcile, a lost withdraw is healed by a stale
//! report or a Locate that finds the block gone.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use kvfabric_proto::internal::v1::{AnnounceRequest, DirectoryEntry, WithdrawRequest};
use tokio::sync::{mpsc, watch};

use crate::cluster::directory::HolderEntry;
use crate::cluster::membership::{MembershipView, NodeInfo};
use crate::cluster::node::{holder_pb, tier_of, ClusterNode};
use crate::keys::BlockKey;

/// Full re-announce every this many reconcile periods.
const FULL_REFRESH_EVERY: u32 = 30;

impl ClusterNode {
    // ---- announcements (holder side) ----

    /// Bring the owners' entries in line with what this node holds: announce
    /// new blocks, blocks whose tier changed and blocks whose owner changed
    /// (all of them with `full`), withdraw blocks that are gone.
    pub async fn sync(&self, full: bool) {
        let mut announced = self.announced.lock().await;
        let view = self.view();
        let holdings = self.store.holdings();
        let mut adds: HashMap<String, (NodeInfo, Vec<(BlockKey, HolderEntry)>)> = HashMap::new();
        let mut next: HashMap<BlockKey, (String, HolderEntry)> =
            HashMap::with_capacity(holdings.len());
        for info in &holdings {
            let Some(owner) = view.owner(&info.key) else {
                continue;
            };
            let entry = HolderEntry {
                node_id: self.me.node_id.clone(),
                tier: tier_of(info.tier),
                size: info.len,
                checksum: info.checksum,
            };
            let same = announced
                .get(&info.key)
                .is_some_and(|(o, e)| *o == owner.node_id && *e == entry);
            if full || !same {
                adds.entry(owner.node_id.clone())
                    .or_insert_with(|| (owner.clone(), Vec::new()))
                    .1
                    .push((info.key, entry.clone()));
            }
            next.insert(info.key, (owner.node_id.clone(), entry));
        }
        let mut withdraws: HashMap<String, Vec<BlockKey>> = HashMap::new();
        for (k, (owner, _)) in announced.iter() {
            if !next.contains_key(k) {
                withdraws.entry(owner.clone()).or_default().push(*k);
            }
        }
        let sends = adds.into_values().map(|(owner, entries)| async move {
            let keys: Vec<BlockKey> = entries.iter().map(|(k, _)| *k).collect();
            let ok = self.announce_to(&owner, entries).await;
            (keys, ok)
        });
        let view = &view;
        let withdraw_sends = withdraws.into_iter().map(|(owner, keys)| async move {
            if let Some(o) = view.nodes.get(&owner) {
                self.withdraw_at(o, keys).await;
            }
        });
        let (results, _) = futures::future::join(
            futures::future::join_all(sends),
            futures::future::join_all(withdraw_sends),
        )
        .await;
        for (keys, ok) in results {
            if !ok {
                for k in keys {
                    next.remove(&k);
                }
            }
        }
        *announced = next;
    }

    /// Register `keys` just stored here with their owners (one Announce per
    /// owner, in parallel) without scanning the holdings as [`Self::sync`]
    /// does: the save path's call. Keys not stored here, or already
    /// announced as they are, are skipped; a failed announce is retried by
    /// the next sync.
    pub async fn announce_keys(&self, keys: &[BlockKey]) {
        let mut announced = self.announced.lock().await;
        let view = self.view();
        let mut adds: HashMap<String, (NodeInfo, Vec<(BlockKey, HolderEntry)>)> = HashMap::new();
        for info in self.store.block_infos(keys).into_iter().flatten() {
            let Some(owner) = view.owner(&info.key) else {
                continue;
            };
            let entry = HolderEntry {
                node_id: self.me.node_id.clone(),
                tier: tier_of(info.tier),
                size: info.len,
                checksum: info.checksum,
            };
            let same = announced
                .get(&info.key)
                .is_some_and(|(o, e)| *o == owner.node_id && *e == entry);
            if !same {
                adds.entry(owner.node_id.clone())
                    .or_insert_with(|| (owner.clone(), Vec::new()))
                    .1
                    .push((info.key, entry));
            }
        }
        let sends = adds.into_values().map(|(owner, entries)| async move {
            let ok = self.announce_to(&owner, entries.clone()).await;
            (owner.node_id, entries, ok)
        });
        for (owner, entries, ok) in futures::future::join_all(sends).await {
            if ok {
                for (k, e) in entries {
                    announced.insert(k, (owner.clone(), e));
                }
            }
        }
    }

    /// Withdraw blocks that left the store (evictions, removals) from their
    /// owners now, one Withdraw per owner: no scan of the holdings. Keys
    /// stored again since are left to the next sync.
    pub(super) async fn withdraw_removed(&self, keys: Vec<BlockKey>) {
        let mut announced = self.announced.lock().await;
        let view = self.view();
        let mut by_owner: HashMap<String, Vec<BlockKey>> = HashMap::new();
        for (k, info) in keys.iter().zip(self.store.block_infos(&keys)) {
            if info.is_some() {
                continue;
            }
            if let Some((owner, _)) = announced.remove(k) {
                by_owner.entry(owner).or_default().push(*k);
            }
        }
        let view = &view;
        let sends = by_owner.into_iter().map(|(owner, keys)| async move {
            tracing::debug!(%owner, blocks = keys.len(), "withdrawing removed blocks");
            if let Some(o) = view.nodes.get(&owner) {
                self.withdraw_at(o, keys).await;
            }
        });
        futures::future::join_all(sends).await;
        // Held until the owners have heard: a sync cannot re-announce under us.
        drop(announced);
    }

    async fn announce_to(&self, owner: &NodeInfo, entries: Vec<(BlockKey, HolderEntry)>) -> bool {
        if owner.node_id == self.me.node_id {
            self.shard_announce(entries);
            return true;
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
        let Ok(mut c) = self.directory_client(&owner.grpc_addr) else {
            return false;
        };
        match tokio::time::timeout(self.cfg.rpc_timeout(), c.announce(req)).await {
            Ok(Ok(_)) => true,
            Ok(Err(s)) => {
                tracing::debug!(owner = %owner.node_id, status = %s, "announce failed; retried later");
                false
            }
            Err(_) => false,
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
        if let Ok(mut c) = self.directory_client(&owner.grpc_addr) {
            let _ = tokio::time::timeout(self.cfg.rpc_timeout(), c.withdraw(req)).await;
        }
    }

    /// A new view: drop entries of nodes that left and keys no longer owned.
    pub(super) fn apply_view(&self, old: &MembershipView, new: &MembershipView) {
        let mut shard = self.shard.lock();
        for id in old.nodes.keys().filter(|id| !new.contains(id)) {
            let n = shard.drop_node(id);
            tracing::info!(node = %id, entries = n, "node left: its directory entries dropped");
        }
        let me = self.me.node_id.as_str();
        shard.retain_owned(|k| new.owner(k).is_some_and(|o| o.node_id == me));
    }
}

/// Membership changes, periodic reconcile, kicks, removed blocks (withdrawn
/// as they go, in batches of whatever queued meanwhile) and lease expiry,
/// until the node drops.
pub(super) async fn background(
    node: Weak<ClusterNode>,
    mut views: watch::Receiver<Arc<MembershipView>>,
    mut removed: mpsc::UnboundedReceiver<BlockKey>,
) {
    let period = match node.upgrade() {
        Some(n) => Duration::from_millis(n.cfg.reconcile_interval_ms),
        None => return,
    };
    let mut last = views.borrow().clone();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks = 0u32;
    // First round: announce whatever the store recovered (e.g. its disk tier).
    let mut pending_full = true;
    loop {
        let Some(n) = node.upgrade() else { return };
        if pending_full {
            n.sync(true).await;
            pending_full = false;
        }
        let changed = tokio::select! {
            r = views.changed() => {
                if r.is_err() {
                    // Membership stopped (the node left): keep serving reads.
                    drop(n);
                    tokio::time::sleep(period).await;
                    continue;
                }
                true
            }
            _ = tick.tick() => false,
            _ = n.kick.notified() => false,
            Some(k) = removed.recv() => {
                let mut keys = vec![k];
                while let Ok(k) = removed.try_recv() {
                    keys.push(k);
                }
                n.withdraw_removed(keys).await;
                continue;
            }
        };
        if changed {
            let new = views.borrow_and_update().clone();
            n.apply_view(&last, &new);
            last = new;
            n.sync(false).await;
        } else {
            ticks += 1;
            n.reap_leases();
            n.sync(ticks % FULL_REFRESH_EVERY == 0).await;
        }
    }
}
