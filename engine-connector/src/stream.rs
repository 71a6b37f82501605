//! How the embedded backend loads blocks from the cluster: lease them all
//! (one lease RPC per holder), then read them straight into the engine's
//! KV pool through the node's transfer engine.
//!
//! * Streamed (every leased block carries the per-layer trailer, see
//!   [`crate::trailer`]): the first batch reads every block's trailer and
//!   layer 0, later batches one layer of every block each, a few layers in
//!   flight. Each layer is verified against its checksum before it is
//!   published to the engine ([`LoadProgress`]), so the forward pass of
//!   layer `i` can run while layer `i + 1` is on the wire.
//! * Whole (blocks saved without a trailer, or streaming switched off):
//!   every block in one batch, each verified against the store's
//!   whole-block checksum.
//!
//! Either way the load counts the leading blocks verified in full; the
//! first failure (miss, transfer error, checksum) ends the count there,
//! and a corrupt block is reported to its owner so the directory forgets
//! that holder.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use kvfabric_node::cluster::{ClusterNode, LeasedBlock, RangeRead, ReadTarget};
use kvfabric_transfer::{SegmentId, SharedRegion};
use kvfabric_types::BlockKey;

use crate::connector::{checksum_ok, payload_fits, LoadBlock, LoadOptions};
use crate::trailer::{layer_ok, parse, trailer_len};
use crate::{KvMemory, LoadProgress};

/// Layer batches in flight while streaming.
const LAYERS_IN_FLIGHT: usize = 3;

/// Registered memory for what is stored after the KV bytes (trailers),
/// one slot per block; unregistered when dropped.
struct Scratch<'a> {
    node: &'a ClusterNode,
    region: Arc<SharedRegion>,
    segment: SegmentId,
    slot: u64,
}

impl<'a> Scratch<'a> {
    fn new(node: &'a ClusterNode, blocks: usize, slot: u64) -> Option<Scratch<'a>> {
        let bytes = (blocks as u64 * slot.max(1)) as usize;
        let region = match SharedRegion::create("kvfabric-load-trailers", bytes) {
            Ok(r) => Arc::new(r),
            Err(e) => {
                tracing::warn!(error = %e, "no memory for a load's trailers; recomputing");
                return None;
            }
        };
        let segment = node.transfer().register(region.clone());
        Some(Scratch {
            node,
            region,
            segment,
            slot,
        })
    }

    fn target(&self, j: usize) -> ReadTarget<'_> {
        ReadTarget {
            region: &self.region,
            segment: self.segment,
            offset: j as u64 * self.slot,
            capacity: self.slot,
        }
    }

    fn bytes(&self, j: usize, len: u64) -> &[u8] {
        // SAFETY: the reads into this slot have completed.
        unsafe { self.region.slice(j * self.slot as usize, len as usize) }.unwrap_or(&[])
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        let _ = self.node.transfer().unregister(self.segment);
    }
}

/// Load `blocks` into `mem` (registered as `segment`); see the module docs.
pub(crate) async fn load_blocks(
    node: &ClusterNode,
    mem: &KvMemory,
    segment: SegmentId,
    blocks: &[LoadBlock],
    progress: &LoadProgress,
    opts: LoadOptions,
) -> usize {
    let started = std::time::Instant::now();
    let keys: Vec<BlockKey> = blocks.iter().map(|b| b.key).collect();
    let hints: Vec<_> = blocks.iter().map(|b| b.hint.clone()).collect();
    let mut leased = Vec::new();
    for l in node.lease_many(&keys, &hints).await {
        match l {
            Some(l) if payload_fits(mem, l.layout(), l.len(), l.holder()) => leased.push(l),
            _ => break,
        }
    }
    if leased.is_empty() {
        return 0;
    }
    let kv = mem.block_bytes() as u64;
    let tl = trailer_len(&mem.layout) as u64;
    let Some(scratch) = Scratch::new(node, leased.len(), tl) else {
        return 0;
    };
    let pool = Pool {
        mem,
        segment,
        blocks,
    };
    let leased_at = started.elapsed();
    let (mode, loaded) = if opts.layerwise && leased.iter().all(|l| l.len() == kv + tl) {
        progress.start_streaming(leased.len());
        (
            "streamed",
            streamed(node, &pool, &leased, &scratch, progress).await,
        )
    } else {
        ("whole", whole(node, &pool, &leased, &scratch).await)
    };
    tracing::debug!(
        mode,
        blocks = blocks.len(),
        leased = leased.len(),
        loaded,
        lease_ms = leased_at.as_secs_f64() * 1e3,
        total_ms = started.elapsed().as_secs_f64() * 1e3,
        "fabric load"
    );
    loaded
}

/// The engine blocks a load writes.
struct Pool<'a> {
    mem: &'a KvMemory,
    segment: SegmentId,
    blocks: &'a [LoadBlock],
}

impl Pool<'_> {
    /// Bytes `range_start..+len` of the `j`th block's KV bytes, as a read target.
    fn target(&self, j: usize, start: u64, len: u64) -> ReadTarget<'_> {
        ReadTarget {
            region: &self.mem.region,
            segment: self.segment,
            offset: self.mem.block_offset(self.blocks[j].block) + start,
            capacity: len,
        }
    }

    fn bytes(&self, j: usize, start: u64, len: u64) -> &[u8] {
        let at = self.mem.block_offset(self.blocks[j].block) + start;
        // SAFETY: the reads into this range have completed; the engine does
        // not write a block that is loading.
        unsafe { self.mem.region.slice(at as usize, len as usize) }.unwrap_or(&[])
    }
}

/// Every block whole, in one batch, against the store's checksum.
async fn whole(
    node: &ClusterNode,
    pool: &Pool<'_>,
    leased: &[LeasedBlock],
    scratch: &Scratch<'_>,
) -> usize {
    let kv = pool.mem.block_bytes() as u64;
    let mut reads = Vec::new();
    let mut owner = Vec::new();
    for (j, l) in leased.iter().enumerate() {
        reads.push(RangeRead {
            block: l,
            offset: 0,
            len: kv,
            target: pool.target(j, 0, kv),
        });
        owner.push(j);
        if l.len() > kv {
            reads.push(RangeRead {
                block: l,
                offset: kv,
                len: l.len() - kv,
                target: scratch.target(j),
            });
            owner.push(j);
        }
    }
    let results = node.read_leased(&reads).await;
    let mut arrived = vec![true; leased.len()];
    for (j, r) in owner.into_iter().zip(&results) {
        if let Err(e) = r {
            tracing::debug!(error = %e, "fabric block read failed; recomputing");
            arrived[j] = false;
        }
    }
    for (j, l) in leased.iter().enumerate() {
        if !arrived[j] {
            return j;
        }
        let rest = scratch.bytes(j, l.len() - kv);
        if !checksum_ok(pool.bytes(j, 0, kv), rest, l.checksum(), l.holder()) {
            node.report_corrupt(l).await;
            return j;
        }
    }
    leased.len()
}

/// Trailers and layer 0 first, then one layer of every block per batch.
async fn streamed(
    node: &ClusterNode,
    pool: &Pool<'_>,
    leased: &[LeasedBlock],
    scratch: &Scratch<'_>,
    progress: &LoadProgress,
) -> usize {
    let layout = &pool.mem.layout;
    let kv = pool.mem.block_bytes() as u64;
    let tl = trailer_len(layout) as u64;
    let lb = layout.layer_bytes() as u64;
    let n = leased.len();
    // Leading blocks still verified in every layer so far.
    let ok = AtomicUsize::new(n);
    let cut = |j: usize| {
        ok.fetch_min(j, Ordering::SeqCst);
        progress.fail();
    };

    let mut first = Vec::with_capacity(2 * n);
    for (j, l) in leased.iter().enumerate() {
        first.push(RangeRead {
            block: l,
            offset: kv,
            len: tl,
            target: scratch.target(j),
        });
        first.push(RangeRead {
            block: l,
            offset: 0,
            len: lb,
            target: pool.target(j, 0, lb),
        });
    }
    let results = node.read_leased(&first).await;
    let mut sums = Vec::with_capacity(n);
    for (j, l) in leased.iter().enumerate() {
        if results[2 * j].is_err() || results[2 * j + 1].is_err() {
            cut(j);
            break;
        }
        let s = parse(layout, l.key(), scratch.bytes(j, tl));
        match s {
            Some(s) if layer_ok(&s, 0, pool.bytes(j, 0, lb)) => sums.push(s),
            _ => {
                tracing::warn!(holder = %l.holder(), "fabric block failed a layer checksum; recomputing");
                node.report_corrupt(l).await;
                cut(j);
                break;
            }
        }
    }
    if ok.load(Ordering::SeqCst) == n {
        progress.layers_ready(1);
    }

    let layers = layout.layers as usize;
    let mut batches = futures::stream::iter(1..layers)
        .map(|layer| {
            let m = ok.load(Ordering::SeqCst);
            let start = layer as u64 * lb;
            let reads: Vec<RangeRead> = leased[..m]
                .iter()
                .enumerate()
                .map(|(j, l)| RangeRead {
                    block: l,
                    offset: start,
                    len: lb,
                    target: pool.target(j, start, lb),
                })
                .collect();
            async move { (layer, node.read_leased(&reads).await) }
        })
        .buffered(LAYERS_IN_FLIGHT);
    while let Some((layer, results)) = batches.next().await {
        let m = ok.load(Ordering::SeqCst).min(results.len());
        for j in 0..m {
            let start = layer as u64 * lb;
            let good = results[j].is_ok() && layer_ok(&sums[j], layer, pool.bytes(j, start, lb));
            if !good {
                if results[j].is_ok() {
                    tracing::warn!(holder = %leased[j].holder(), layer, "fabric block failed a layer checksum; recomputing");
                    node.report_corrupt(&leased[j]).await;
                }
                cut(j);
                break;
            }
        }
        if ok.load(Ordering::SeqCst) == n {
            progress.layers_ready(layer + 1);
        }
    }
    ok.load(Ordering::SeqCst)
}
