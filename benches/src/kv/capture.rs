//! Real KV blocks for `bench kv`: the engine prefills agentic-trace prompts
//! and hands every full block it computed to [`CaptureConnector`], a
//! [`KvConnector`] that copies the block's bytes out of the engine's KV pool
//! when the engine saves it (the same hand-over the fabric connector gets)
//! and reports the save as stored at once. Lookups and loads find nothing,
//! so every block is computed by the engine's own forward pass.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::anyhow;
use kvfabric_connector::{
    BlockId, ConnectFn, ConnectorStats, KvConnector, KvMemory, Pending, PendingLoad, PendingLookup,
    SaveBlock, SaveDone,
};
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::{EngineConfig, KvDtype};
use kvfabric_store::keys::{BlockKey, KvLayout};

use crate::agentic::driver::generate;
use crate::agentic::engines::{engine_config, start_engine, stop_engine};
use crate::agentic::trace::Workload;

/// The blocks one engine computed, in the order it saved them (distinct keys).
#[derive(Debug, Default)]
pub struct Captured {
    pub layout: Option<KvLayout>,
    pub blocks: Vec<Vec<u8>>,
}

#[derive(Debug)]
struct CaptureConnector {
    memory: KvMemory,
    /// Most blocks kept; later saves are acknowledged and not copied.
    most: usize,
    seen: Mutex<HashSet<BlockKey>>,
    captured: Arc<Mutex<Captured>>,
    done: Mutex<Vec<SaveDone>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A lookup or load that has already ended with `n` blocks.
fn answered(n: usize, most: usize) -> Pending {
    let (tx, rx) = crossbeam::channel::bounded(1);
    let _ = tx.send(n);
    Pending::new(rx, most)
}

impl KvConnector for CaptureConnector {
    fn start_lookup(&self, keys: Vec<BlockKey>) -> PendingLookup {
        answered(0, keys.len())
    }

    fn prefetch(&self, _keys: &[BlockKey], _owner: Option<std::sync::Arc<str>>) {}

    fn start_load(&self, blocks: Vec<(BlockKey, BlockId)>) -> PendingLoad {
        answered(0, blocks.len())
    }

    fn save(&self, block: SaveBlock) -> bool {
        let fresh = lock(&self.seen).insert(block.key);
        let mut captured = lock(&self.captured);
        if fresh && captured.blocks.len() < self.most {
            let len = self.memory.block_bytes();
            let offset = self.memory.block_offset(block.block) as usize;
            // SAFETY: the engine pins a block it hands to `save` and leaves it
            // unchanged until `finished_saves` returns it.
            if let Ok(bytes) = unsafe { self.memory.region.slice(offset, len) } {
                captured.blocks.push(bytes.to_vec());
            }
        }
        drop(captured);
        lock(&self.done).push(SaveDone {
            key: block.key,
            block: block.block,
            tag: block.tag,
            stored: true,
        });
        true
    }

    fn finished_saves(&self, _wait: Duration) -> Vec<SaveDone> {
        std::mem::take(&mut *lock(&self.done))
    }

    fn flush(&self, _timeout: Duration) -> bool {
        true
    }

    fn holder(&self) -> String {
        "bench-kv-capture".into()
    }

    fn stats(&self) -> ConnectorStats {
        ConnectorStats::default()
    }
}

/// Prefill turn 0 of each session of `workload` (one generated token each)
/// on one engine whose KV pool holds `dtype`, and return up to `most`
/// distinct blocks it computed (in that dtype, as the pool stores them).
pub async fn capture_blocks(
    model: &Arc<LlamaModel>,
    workload: &Workload,
    dtype: KvDtype,
    threads: usize,
    kv_pool_mib: u64,
    most: usize,
) -> anyhow::Result<Captured> {
    let captured = Arc::new(Mutex::new(Captured::default()));
    let sink = captured.clone();
    let connect: ConnectFn = Box::new(move |memory: KvMemory, _registry| {
        lock(&sink).layout = Some(memory.layout);
        let c: Arc<dyn KvConnector> = Arc::new(CaptureConnector {
            memory,
            most,
            seen: Mutex::new(HashSet::new()),
            captured: sink,
            done: Mutex::new(Vec::new()),
        });
        Ok(c)
    });
    let cfg = EngineConfig {
        kv_dtype: dtype,
        ..engine_config(threads, kv_pool_mib, true)
    };
    let engine = start_engine(model, &cfg, Some(connect))?;
    let mut result = Ok(());
    for session in 0..workload.users.len() {
        if lock(&captured).blocks.len() >= most {
            break;
        }
        let prompt = workload.prompt(session, &[]);
        if let Err(e) = generate(&engine.handle, prompt, 1, false).await {
            result = Err(e);
            break;
        }
    }
    stop_engine(engine).await?;
    result?;
    let mut out = lock(&captured);
    let taken = std::mem::take(&mut *out);
    anyhow::ensure!(
        !taken.blocks.is_empty(),
        "the engine saved no full block (prompts shorter than a block?)"
    );
    taken
        .layout
        .ok_or_else(|| anyhow!("the engine never attached the connector"))?;
    Ok(taken)
}
