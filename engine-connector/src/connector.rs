//! [`Connector`]: the one implementation of [`KvConnector`], over a
//! [`Backend`] that reaches the fabric (an embedded node, or a node in
//! another process over gRPC).
//!
//! Lookup asks (as a task, the scheduler polls the answer) how long a
//! prefix the cluster holds and keeps the holders as hints for the load
//! that follows. A load reads each block straight into its engine block
//! and verifies it before counting it: layer by layer against the block's
//! per-layer checksums where the backend can stream (see
//! [`crate::LoadProgress`]), else whole blocks against the store's
//! checksum, several in flight. A block that fails, times out or
//! mismatches ends the load there and the engine recomputes it and
//! everything after.
//!
//! Saves are write-behind: the scheduler queues a block without waiting, a
//! worker task batches the queue, asks the cluster which keys exist
//! already, stores only the missing blocks (checksummed on the way, visible
//! cluster-wide before they are reported) and hands the blocks back. A full
//! queue drops the save (counted) instead of stalling decode.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::StreamExt;
use kvfabric_node::cluster::HolderEntry;
use kvfabric_types::{BlockKey, KvLayout};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use crate::metrics::ConnectorMetrics;
use crate::{
    BlockId, ConnectFn, ConnectorConfig, ConnectorError, ConnectorStats, KvConnector, KvMemory,
    LoadProgress, Pending, PendingLoad, PendingLookup, SaveBlock, SaveDone,
};

/// Most blocks one save batch checks and stores together.
const SAVE_BATCH: usize = 32;

/// Lookup hints kept for loads; beyond this the map starts over.
const MAX_HINTS: usize = 16_384;

/// How a connector reaches the fabric. Futures are `'static` so they run as
/// tasks on the connector's runtime.
pub trait Backend: Send + Sync + 'static {
    /// The best holder of each leading key the cluster holds (a gap ends it).
    fn lookup(self: Arc<Self>, keys: Vec<BlockKey>) -> BoxFuture<'static, Vec<HolderEntry>>;
    /// Load `blocks` (consecutive prefix blocks, in order) into the engine's
    /// KV memory; returns how many leading blocks arrived verified. A
    /// backend that can, streams them layer by layer through `progress`.
    fn load(
        self: Arc<Self>,
        blocks: Vec<LoadBlock>,
        progress: Arc<LoadProgress>,
        opts: LoadOptions,
    ) -> BoxFuture<'static, usize>;
    /// Copy the leading `keys` held on other nodes into this connector's
    /// node (checksum verified), counted to `owner`; how many were copied.
    fn prefetch(
        self: Arc<Self>,
        keys: Vec<BlockKey>,
        owner: Option<Arc<str>>,
    ) -> BoxFuture<'static, usize>;
    /// Presence of each key anywhere in the cluster.
    fn exists(self: Arc<Self>, keys: Vec<BlockKey>) -> BoxFuture<'static, Vec<bool>>;
    /// Store each block (Ok(false): it was there already); the stored ones
    /// are visible cluster-wide when the future ends.
    fn store(
        self: Arc<Self>,
        blocks: Vec<SaveBlock>,
    ) -> BoxFuture<'static, Vec<Result<bool, ConnectorError>>>;
    /// The node blocks are saved to.
    fn holder(&self) -> String;
}

/// One block of a load: its key, the engine block it goes to, and the
/// holder a lookup found for it.
#[derive(Clone, Debug)]
pub struct LoadBlock {
    pub key: BlockKey,
    pub block: BlockId,
    pub hint: Option<HolderEntry>,
}

/// How a load runs.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Whole-block reads in flight.
    pub concurrency: usize,
    /// Stream layer by layer where the blocks allow it.
    pub layerwise: bool,
}

/// Whether a stored payload of `len` bytes with `layout` is a block of the
/// engine's: its KV bytes alone, or followed by the per-layer trailer.
pub(crate) fn payload_fits(mem: &KvMemory, layout: &KvLayout, len: u64, from: &str) -> bool {
    let kv = mem.block_bytes() as u64;
    let ok = *layout == mem.layout
        && (len == kv || len == kv + crate::trailer::trailer_len(layout) as u64);
    if !ok {
        tracing::warn!(holder = %from, "fabric block has another layout or size; recomputing");
    }
    ok
}

/// Whether `kv ‖ rest` (a block's KV bytes and whatever was stored after
/// them) has the store's whole-block `checksum`.
pub(crate) fn checksum_ok(kv: &[u8], rest: &[u8], checksum: u64, from: &str) -> bool {
    let mut h = kvfabric_transfer::checksum::Checksummer::new();
    h.update(kv);
    h.update(rest);
    let ok = h.digest() == checksum;
    if !ok {
        tracing::warn!(holder = %from, "fabric block failed its checksum; recomputing");
    }
    ok
}

/// Load whole blocks with `read` (true = arrived verified), `concurrency`
/// in flight, stopping at the first failure.
pub(crate) async fn load_each<F, Fut>(blocks: Vec<LoadBlock>, concurrency: usize, read: F) -> usize
where
    F: FnMut(LoadBlock) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    // The stream is dropped when this returns: no read writes into the blocks after it.
    futures::stream::iter(blocks)
        .map(read)
        .buffered(concurrency.max(1))
        .take_while(|ok| std::future::ready(*ok))
        .count()
        .await
}

/// Refuse KV memory that does not hold its blocks.
fn check_memory(mem: &KvMemory) -> Result<(), ConnectorError> {
    mem.layout.validate()?;
    if mem.region.len() < mem.blocks * mem.block_bytes() {
        return Err(ConnectorError::Config(
            crate::ConfigProblem::KvMemoryTooSmall {
                bytes: mem.region.len(),
                blocks: mem.blocks,
            },
        ));
    }
    Ok(())
}

/// The connector over backend `B`.
pub struct Connector<B: Backend> {
    backend: Arc<B>,
    rt: Handle,
    cfg: ConnectorConfig,
    metrics: ConnectorMetrics,
    save_tx: mpsc::Sender<SaveBlock>,
    done_rx: crossbeam::channel::Receiver<SaveDone>,
    /// Saves queued or in progress.
    pending: Arc<AtomicUsize>,
    /// Holders recent lookups returned, for the loads that follow.
    hints: Arc<Mutex<HashMap<BlockKey, HolderEntry>>>,
}

impl<B: Backend> std::fmt::Debug for Connector<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("holder", &self.backend.holder())
            .finish()
    }
}

impl<B: Backend> Connector<B> {
    /// The engine's [`ConnectFn`] for a backend `make` builds over the KV
    /// memory. Call it inside the tokio runtime the connector's tasks
    /// should run on.
    pub(crate) fn connect_fn_with<F>(cfg: ConnectorConfig, make: F) -> ConnectFn
    where
        F: FnOnce(KvMemory, &Handle) -> Result<Arc<B>, ConnectorError> + Send + 'static,
    {
        let rt = Handle::try_current();
        Box::new(move |mem, registry| {
            let rt = rt.map_err(|_| ConnectorError::Config(crate::ConfigProblem::NoRuntime))?;
            check_memory(&mem)?;
            let backend = make(mem, &rt)?;
            let c: Arc<dyn KvConnector> = Connector::start(backend, rt, cfg, registry)?;
            Ok(c)
        })
    }

    /// Start the save worker on `rt` and register the metrics.
    fn start(
        backend: Arc<B>,
        rt: Handle,
        cfg: ConnectorConfig,
        registry: &mut prometheus_client::registry::Registry,
    ) -> Result<Arc<Self>, ConnectorError> {
        cfg.validate()?;
        let metrics = ConnectorMetrics::new();
        metrics.register(registry);
        let (save_tx, save_rx) = mpsc::channel(cfg.max_pending_saves);
        let (done_tx, done_rx) = crossbeam::channel::unbounded();
        let pending = Arc::new(AtomicUsize::new(0));
        rt.spawn(save_worker(SaveWorker {
            backend: backend.clone(),
            queue: save_rx,
            done: done_tx,
            pending: pending.clone(),
            metrics: metrics.clone(),
        }));
        Ok(Arc::new(Connector {
            backend,
            rt,
            cfg,
            metrics,
            save_tx,
            done_rx,
            pending,
            hints: Arc::new(Mutex::new(HashMap::new())),
        }))
    }
}

impl<B: Backend> KvConnector for Connector<B> {
    fn start_lookup(&self, keys: Vec<BlockKey>) -> PendingLookup {
        let (tx, rx) = crossbeam::channel::bounded(1);
        if !self.cfg.load || keys.is_empty() {
            let _ = tx.send(0);
            return Pending::new(rx, 0);
        }
        self.metrics.lookups.inc();
        let n = keys.len();
        let ask = self.backend.clone().lookup(keys.clone());
        let timeout = self.cfg.lookup_timeout();
        let metrics = self.metrics.clone();
        let hints = self.hints.clone();
        self.rt.spawn(async move {
            let holders = tokio::time::timeout(timeout, ask)
                .await
                .unwrap_or_else(|_| {
                    tracing::debug!("fabric lookup timed out: counted as a miss");
                    Vec::new()
                });
            let found = holders.len();
            metrics.lookup_hit_blocks.inc_by(found as u64);
            {
                let mut h = hints.lock().unwrap_or_else(|p| p.into_inner());
                if h.len() > MAX_HINTS {
                    h.clear();
                }
                h.extend(keys.into_iter().zip(holders));
            }
            let _ = tx.send(found);
        });
        Pending::new(rx, n)
    }

    fn prefetch(&self, keys: &[BlockKey], owner: Option<Arc<str>>) {
        if !self.cfg.load || keys.is_empty() {
            return;
        }
        let work = self.backend.clone().prefetch(keys.to_vec(), owner);
        let metrics = self.metrics.clone();
        self.rt.spawn(async move {
            metrics.prefetched_blocks.inc_by(work.await as u64);
        });
    }

    fn start_load(&self, blocks: Vec<(BlockKey, BlockId)>) -> PendingLoad {
        let (tx, rx) = crossbeam::channel::bounded(1);
        let n = blocks.len();
        let blocks: Vec<LoadBlock> = {
            let hints = self.hints.lock().unwrap_or_else(|p| p.into_inner());
            blocks
                .into_iter()
                .map(|(key, block)| LoadBlock {
                    key,
                    block,
                    hint: hints.get(&key).cloned(),
                })
                .collect()
        };
        let progress = Arc::new(LoadProgress::default());
        let opts = LoadOptions {
            concurrency: self.cfg.load_concurrency,
            layerwise: self.cfg.layerwise,
        };
        let work = self.backend.clone().load(blocks, progress.clone(), opts);
        let metrics = self.metrics.clone();
        let streamed = progress.clone();
        self.rt.spawn(async move {
            let started = Instant::now();
            // When this ends, no read writes into the blocks any more.
            let loaded = work.await;
            if streamed.started_streaming() {
                metrics.streamed_loads.inc();
            }
            metrics.loaded_blocks.inc_by(loaded as u64);
            metrics.load_failed_blocks.inc_by((n - loaded) as u64);
            metrics.load_done(started.elapsed());
            let _ = tx.send(loaded);
        });
        Pending::streamed(rx, n, progress, self.cfg.layer_wait())
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
        self.backend.holder()
    }

    fn stats(&self) -> ConnectorStats {
        self.metrics.snapshot()
    }
}

struct SaveWorker<B: Backend> {
    backend: Arc<B>,
    queue: mpsc::Receiver<SaveBlock>,
    done: crossbeam::channel::Sender<SaveDone>,
    pending: Arc<AtomicUsize>,
    metrics: ConnectorMetrics,
}

/// Drain the save queue in batches until the connector is dropped.
async fn save_worker<B: Backend>(mut w: SaveWorker<B>) {
    while let Some(first) = w.queue.recv().await {
        let mut batch = vec![first];
        while batch.len() < SAVE_BATCH {
            match w.queue.try_recv() {
                Ok(b) => batch.push(b),
                Err(_) => break,
            }
        }
        let keys: Vec<BlockKey> = batch.iter().map(|b| b.key).collect();
        let present = w.backend.clone().exists(keys).await;
        let (skip, todo): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .zip(present)
            .partition(|(_, present)| *present);
        let todo: Vec<SaveBlock> = todo.into_iter().map(|(b, _)| b).collect();
        let stored = w.backend.clone().store(todo.clone()).await;
        let mut finished = Vec::new();
        for (b, _) in skip {
            w.metrics.save_skipped_blocks.inc();
            finished.push((b, true));
        }
        for (b, r) in todo.into_iter().zip(stored) {
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
