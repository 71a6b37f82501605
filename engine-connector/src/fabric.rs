//! [`FabricConnector`]: the connector over a cluster node in this process.
//!
//! Lookup asks the key owners (one Locate per owner, in parallel) how long a
//! prefix the cluster holds. A load reads each block with
//! `ClusterNode::get_into` straight into its engine block (this node's RAM
//! tier by memcpy, a peer's by a transfer READ into the registered KV pool),
//! several blocks in flight, and verifies the xxh3 of every block in place
//! before counting it: a block that fails, times out or mismatches ends the
//! load there and the engine recomputes it and everything after it.
//!
//! Saves are write-behind: the scheduler queues a block without waiting, a
//! worker task batches the queue, asks the cluster which keys exist
//! already, copies only the missing blocks from the KV pool into the node's
//! RAM tier (checksummed on the way), announces them to their owners and
//! hands the blocks back. A full queue drops the save (counted) instead of
//! stalling decode.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kvfabric_store::cluster::{ClusterNode, HolderEntry, ReadTarget};
use kvfabric_store::keys::BlockKey;
use kvfabric_store::{ReserveOutcome, Store};
use kvfabric_transfer::SegmentId;
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use crate::metrics::ConnectorMetrics;
use crate::{
    BlockId, ConnectFn, ConnectorConfig, ConnectorError, ConnectorStats, KvConnector, KvMemory,
    PendingLoad, SaveBlock, SaveDone,
};

/// Most blocks one save batch checks and stores together.
const SAVE_BATCH: usize = 32;

/// The connector over an embedded [`ClusterNode`].
pub struct FabricConnector {
    node: Arc<ClusterNode>,
    rt: Handle,
    mem: Arc<KvMemory>,
    segment: SegmentId,
    cfg: ConnectorConfig,
    metrics: ConnectorMetrics,
    save_tx: mpsc::Sender<SaveBlock>,
    done_rx: crossbeam::channel::Receiver<SaveDone>,
    /// Saves queued or in progress.
    pending: Arc<AtomicUsize>,
    /// Holders the last lookup returned: the load that follows reads from
    /// them without asking the owners again.
    hints: Mutex<HashMap<BlockKey, HolderEntry>>,
}

impl std::fmt::Debug for FabricConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricConnector")
            .field("node", &self.node.info().node_id)
            .field("segment", &self.segment)
            .finish()
    }
}

impl FabricConnector {
    /// The engine's [`ConnectFn`] for `node`. Call it inside the tokio
    /// runtime the node runs on: the connector's tasks run there.
    pub fn connect_fn(node: Arc<ClusterNode>, cfg: ConnectorConfig) -> ConnectFn {
        let rt = Handle::try_current();
        Box::new(move |mem, registry| {
            let rt = rt.map_err(|_| {
                ConnectorError::Config("the fabric connector needs a tokio runtime".into())
            })?;
            let c: Arc<dyn KvConnector> = FabricConnector::new(node, rt, mem, cfg, registry)?;
            Ok(c)
        })
    }

    /// Register the engine's KV memory with the node's transfer engine and
    /// start the save worker on `rt`.
    pub fn new(
        node: Arc<ClusterNode>,
        rt: Handle,
        mem: KvMemory,
        cfg: ConnectorConfig,
        registry: &mut prometheus_client::registry::Registry,
    ) -> Result<Arc<FabricConnector>, ConnectorError> {
        cfg.validate()?;
        mem.layout.validate()?;
        if mem.region.len() < mem.blocks * mem.block_bytes() {
            return Err(ConnectorError::Config(format!(
                "KV memory of {} bytes is smaller than {} blocks",
                mem.region.len(),
                mem.blocks
            )));
        }
        let segment = node.transfer().register(mem.region.clone());
        let metrics = ConnectorMetrics::new();
        metrics.register(registry);
        let mem = Arc::new(mem);
        let (save_tx, save_rx) = mpsc::channel(cfg.max_pending_saves);
        let (done_tx, done_rx) = crossbeam::channel::unbounded();
        let pending = Arc::new(AtomicUsize::new(0));
        rt.spawn(save_worker(SaveWorker {
            node: node.clone(),
            mem: mem.clone(),
            queue: save_rx,
            done: done_tx,
            pending: pending.clone(),
            metrics: metrics.clone(),
        }));
        Ok(Arc::new(FabricConnector {
            node,
            rt,
            mem,
            segment,
            cfg,
            metrics,
            save_tx,
            done_rx,
            pending,
            hints: Mutex::new(HashMap::new()),
        }))
    }
}

impl Drop for FabricConnector {
    fn drop(&mut self) {
        // The KV pool goes away with the engine: peers must not reach it any more.
        let _ = self.node.transfer().unregister(self.segment);
    }
}

impl KvConnector for FabricConnector {
    fn lookup(&self, keys: &[BlockKey]) -> usize {
        if !self.cfg.load || keys.is_empty() {
            return 0;
        }
        self.metrics.lookups.inc();
        let node = self.node.clone();
        let keys = keys.to_vec();
        let timeout = self.cfg.lookup_timeout();
        let asked = keys.clone();
        let holders = self.rt.block_on(async move {
            match tokio::time::timeout(timeout, node.lookup(&keys)).await {
                Ok(holders) => holders,
                Err(_) => {
                    tracing::debug!("fabric lookup timed out: counted as a miss");
                    Vec::new()
                }
            }
        });
        let found = holders.len();
        self.metrics.lookup_hit_blocks.inc_by(found as u64);
        let mut hints = self.hints.lock().unwrap_or_else(|p| p.into_inner());
        hints.clear();
        hints.extend(asked.into_iter().zip(holders));
        found
    }

    fn start_load(&self, blocks: Vec<(BlockKey, BlockId)>) -> PendingLoad {
        let (tx, rx) = crossbeam::channel::bounded(1);
        let n = blocks.len();
        let node = self.node.clone();
        let mem = self.mem.clone();
        let segment = self.segment;
        let metrics = self.metrics.clone();
        let concurrency = self.cfg.load_concurrency;
        let blocks: Vec<(BlockKey, BlockId, Option<HolderEntry>)> = {
            let hints = self.hints.lock().unwrap_or_else(|p| p.into_inner());
            blocks
                .into_iter()
                .map(|(k, b)| (k, b, hints.get(&k).cloned()))
                .collect()
        };
        self.rt.spawn(async move {
            let started = Instant::now();
            let loaded = futures::stream::iter(blocks)
                .map(|(key, block, hint)| load_block(&node, &mem, segment, key, block, hint))
                .buffered(concurrency)
                .take_while(|ok| std::future::ready(*ok))
                .count()
                .await;
            // The stream is dropped: no read writes into the blocks after this.
            metrics.loaded_blocks.inc_by(loaded as u64);
            metrics.load_failed_blocks.inc_by((n - loaded) as u64);
            metrics
                .load_seconds
                .observe(started.elapsed().as_secs_f64());
            let _ = tx.send(loaded);
        });
        PendingLoad::new(rx, n)
    }

    fn save(&self, block: SaveBlock) -> bool {
        if !self.cfg.save {
            return false;
        }
        self.pending.fetch_add(1, Ordering::SeqCst);
        match self.save_tx.try_send(block) {
            Ok(()) => {
                self.metrics.pending_saves.inc();
                true
            }
            Err(_) => {
                self.pending.fetch_sub(1, Ordering::SeqCst);
                self.metrics.save_dropped_blocks.inc();
                false
            }
        }
    }

    fn finished_saves(&self, wait: Duration) -> Vec<SaveDone> {
        let mut out: Vec<SaveDone> = self.done_rx.try_iter().collect();
        if out.is_empty() && !wait.is_zero() {
            if let Ok(d) = self.done_rx.recv_timeout(wait) {
                out.push(d);
                out.extend(self.done_rx.try_iter());
            }
        }
        out
    }

    fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.pending.load(Ordering::SeqCst) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    fn holder(&self) -> String {
        self.node.info().node_id.clone()
    }

    fn stats(&self) -> ConnectorStats {
        self.metrics.snapshot()
    }
}

/// Read one block into its engine block; true only if it arrived whole
/// with the layout and checksum its holder recorded.
async fn load_block(
    node: &ClusterNode,
    mem: &KvMemory,
    segment: SegmentId,
    key: BlockKey,
    block: BlockId,
    hint: Option<HolderEntry>,
) -> bool {
    let (offset, len) = (mem.block_offset(block), mem.block_bytes());
    let target = ReadTarget {
        region: &mem.region,
        segment,
        offset,
        capacity: len as u64,
    };
    let read = match &hint {
        Some(h) => node.get_into_hinted(&key, h, &target).await,
        None => node.get_into(&key, &target).await,
    };
    match read {
        Ok(Some((meta, got))) => {
            if meta.layout != mem.layout || got != len as u64 {
                tracing::warn!(holder = %meta.node_id, "fabric block has another layout or size; recomputing");
                return false;
            }
            // SAFETY: the engine keeps this block out of every forward pass
            // until the load ends; the read into it has completed.
            let Ok(bytes) = (unsafe { mem.region.slice(offset as usize, len) }) else {
                return false;
            };
            let ok = xxhash_rust::xxh3::xxh3_64(bytes) == meta.checksum;
            if !ok {
                tracing::warn!(holder = %meta.node_id, "fabric block failed its checksum; recomputing");
            }
            ok
        }
        Ok(None) => false,
        Err(e) => {
            tracing::debug!(error = %e, "fabric block read failed; recomputing");
            false
        }
    }
}

struct SaveWorker {
    node: Arc<ClusterNode>,
    mem: Arc<KvMemory>,
    queue: mpsc::Receiver<SaveBlock>,
    done: crossbeam::channel::Sender<SaveDone>,
    pending: Arc<AtomicUsize>,
    metrics: ConnectorMetrics,
}

/// Drain the save queue in batches until the connector is dropped.
async fn save_worker(mut w: SaveWorker) {
    while let Some(first) = w.queue.recv().await {
        let mut batch = vec![first];
        while batch.len() < SAVE_BATCH {
            match w.queue.try_recv() {
                Ok(b) => batch.push(b),
                Err(_) => break,
            }
        }
        let keys: Vec<BlockKey> = batch.iter().map(|b| b.key).collect();
        let present = w.node.exists(&keys).await;
        let (skip, todo): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .zip(present)
            .partition(|(_, present)| *present);
        let todo: Vec<SaveBlock> = todo.into_iter().map(|(b, _)| b).collect();
        let store = w.node.store().clone();
        let mem = w.mem.clone();
        let stored = tokio::task::spawn_blocking(move || {
            todo.into_iter()
                .map(|b| {
                    let r = store_block(&store, &mem, &b);
                    (b, r)
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        if stored.iter().any(|(_, r)| matches!(r, Ok(true))) {
            // Visible cluster-wide before the blocks are reported saved.
            w.node.sync(false).await;
        }
        let mut finished = Vec::new();
        for (b, _) in skip {
            w.metrics.save_skipped_blocks.inc();
            finished.push((b, true));
        }
        for (b, r) in stored {
            match r {
                Ok(true) => {
                    w.metrics.saved_blocks.inc();
                }
                Ok(false) => {
                    w.metrics.save_skipped_blocks.inc();
                }
                Err(ref e) => {
                    w.metrics.save_failed_blocks.inc();
                    tracing::warn!(error = %e, "saving a block into the fabric failed");
                }
            }
            finished.push((b, r.is_ok()));
        }
        for (b, stored) in finished {
            let _ = w.done.send(SaveDone {
                key: b.key,
                block: b.block,
                tag: b.tag,
                stored,
            });
            w.metrics.pending_saves.dec();
            w.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Copy one block from the KV pool into the node's RAM tier; Ok(false) when
/// the node already had it.
fn store_block(store: &Store, mem: &KvMemory, b: &SaveBlock) -> Result<bool, ConnectorError> {
    let len = mem.block_bytes();
    match store.reserve(b.key, mem.layout, len as u64, b.tokens, false)? {
        ReserveOutcome::Present(_) => Ok(false),
        ReserveOutcome::Reserved(mut r) => {
            // SAFETY: the engine does not change a block queued for saving
            // until the save is reported finished.
            let bytes = unsafe { mem.region.slice(mem.block_offset(b.block) as usize, len) }?;
            r.write(0, bytes)?;
            r.commit(None)?;
            Ok(true)
        }
    }
}
