//! [`Connector`]: the one implementation of [`KvConnector`], over a
//! [`Backend`] that reaches the fabric (an embedded node, or a node in
//! another process over gRPC).
//!
//! Lookup asks (as a task, the scheduler polls the answer) how long a
//! prefix the cluster holds and keeps the holders as hints for the load
//! that follows. A load reads each block straight into
//! its engine block, several in flight, and verifies every block's xxh3 in
//! place before counting it: a block that fails, times out or mismatches
//! ends the load there and the engine recomputes it and everything after.
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
use kvfabric_store::cluster::HolderEntry;
use kvfabric_store::keys::{BlockKey, KvLayout};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use crate::metrics::ConnectorMetrics;
use crate::{
    BlockId, ConnectFn, ConnectorConfig, ConnectorError, ConnectorStats, KvConnector, KvMemory,
    Pending, PendingLoad, PendingLookup, SaveBlock, SaveDone,
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
    /// Read `key` into engine block `block` (from `hint` first if given);
    /// true only if it arrived whole and verified.
    fn read(
        self: Arc<Self>,
        key: BlockKey,
        block: BlockId,
        hint: Option<HolderEntry>,
    ) -> BoxFuture<'static, bool>;
    /// Copy the leading `keys` held on other nodes into this connector's
    /// node (checksum verified); how many were copied.
    fn prefetch(self: Arc<Self>, keys: Vec<BlockKey>) -> BoxFuture<'static, usize>;
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

/// True when the bytes now in `block` have `layout`, `len` and `checksum`.
pub(crate) fn verify_block(
    mem: &KvMemory,
    block: BlockId,
    layout: &KvLayout,
    len: u64,
    checksum: u64,
    from: &str,
) -> bool {
    if *layout != mem.layout || len != mem.block_bytes() as u64 {
        tracing::warn!(holder = %from, "fabric block has another layout or size; recomputing");
        return false;
    }
    // SAFETY: the engine keeps a loading block out of every forward pass
    // until the load ends; the read into it has completed.
    let Ok(bytes) = (unsafe {
        mem.region
            .slice(mem.block_offset(block) as usize, mem.block_bytes())
    }) else {
        return false;
    };
    let ok = xxhash_rust::xxh3::xxh3_64(bytes) == checksum;
    if !ok {
        tracing::warn!(holder = %from, "fabric block failed its checksum; recomputing");
    }
    ok
}

/// Refuse KV memory that does not hold its blocks.
fn check_memory(mem: &KvMemory) -> Result<(), ConnectorError> {
    mem.layout.validate()?;
    if mem.region.len() < mem.blocks * mem.block_bytes() {
        return Err(ConnectorError::Config(format!(
            "KV memory of {} bytes is smaller than {} blocks",
            mem.region.len(),
            mem.blocks
        )));
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
            let rt = rt.map_err(|_| {
                ConnectorError::Config("the fabric connector needs a tokio runtime".into())
            })?;
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

    fn prefetch(&self, keys: &[BlockKey]) {
        if !self.cfg.load || keys.is_empty() {
            return;
        }
        let work = self.backend.clone().prefetch(keys.to_vec());
        let metrics = self.metrics.clone();
        self.rt.spawn(async move {
            metrics.prefetched_blocks.inc_by(work.await as u64);
        });
    }

    fn start_load(&self, blocks: Vec<(BlockKey, BlockId)>) -> PendingLoad {
        let (tx, rx) = crossbeam::channel::bounded(1);
        let n = blocks.len();
        let blocks: Vec<(BlockKey, BlockId, Option<HolderEntry>)> = {
            let hints = self.hints.lock().unwrap_or_else(|p| p.into_inner());
            blocks
                .into_iter()
                .map(|(k, b)| (k, b, hints.get(&k).cloned()))
                .collect()
        };
        let backend = self.backend.clone();
        let metrics = self.metrics.clone();
        let concurrency = self.cfg.load_concurrency;
        self.rt.spawn(async move {
            let started = Instant::now();
            let loaded = futures::stream::iter(blocks)
                .map(|(key, block, hint)| backend.clone().read(key, block, hint))
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
        Pending::new(rx, n)
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
