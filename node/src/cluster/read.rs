//! Cluster-wide reads of leased blocks ([`crate::cluster::lease`]):
//! [`ClusterNode::read_leased`] moves byte ranges of many leased blocks into
//! caller memory — all ranges at one holder in ONE transfer batch, holders in
//! parallel, blocks leased here copied — and the whole-block reads built on
//! it: the single-block `get` / `get_into` (with an optional holder hint),
//! which try the next holder when one fails. Batches of whole blocks are the
//! caller's `lease_many` + `read_leased` (the connector's load path). A failed,
//! timed-out or corrupt remote read is a miss for that holder, reported stale
//! to the key's owner.

use std::collections::HashMap;

use crate::cluster::directory::HolderEntry;
use crate::cluster::lease::{LeaseSource, LeasedBlock};
use crate::cluster::membership::{MembershipView, NodeInfo};
use crate::cluster::node_state::{tier_store, ClusterNode};
use crate::NodeError;
use kvfabric_proto::internal::v1::StaleRequest;
use kvfabric_store::keys::{BlockKey, KvLayout};
use kvfabric_store::Tier;
use kvfabric_store::{BadArgument, StoreError};
use kvfabric_transfer::{SegmentId, SharedRegion, TransferError, TransferOp};

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
#[derive(Clone, Copy)]
pub struct ReadTarget<'a> {
    pub region: &'a SharedRegion,
    pub segment: SegmentId,
    pub offset: u64,
    /// Bytes available at `offset`.
    pub capacity: u64,
}

impl ReadTarget<'_> {
    fn check(&self, len: u64) -> Result<(), NodeError> {
        let end = self.offset.checked_add(len);
        if len > self.capacity || end.is_none_or(|e| e > self.region.len() as u64) {
            return Err(NodeError::Store(StoreError::InvalidArgument(
                BadArgument::ReadTarget {
                    len,
                    capacity: self.capacity,
                    offset: self.offset,
                    region_len: self.region.len() as u64,
                },
            )));
        }
        Ok(())
    }

    fn bytes(&self, len: u64) -> Result<&[u8], NodeError> {
        self.check(len)?;
        // SAFETY: the caller owns the target range; the transfer into it has completed.
        unsafe { self.region.slice(self.offset as usize, len as usize) }.map_err(NodeError::from)
    }
}

/// One range `[offset, offset + len)` of a leased block, to land at `target`.
pub struct RangeRead<'a> {
    pub block: &'a LeasedBlock,
    pub offset: u64,
    pub len: u64,
    pub target: ReadTarget<'a>,
}

impl RangeRead<'_> {
    fn check(&self) -> Result<(), NodeError> {
        let end = self.offset.checked_add(self.len);
        if end.is_none_or(|e| e > self.block.len()) {
            return Err(NodeError::Store(StoreError::InvalidArgument(
                BadArgument::RangeOutsideLeased {
                    offset: self.offset,
                    len: self.len,
                    block_len: self.block.len(),
                    key: *self.block.key(),
                },
            )));
        }
        self.target.check(self.len)
    }

    /// Copy from a block leased in this node's tiers.
    fn copy_local(&self, lease: &kvfabric_store::ReadLease) -> Result<(), NodeError> {
        let (o, n) = (self.offset as usize, self.len as usize);
        let src = lease.bytes().get(o..o + n).ok_or_else(|| {
            NodeError::Store(StoreError::InvalidArgument(
                BadArgument::RangeOutsideStored {
                    offset: o as u64,
                    len: n as u64,
                },
            ))
        })?;
        // SAFETY: the caller owns the target range for the duration of the call.
        let dst = unsafe { self.target.region.slice_mut(self.target.offset as usize, n) }?;
        dst.copy_from_slice(src);
        Ok(())
    }
}

/// Blocks per verification wave of [`ClusterNode::read_verified`]: the next
/// wave's transfer runs while this one is hashed, its bytes still in cache.
/// One pass over a whole batch after its transfer read 12 MiB back from
/// memory and left the link idle meanwhile (`bench cluster`'s batched remote
/// get loses ~8% without the waves; docs/BENCHMARKS.md).
const VERIFY_WAVE: usize = 4;

/// Why a wave stopped early: the block whose read failed (with its error)
/// or whose bytes do not match its checksum (None).
type WaveFailure<'r, 'a> = (&'r RangeRead<'a>, Option<NodeError>);

/// Check a wave's results and each block's xxh3, in order: the blocks that
/// are sound, and the first that is not.
fn verify_wave<'r, 'a>(
    wave: &'r [RangeRead<'a>],
    results: Vec<Result<(), NodeError>>,
) -> (usize, Option<WaveFailure<'r, 'a>>) {
    let mut ok = 0;
    for (r, res) in wave.iter().zip(results) {
        if let Err(e) = res {
            return (ok, Some((r, Some(e))));
        }
        let sound = r
            .target
            .bytes(r.len)
            .is_ok_and(|b| kvfabric_transfer::checksum::checksum(b) == r.block.checksum());
        if !sound {
            return (ok, Some((r, None)));
        }
        ok += 1;
    }
    (ok, None)
}

impl ClusterNode {
    /// Whole blocks of `keys` into `targets`, as an engine loads them:
    /// [`ClusterNode::lease_many`], then [`ClusterNode::read_leased`] in
    /// waves of [`VERIFY_WAVE`] blocks, each block's xxh3 checked in place
    /// while the next wave is in flight. How many leading blocks were read
    /// and verified: it stops at the first miss, failed read or corrupt
    /// block (a corrupt block is reported with
    /// [`ClusterNode::report_corrupt`], a failed remote read as stale).
    pub async fn read_verified(
        &self,
        keys: &[BlockKey],
        hints: &[Option<HolderEntry>],
        targets: &[ReadTarget<'_>],
    ) -> usize {
        let n = keys.len().min(targets.len());
        let leased = self
            .lease_many(&keys[..n], &hints[..hints.len().min(n)])
            .await;
        let reads: Vec<RangeRead<'_>> = leased
            .iter()
            .map_while(|b| b.as_ref())
            .zip(targets)
            .map(|(b, t)| RangeRead {
                block: b,
                offset: 0,
                len: b.len(),
                target: *t,
            })
            .collect();
        let waves: Vec<&[RangeRead<'_>]> = reads.chunks(VERIFY_WAVE).collect();
        let Some(first) = waves.first() else {
            return 0;
        };
        let mut results = self.read_leased(first).await;
        let mut verified = 0;
        for (w, wave) in waves.iter().enumerate() {
            let following = async {
                match waves.get(w + 1) {
                    Some(next) => self.read_leased(next).await,
                    None => Vec::new(),
                }
            };
            let check = async { verify_wave(wave, std::mem::take(&mut results)) };
            let (next_results, (ok, failure)) = futures::future::join(following, check).await;
            verified += ok;
            if let Some(failure) = failure {
                self.wave_failed(failure).await;
                return verified;
            }
            results = next_results;
        }
        verified
    }

    /// Report the block a wave stopped at: corrupt bytes to their holder's
    /// owner as corrupt, a failed remote read as stale (a refused range is
    /// the caller's mistake, not the holder's).
    async fn wave_failed(&self, (r, error): WaveFailure<'_, '_>) {
        match error {
            None => self.report_corrupt(r.block).await,
            Some(e) if e.is_invalid_argument() => {}
            Some(e) => {
                tracing::info!(holder = %r.block.holder(), error = %e, "batched read failed; miss");
                if matches!(r.block.source, LeaseSource::Remote(_)) {
                    let view = self.view();
                    let stale = vec![(r.block.holder().into(), *r.block.key())];
                    self.report_stale_many(&view, stale).await;
                }
            }
        }
    }

    /// Read byte ranges of leased blocks into their targets: all ops to one
    /// holder in ONE transfer batch, holders in parallel; blocks leased here
    /// are copied. Each op is bounds-checked against its block and target
    /// first (a refused op moves nothing). No checksum check here (the caller
    /// verifies). One result per op, in order; a holder that does not finish
    /// within `remote_read_timeout_ms` fails its ops.
    pub async fn read_leased(&self, reads: &[RangeRead<'_>]) -> Vec<Result<(), NodeError>> {
        let mut out: Vec<Result<(), NodeError>> = (0..reads.len()).map(|_| Ok(())).collect();
        let mut local = Vec::new();
        let mut groups: HashMap<&str, (&str, Vec<usize>, Vec<TransferOp>)> = HashMap::new();
        for (i, r) in reads.iter().enumerate() {
            if let Err(e) = r.check() {
                out[i] = Err(e);
                continue;
            }
            if r.len == 0 {
                continue;
            }
            match &r.block.source {
                LeaseSource::Local(_) => local.push(i),
                LeaseSource::Remote(l) => {
                    let g = groups
                        .entry(l.transfer_addr.as_str())
                        .or_insert_with(|| (r.block.holder(), Vec::new(), Vec::new()));
                    g.1.push(i);
                    // The block's element width lets tcp carry it encoded
                    // with the block codec where the link is slow enough
                    // (transfer `wire_compression`).
                    let width = r.block.layout().dtype.size() as u8;
                    let op = TransferOp::read(
                        r.target.segment,
                        r.target.offset,
                        l.segment,
                        l.offset + r.offset,
                        r.len,
                    )
                    .with_element_width(width);
                    g.2.push(match l.capability {
                        Some(cap) => op.with_capability(cap),
                        None => op,
                    });
                }
            }
        }
        let batches = groups
            .into_iter()
            .map(|(addr, (holder, idx, ops))| async move {
                (idx, self.transfer_batch(addr, holder, ops).await)
            });
        // Remote batches are polled first (requests go out), then the local copies run.
        let copies = async {
            local
                .iter()
                .map(|&i| match &reads[i].block.source {
                    LeaseSource::Local(l) => (i, reads[i].copy_local(l)),
                    LeaseSource::Remote(_) => (i, Ok(())),
                })
                .collect::<Vec<_>>()
        };
        let (remote, copied) =
            futures::future::join(futures::future::join_all(batches), copies).await;
        for (idx, results) in remote {
            for (i, r) in idx.into_iter().zip(results) {
                out[i] = r;
            }
        }
        for (i, r) in copied {
            out[i] = r;
        }
        out
    }

    /// One transfer batch to a holder, bounded by the remote read timeout.
    /// Ops that fail on a broken pooled connection (the holder restarted) are
    /// retried once on a fresh one.
    async fn transfer_batch(
        &self,
        addr: &str,
        holder: &str,
        ops: Vec<TransferOp>,
    ) -> Vec<Result<(), NodeError>> {
        let n = ops.len();
        self.transfer.expect_node(addr, holder);
        let run = async {
            let mut res = self.transfer.batch(addr, ops.clone()).await;
            let again: Vec<usize> = (0..res.len())
                .filter(|&i| matches!(res[i], Err(TransferError::Connection { .. })))
                .collect();
            if !again.is_empty() {
                let retry = self
                    .transfer
                    .batch(addr, again.iter().map(|&i| ops[i]).collect())
                    .await;
                for (i, r) in again.into_iter().zip(retry) {
                    res[i] = r;
                }
            }
            res
        };
        let holder = holder.to_string();
        match tokio::time::timeout(self.cfg.remote_read_timeout(), run).await {
            Ok(res) if res.len() == n => res
                .into_iter()
                .map(|r| {
                    r.map_err(|source| NodeError::RemoteRead {
                        holder: holder.clone(),
                        source,
                    })
                })
                .collect(),
            Ok(_) => (0..n)
                .map(|_| {
                    Err(NodeError::Internal {
                        what: "transfer answered the wrong number of ops",
                    })
                })
                .collect(),
            Err(_) => {
                let ms = self.cfg.remote_read_timeout_ms;
                (0..n)
                    .map(|_| {
                        Err(NodeError::RemoteReadTimeout {
                            holder: holder.clone(),
                            ms,
                        })
                    })
                    .collect()
            }
        }
    }

    /// The caller found a leased block's bytes corrupt: its holder is
    /// reported stale to the key's owner (a copy in this node's tiers is
    /// dropped, so it is never served again).
    pub async fn report_corrupt(&self, block: &LeasedBlock) {
        tracing::warn!(holder = %block.holder(), key = ?block.key(), "corrupt block read; holder reported stale");
        if !block.is_local() {
            self.integrity.holder_mismatches.inc();
        }
        if block.is_local() {
            let store = self.store.clone();
            let key = *block.key();
            let removed = tokio::task::spawn_blocking(move || store.remove(&[key])).await;
            if !matches!(removed, Ok(Ok(_))) {
                tracing::warn!(key = ?key, "dropping a corrupt local block failed");
            }
        }
        let view = self.view();
        self.report_stale_many(&view, vec![(block.holder().to_string(), *block.key())])
            .await;
    }

    /// Read a whole block: from this node's tiers, else from the best remote
    /// holder through the transfer engine (checksum verified). A failed or
    /// timed-out remote read is a miss for that holder and is reported stale
    /// to the key's owner; the next holder is tried. None = no holder served it.
    pub async fn get(&self, key: &BlockKey) -> Result<Option<FetchedBlock>, NodeError> {
        Ok(self.read_one(key, None, None).await?.map(|(b, _)| b))
    }

    /// Read a whole block into `target` (a region registered with this
    /// node's [`Self::transfer`] engine): remote blocks land there directly
    /// (no staging copy) and are checksum-verified in place. A `hint` (e.g.
    /// the holder a lookup just returned) is tried right after this node's
    /// tiers, which saves the Locate round trip; any other holder is still
    /// tried if the hinted one fails. Returns the block's facts (`data`
    /// empty) and its length; None = no holder served it.
    pub async fn get_into(
        &self,
        key: &BlockKey,
        hint: Option<&HolderEntry>,
        target: &ReadTarget<'_>,
    ) -> Result<Option<(FetchedBlock, u64)>, NodeError> {
        self.read_one(key, hint, Some(target)).await
    }

    /// One block, trying holders until one serves it; `target` None = a
    /// local block is copied out of its lease, a remote one lands in staging.
    async fn read_one(
        &self,
        key: &BlockKey,
        hint: Option<&HolderEntry>,
        target: Option<&ReadTarget<'_>>,
    ) -> Result<Option<(FetchedBlock, u64)>, NodeError> {
        let hints = [hint.cloned()];
        let mut skip: Vec<String> = Vec::new();
        loop {
            let leased = self
                .lease_skipping(std::slice::from_ref(key), &hints, &skip)
                .await;
            let Some(Some(block)) = leased.into_iter().next() else {
                return Ok(None);
            };
            let facts = |data: Vec<u8>| FetchedBlock {
                layout: *block.layout(),
                checksum: block.checksum(),
                node_id: block.holder().to_string(),
                tier: tier_store(block.tier()),
                data,
            };
            if let (None, LeaseSource::Local(l)) = (target, &block.source) {
                return Ok(Some((facts(l.bytes().to_vec()), block.len())));
            }
            let slot = match target {
                Some(_) => None,
                None => Some(self.staging.alloc(block.len())?),
            };
            let dest = match (target, &slot) {
                (Some(t), _) => *t,
                (None, Some(s)) => ReadTarget {
                    region: self.staging.region(),
                    segment: self.staging.segment(),
                    offset: s.offset(),
                    capacity: block.len(),
                },
                (None, None) => {
                    return Err(NodeError::Internal {
                        what: "no read destination",
                    })
                }
            };
            let read = RangeRead {
                block: &block,
                offset: 0,
                len: block.len(),
                target: dest,
            };
            let result = self.read_leased(std::slice::from_ref(&read)).await;
            match result.into_iter().next() {
                Some(Ok(())) => {
                    let bytes = dest.bytes(block.len())?;
                    // Blocks in this node's tiers are trusted (disk copies are
                    // verified when promoted); remote bytes crossed the network.
                    if block.is_local()
                        || kvfabric_transfer::checksum::checksum(bytes) == block.checksum()
                    {
                        let data = if target.is_some() {
                            Vec::new()
                        } else {
                            bytes.to_vec()
                        };
                        return Ok(Some((facts(data), block.len())));
                    }
                    self.report_corrupt(&block).await;
                }
                // The caller's target cannot hold the block: its error, not the holder's.
                Some(Err(e)) if e.is_invalid_argument() => return Err(e),
                Some(Err(e)) => {
                    tracing::info!(holder = %block.holder(), error = %e, "remote read failed; miss");
                    let view = self.view();
                    self.report_stale_many(&view, vec![(block.holder().into(), *key)])
                        .await;
                }
                None => {
                    return Err(NodeError::Internal {
                        what: "read returned no result",
                    })
                }
            }
            skip.push(block.holder().to_string());
        }
    }

    /// Report `(holder, key)` pairs stale to each key's owner: one
    /// ReportStale per owner and holder, in parallel; this node's own shard
    /// drops them directly.
    pub(super) async fn report_stale_many(
        &self,
        view: &MembershipView,
        stale: Vec<(String, BlockKey)>,
    ) {
        let mut by_owner: HashMap<(String, String), (NodeInfo, Vec<BlockKey>)> = HashMap::new();
        for (holder, key) in stale {
            if let Some(owner) = view.owner(&key) {
                by_owner
                    .entry((owner.node_id.clone(), holder))
                    .or_insert_with(|| (owner.clone(), Vec::new()))
                    .1
                    .push(key);
            }
        }
        let me = self.me.node_id.as_str();
        let sends = by_owner
            .into_iter()
            .map(|((owner, holder), (at, keys))| async move {
                if owner == me {
                    self.shard_withdraw(&holder, &keys);
                    return;
                }
                let req = StaleRequest {
                    node_id: holder,
                    keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
                };
                if let Ok(mut c) = self.directory_client(&at) {
                    let _ = tokio::time::timeout(self.cfg.rpc_timeout(), c.report_stale(req)).await;
                }
            });
        futures::future::join_all(sends).await;
    }
}
