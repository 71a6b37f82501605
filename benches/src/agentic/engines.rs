//! Engines of one bench configuration, started in this process on the
//! shared model (optionally each attached to the fabric through a
//! connector), and stopped (every handle dropped, scheduler threads joined)
//! before the next configuration starts, so configurations never share a KV
//! pool or compete for cores.

use std::sync::Arc;

use anyhow::{anyhow, Context};
use kvfabric_connector::{ConnectFn, ConnectorStats, KvConnector};
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::{EngineBuilder, EngineConfig, EngineHandle, RunningEngine};

/// Settings shared by every engine of a bench.
pub fn engine_config(threads: usize, kv_pool_mib: u64, prefix_cache: bool) -> EngineConfig {
    EngineConfig {
        threads,
        kv_pool: bytesize::ByteSize::mib(kv_pool_mib),
        prefix_cache,
        ..EngineConfig::default()
    }
}

/// Start one engine, attached to the fabric when `connect` is given.
pub fn start_engine(
    model: &Arc<LlamaModel>,
    cfg: &EngineConfig,
    connect: Option<ConnectFn>,
) -> anyhow::Result<RunningEngine> {
    let with_fabric = connect.is_some();
    let e = EngineBuilder::new(cfg.clone())
        .connector(connect)
        .start(model.clone())?;
    anyhow::ensure!(
        e.connector.is_some() == with_fabric,
        "the engine did not keep the connector it was given"
    );
    Ok(e)
}

/// Drop the engine's handle and join its scheduler thread (callers must
/// have dropped their handle clones).
pub async fn stop_engine(e: RunningEngine) -> anyhow::Result<()> {
    let RunningEngine { handle, thread, .. } = e;
    drop(handle);
    tokio::task::spawn_blocking(move || thread.join())
        .await
        .map_err(|e| anyhow!("joining an engine: {e}"))?
        .map_err(|_| anyhow!("an engine's scheduler thread panicked"))
}

/// The connector counters as JSON.
pub fn stats_json(s: &ConnectorStats) -> serde_json::Value {
    serde_json::json!({
        "lookups": s.lookups,
        "lookup_hit_blocks": s.lookup_hit_blocks,
        "loaded_blocks": s.loaded_blocks,
        "prefetched_blocks": s.prefetched_blocks,
        "load_failed_blocks": s.load_failed_blocks,
        "streamed_loads": s.streamed_loads,
        "saved_blocks": s.saved_blocks,
        "save_skipped_blocks": s.save_skipped_blocks,
        "save_dropped_blocks": s.save_dropped_blocks,
        "save_failed_blocks": s.save_failed_blocks,
        "pending_saves": s.pending_saves,
        "loads": s.loads,
        "load_ms": s.load_micros as f64 / 1e3,
    })
}

/// Running engines of one configuration.
pub struct EngineSet {
    engines: Vec<RunningEngine>,
}

impl EngineSet {
    /// Start one engine per entry of `connects`, engine i attached to the
    /// fabric through `connects[i]` (None = no fabric).
    pub fn start(
        model: &Arc<LlamaModel>,
        cfg: &EngineConfig,
        connects: Vec<Option<ConnectFn>>,
    ) -> anyhow::Result<EngineSet> {
        let mut engines = Vec::with_capacity(connects.len());
        for (i, connect) in connects.into_iter().enumerate() {
            engines.push(
                start_engine(model, cfg, connect)
                    .with_context(|| format!("starting engine {i}"))?,
            );
        }
        Ok(EngineSet { engines })
    }

    /// Handles to submit to, in engine order.
    pub fn handles(&self) -> Vec<EngineHandle> {
        self.engines.iter().map(|e| e.handle.clone()).collect()
    }

    /// The engines' connectors (empty without fabric).
    pub fn connectors(&self) -> Vec<Arc<dyn KvConnector>> {
        self.engines
            .iter()
            .filter_map(|e| e.connector.clone())
            .collect()
    }

    /// Stop every engine.
    pub async fn stop(self) -> anyhow::Result<()> {
        for e in self.engines {
            stop_engine(e).await?;
        }
        Ok(())
    }
}
