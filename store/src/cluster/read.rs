//! Cluster-wide reads of whole blocks: this node's tiers first, else the
//! best remote holder — lease at the holder (HolderService, which promotes
//! from disk if needed), transfer READ of the leased range into staging or a
//! caller's registered memory, xxh3 verification, release. A failed or
//! timed-out read is a miss for that holder, reported stale to the key's
//! owner; the next holder is tried.

use kvfabric_proto::internal::v1::holder_service_client::HolderServiceClient;
use kvfabric_proto::internal::v1::{LeaseRequest, ReleaseRequest, StaleRequest};
use kvfabric_proto::v1::Tier;
use kvfabric_transfer::{SegmentId, SharedRegion, TransferOp};

use crate::cluster::directory::HolderEntry;
use crate::cluster::membership::{MembershipView, NodeInfo};
use crate::cluster::node::{tier_pb, ClusterNode};
use crate::keys::{BlockKey, KvLayout};
use crate::StoreError;

/// A block read by [`ClusterNode::get`], from this node or a peer.
#[derive(Clone, Debug)]
pub struct FetchedBlock {
    pub layout: KvLayout,
    pub checksum: u64,
    pub node_id: String,
    pub tier: Tier,
    pub data: Vec<u8>,
}

/// Caller memory a block is read into: a range of a region registered with
/// the node's transfer engine as `segment`.
pub struct ReadTarget<'a> {
    pub region: &'a SharedRegion,
    pub segment: SegmentId,
    pub offset: u64,
    /// Bytes available at `offset`.
    pub capacity: u64,
}

impl ReadTarget<'_> {
    fn check(&self, len: u64) -> Result<(), StoreError> {
        let end = self.offset.checked_add(len);
        if len > self.capacity || end.is_none_or(|e| e > self.region.len() as u64) {
            return Err(StoreError::InvalidArgument(format!(
                "a {len}-byte block does not fit the read target ({} bytes at {})",
                self.capacity, self.offset
            )));
        }
        Ok(())
    }

    fn bytes(&self, len: u64) -> Result<&[u8], StoreError> {
        self.check(len)?;
        // SAFETY: the caller owns the target range; the transfer into it has completed.
        unsafe { self.region.slice(self.offset as usize, len as usize) }.map_err(StoreError::from)
    }
}

impl ClusterNode {
    /// Read a whole block: from this node's tiers, else from the best remote
    /// holder through the transfer engine (checksum verified). A failed or
    /// timed-out remote read is a miss for that holder and is reported stale
    /// to the key's owner; the next holder is tried. None = no holder served it.
    pub async fn get(&self, key: &BlockKey) -> Result<Option<FetchedBlock>, StoreError> {
        if let Some(b) = self.get_local(*key).await? {
            return Ok(Some(b));
        }
        Ok(self.fetch_remote(key, None).await.map(|(b, _)| b))
    }

    /// Read a whole block into `target` (a region registered with this
    /// node's [`Self::transfer`] engine): remote blocks land there directly
    /// (no staging copy) and are checksum-verified in place. Returns the
    /// block's facts (`data` empty) and its length; None = no holder served it.
    pub async fn get_into(
        &self,
        key: &BlockKey,
        target: &ReadTarget<'_>,
    ) -> Result<Option<(FetchedBlock, u64)>, StoreError> {
        // Not held here (the common case for a remote read): no blocking hop.
        let held_here = self.store.block_infos(std::slice::from_ref(key))[0].is_some();
        let lease = if held_here {
            let store = self.store.clone();
            let k = *key;
            tokio::task::spawn_blocking(move || store.lease(&k))
                .await
                .map_err(|e| StoreError::Server(format!("local read task: {e}")))??
        } else {
            None
        };
        if let Some(l) = lease {
            let bytes = l.bytes();
            target.check(bytes.len() as u64)?;
            // SAFETY: the caller owns the target range for the duration of the call.
            let dst = unsafe { target.region.slice_mut(target.offset as usize, bytes.len()) }?;
            dst.copy_from_slice(bytes);
            let i = *l.info();
            let meta = FetchedBlock {
                layout: i.layout,
                checksum: i.checksum,
                node_id: self.me.node_id.clone(),
                tier: i.tier,
                data: Vec::new(),
            };
            return Ok(Some((meta, i.len)));
        }
        Ok(self.fetch_remote(key, Some(target)).await)
    }

    /// [`Self::get_into`] trying `hint` (e.g. the holder a lookup just
    /// returned) first, which saves the Locate round trip; any other
    /// holder is still tried if the hinted one fails.
    pub async fn get_into_hinted(
        &self,
        key: &BlockKey,
        hint: &HolderEntry,
        target: &ReadTarget<'_>,
    ) -> Result<Option<(FetchedBlock, u64)>, StoreError> {
        if hint.node_id != self.me.node_id {
            if let Some(b) = self.read_from(key, vec![hint.clone()], Some(target)).await {
                return Ok(Some(b));
            }
        }
        self.get_into(key, target).await
    }

    async fn fetch_remote(
        &self,
        key: &BlockKey,
        target: Option<&ReadTarget<'_>>,
    ) -> Option<(FetchedBlock, u64)> {
        let holders = self.locate(std::slice::from_ref(key)).await;
        self.read_from(key, holders.into_iter().flatten().collect(), target)
            .await
    }

    /// Read from the first of `holders` (other than this node) that serves the block.
    async fn read_from(
        &self,
        key: &BlockKey,
        holders: Vec<HolderEntry>,
        target: Option<&ReadTarget<'_>>,
    ) -> Option<(FetchedBlock, u64)> {
        let view = self.view();
        for h in holders {
            if h.node_id == self.me.node_id {
                continue;
            }
            let Some(peer) = view.nodes.get(&h.node_id).cloned() else {
                continue;
            };
            let read = tokio::time::timeout(
                self.cfg.remote_read_timeout(),
                self.read_remote(&peer, key, &h, target),
            );
            match read.await {
                Ok(Ok(b)) => return Some(b),
                Ok(Err(e)) => {
                    tracing::info!(holder = %peer.node_id, error = %e, "remote read failed; miss")
                }
                Err(_) => tracing::info!(holder = %peer.node_id, "remote read timed out; miss"),
            }
            self.report_stale(&view, &peer.node_id, key).await;
        }
        None
    }

    async fn get_local(&self, key: BlockKey) -> Result<Option<FetchedBlock>, StoreError> {
        let store = self.store.clone();
        let node_id = self.me.node_id.clone();
        tokio::task::spawn_blocking(move || {
            Ok(store.lease(&key)?.map(|l| {
                let i = *l.info();
                FetchedBlock {
                    layout: i.layout,
                    checksum: i.checksum,
                    node_id,
                    tier: i.tier,
                    data: l.bytes().to_vec(),
                }
            }))
        })
        .await
        .map_err(|e| StoreError::Server(format!("local read task: {e}")))?
    }

    async fn read_remote(
        &self,
        peer: &NodeInfo,
        key: &BlockKey,
        expect: &HolderEntry,
        target: Option<&ReadTarget<'_>>,
    ) -> Result<(FetchedBlock, u64), StoreError> {
        let fail = |m: String| StoreError::Server(format!("read from {}: {m}", peer.node_id));
        let mut holder = HolderServiceClient::new(self.channel(&peer.grpc_addr)?);
        let lease = holder
            .lease(LeaseRequest {
                key: key.as_bytes().to_vec(),
                ttl_ms: self.cfg.remote_read_timeout_ms,
            })
            .await
            .map_err(|s| fail(format!("lease: {s}")))?
            .into_inner();
        if lease.lease_id == 0 {
            return Err(fail("the holder no longer has the block".into()));
        }
        let release = {
            let mut holder = holder.clone();
            let id = lease.lease_id;
            async move {
                let _ = holder.release(ReleaseRequest { lease_id: id }).await;
            }
        };
        let result = async {
            if lease.size != expect.size {
                return Err(fail(format!(
                    "size {} != directory's {}",
                    lease.size, expect.size
                )));
            }
            let layout = lease
                .layout
                .as_ref()
                .ok_or_else(|| fail("lease without layout".into()))
                .and_then(|l| KvLayout::try_from(l).map_err(|e| fail(e.to_string())))?;
            let slot = match target {
                Some(t) => {
                    t.check(lease.size)?;
                    None
                }
                None => Some(self.staging.alloc(lease.size)?),
            };
            let (dst_segment, dst_offset) = match (target, &slot) {
                (Some(t), _) => (t.segment, t.offset),
                (None, Some(s)) => (self.staging.segment(), s.offset()),
                (None, None) => return Err(fail("no destination".into())),
            };
            let op = TransferOp::read(
                dst_segment,
                dst_offset,
                SegmentId(lease.segment_id),
                lease.offset,
                lease.size,
            );
            // A pooled connection to a holder that restarted fails once; the
            // engine reconnects on the next batch, so one retry is worth it.
            let mut outcome = Err(fail("transfer not run".into()));
            for _ in 0..2 {
                outcome = match self
                    .transfer
                    .batch(&peer.transfer_addr, vec![op])
                    .await
                    .pop()
                {
                    Some(Ok(())) => Ok(()),
                    Some(Err(e)) => Err(fail(format!("transfer: {e}"))),
                    None => Err(fail("transfer returned no result".into())),
                };
                if outcome.is_ok() {
                    break;
                }
            }
            outcome?;
            let bytes = match (target, &slot) {
                (Some(t), _) => t.bytes(lease.size)?,
                (None, Some(s)) => s.bytes()?,
                (None, None) => return Err(fail("no destination".into())),
            };
            let sum = xxhash_rust::xxh3::xxh3_64(bytes);
            if sum != lease.checksum {
                return Err(fail(format!("checksum {sum:#x} != {:#x}", lease.checksum)));
            }
            let data = if target.is_some() {
                Vec::new()
            } else {
                bytes.to_vec()
            };
            Ok((
                FetchedBlock {
                    layout,
                    checksum: sum,
                    node_id: peer.node_id.clone(),
                    tier: tier_pb(expect.tier),
                    data,
                },
                lease.size,
            ))
        }
        .await;
        tokio::spawn(release);
        result
    }

    async fn report_stale(&self, view: &MembershipView, holder: &str, key: &BlockKey) {
        let Some(owner) = view.owner(key).cloned() else {
            return;
        };
        if owner.node_id == self.me.node_id {
            self.shard_withdraw(holder, std::slice::from_ref(key));
            return;
        }
        let req = StaleRequest {
            node_id: holder.to_string(),
            keys: vec![key.as_bytes().to_vec()],
        };
        if let Ok(mut c) = self.directory_client(&owner.grpc_addr) {
            let _ = tokio::time::timeout(self.cfg.rpc_timeout(), c.report_stale(req)).await;
        }
    }
}
