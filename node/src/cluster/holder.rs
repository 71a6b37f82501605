//! The holder side of read leases: the leases this node keeps for remote
//! readers ([`HolderLeases`]), each a store lease pinning the block in the
//! RAM arena (promoted from disk first) under an id the reader releases by,
//! and ended by that release or by the reaper at its deadline; and what it
//! served (`kvfabric_holder_*`). `rpc.rs`'s HolderService asks it through
//! the node; it knows nothing of the node itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvfabric_store::keys::BlockKey;
use kvfabric_store::{BlockInfo, ReadLease, Store, Tier};
use kvfabric_transfer::{SegmentId, TransferEngine};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// Longest a holder keeps a block leased for a reader.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(60);

/// A lease a holder keeps for a remote reader until Release or expiry.
struct HeldLease {
    _lease: ReadLease,
    deadline: Instant,
}

/// A block leased for a remote reader: (lease id, RAM segment, offset, info).
pub(crate) type PeerLease = (u64, SegmentId, u64, BlockInfo);

/// The leases this node keeps for remote readers, by id, and what it served.
pub(crate) struct HolderLeases {
    held: Mutex<HashMap<u64, HeldLease>>,
    next: AtomicU64,
    /// Lease RPCs this node served as a holder (Lease and LeaseMany).
    requests: Counter,
    /// Blocks this node leased to remote readers.
    blocks: Counter,
}

impl HolderLeases {
    /// No leases yet; the counters registered in `registry`.
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let (requests, blocks) = (Counter::default(), Counter::default());
        registry.register(
            "kvfabric_holder_lease_requests",
            "Lease RPCs served to remote readers (one per reader batch)",
            requests.clone(),
        );
        registry.register(
            "kvfabric_holder_leased_blocks",
            "Blocks leased to remote readers",
            blocks.clone(),
        );
        HolderLeases {
            held: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            requests,
            blocks,
        }
    }

    /// (lease RPCs served, blocks leased) so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.requests.get(), self.blocks.get())
    }

    /// Leases held for remote readers right now.
    pub(crate) fn len(&self) -> usize {
        self.held.lock().len()
    }

    /// Store leases of `keys` held in `store` (None where not stored): RAM
    /// blocks lease under the store lock alone, disk blocks are promoted in
    /// one blocking task. A block that fails to lease is a miss (logged).
    pub(crate) async fn lease_local(store: &Store, keys: &[BlockKey]) -> Vec<Option<ReadLease>> {
        let mut out: Vec<Option<ReadLease>> = (0..keys.len()).map(|_| None).collect();
        let mut on_disk = Vec::new();
        for (i, info) in store.block_infos(keys).into_iter().enumerate() {
            match info {
                Some(info) if info.tier == Tier::Ram => match store.lease(&keys[i]) {
                    Ok(l) => out[i] = l,
                    Err(e) => tracing::warn!(key = ?keys[i], error = %e, "local lease failed"),
                },
                Some(_) => on_disk.push(i),
                None => {}
            }
        }
        if on_disk.is_empty() {
            return out;
        }
        let store = store.clone();
        let ks: Vec<BlockKey> = on_disk.iter().map(|&i| keys[i]).collect();
        let promoted = tokio::task::spawn_blocking(move || {
            ks.iter().map(|k| store.lease(k)).collect::<Vec<_>>()
        })
        .await;
        match promoted {
            Ok(leases) => {
                for (i, l) in on_disk.into_iter().zip(leases) {
                    match l {
                        Ok(l) => out[i] = l,
                        Err(e) => tracing::warn!(key = ?keys[i], error = %e, "local lease failed"),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "disk lease task failed"),
        }
        out
    }

    /// Keep `leases` (one lease RPC's) for a remote reader until released
    /// or `ttl` (at most [`MAX_LEASE`]) passes; each kept one gets an id.
    pub(crate) fn keep(
        &self,
        leases: Vec<Option<ReadLease>>,
        ram_segment: SegmentId,
        ttl: Duration,
    ) -> Vec<Option<PeerLease>> {
        self.requests.inc();
        self.blocks
            .inc_by(leases.iter().filter(|l| l.is_some()).count() as u64);
        let deadline = Instant::now() + ttl.min(MAX_LEASE);
        let mut held = self.held.lock();
        leases
            .into_iter()
            .map(|lease| {
                let lease = lease?;
                let id = self.next.fetch_add(1, Ordering::Relaxed);
                let (offset, info) = (lease.region_offset(), *lease.info());
                held.insert(
                    id,
                    HeldLease {
                        _lease: lease,
                        deadline,
                    },
                );
                Some((id, ram_segment, offset, info))
            })
            .collect()
    }

    /// End the leases `ids` (a reader's Release) and revoke their transfer
    /// capabilities.
    pub(crate) fn release(&self, transfer: &TransferEngine, ids: &[u64]) {
        let released: Vec<HeldLease> = {
            let mut held = self.held.lock();
            ids.iter().filter_map(|id| held.remove(id)).collect()
        };
        for id in ids {
            transfer.revoke_capability(*id);
        }
        // Store leases end outside the lease-table lock.
        drop(released);
    }

    /// End the leases past their deadline (readers that never released).
    pub(crate) fn reap(&self, transfer: &TransferEngine) {
        let now = Instant::now();
        self.held.lock().retain(|id, l| {
            let live = l.deadline > now;
            if !live {
                transfer.revoke_capability(*id);
            }
            live
        });
    }
}
