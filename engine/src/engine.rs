//! Wiring: load the model, start the scheduler thread, serve the OpenAI API.
//!
//! [`start`] is the in-process entry (tests, benches, the connector);
//! [`run`] is what `kvfabric engine` calls: it loads the model with a
//! progress bar, starts the scheduler and serves HTTP until `shutdown`.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use kvfabric_connector::{ConnectFn, KvConnector, KvMemory};
use prometheus_client::registry::Registry;

use crate::chat::ChatTemplate;
use crate::config::EngineConfig;
use crate::gguf::GgufFile;
use crate::http::{self, HttpState};
use crate::kernels::Compute;
use crate::kv::KvPool;
use crate::metrics::EngineMetrics;
use crate::model::LlamaModel;
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::tokenizer::Tokenizer;
use crate::{EngineError, EngineHandle};

/// A running scheduler: submit through `handle`; drop every handle clone, then `join`.
#[derive(Debug)]
pub struct RunningEngine {
    pub handle: EngineHandle,
    pub thread: std::thread::JoinHandle<()>,
    /// Bytes reserved for the KV pool.
    pub kv_pool_bytes: usize,
    /// The fabric connector, when the engine has one.
    pub connector: Option<Arc<dyn KvConnector>>,
}

/// Start a scheduler for `model` with `cfg`'s threads, pool and batching limits.
pub fn start(model: Arc<LlamaModel>, cfg: &EngineConfig) -> Result<RunningEngine, EngineError> {
    start_with_metrics(model, cfg, EngineMetrics::new())
}

/// [`start`], reporting the scheduler's metrics into `metrics`.
pub fn start_with_metrics(
    model: Arc<LlamaModel>,
    cfg: &EngineConfig,
    metrics: EngineMetrics,
) -> Result<RunningEngine, EngineError> {
    start_with_connector(model, cfg, metrics, &mut Registry::default(), None)
}

/// [`start_with_metrics`], with the fabric connector `connect` builds over
/// the engine's KV pool (its metrics go into `registry`).
pub fn start_with_connector(
    model: Arc<LlamaModel>,
    cfg: &EngineConfig,
    metrics: EngineMetrics,
    registry: &mut Registry,
    connect: Option<ConnectFn>,
) -> Result<RunningEngine, EngineError> {
    cfg.validate()?;
    let c = &model.config;
    let layout = KvPool::layout_for(c.layers, c.kv_heads, c.head_dim, cfg.block_tokens);
    let kv = KvPool::with_bytes(layout, cfg.kv_pool.as_u64())?;
    let kv_pool_bytes = kv.capacity_bytes();
    let connector = match connect {
        Some(connect) => {
            let memory = KvMemory {
                region: kv.region().clone(),
                layout,
                blocks: kv.blocks(),
            };
            Some(connect(memory, registry)?)
        }
        None => None,
    };
    let sched = Scheduler::new(
        model,
        Compute::new(cfg.threads),
        kv,
        SchedulerConfig {
            max_batch_tokens: cfg.max_batch_tokens,
            max_seqs: cfg.max_seqs,
            role: cfg.role,
            metrics,
            prefix_cache: cfg.prefix_cache,
        },
        connector.clone(),
    );
    let (handle, thread) = sched.spawn(256)?;
    Ok(RunningEngine {
        handle,
        thread,
        kv_pool_bytes,
        connector,
    })
}

/// Load the model at `model_path`, with a progress bar on stderr.
pub fn load_with_progress(model_path: &Path) -> Result<LlamaModel, EngineError> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("loading model {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(model_path.display().to_string());
    let model = LlamaModel::load(model_path, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    model
}

/// Serve `model_path` with `cfg` until `shutdown` resolves; with `connect`,
/// the engine reuses and saves KV through the fabric.
pub async fn run(
    cfg: EngineConfig,
    model_path: &Path,
    connect: Option<ConnectFn>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), EngineError> {
    cfg.validate()?;
    let path = model_path.to_path_buf();
    let model = tokio::task::spawn_blocking(move || load_with_progress(&path))
        .await
        .map_err(|e| EngineError::Model(format!("model loading task: {e}")))??;
    let model = Arc::new(model);
    let gguf = GgufFile::open(model_path)?;
    let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf)?);
    let template = Arc::new(ChatTemplate::from_gguf(&gguf, &tokenizer)?);
    drop(gguf);
    let context_length = model.config.context_length;
    tracing::info!(
        fingerprint = %hex(&model.fingerprint().0),
        weights_bytes = model.weight_bytes(),
        "model loaded"
    );
    let metrics = EngineMetrics::new();
    let mut registry = Registry::default();
    let engine = start_with_connector(model, &cfg, metrics.clone(), &mut registry, connect)?;
    metrics.register(&mut registry);
    let state = HttpState::new(
        engine.handle.clone(),
        tokenizer,
        template,
        cfg.model_name.clone(),
        context_length,
        metrics,
        Arc::new(registry),
    );
    let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
    let served = http::serve(listener, state, shutdown).await;
    let RunningEngine { handle, thread, .. } = engine;
    drop(handle);
    let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    served
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use bytesize::ByteSize;
    use kvfabric_connector::ConnectorError;

    use super::*;

    #[test]
    fn a_connector_that_fails_to_attach_is_a_connector_error() {
        let connect: ConnectFn =
            Box::new(|_, _| Err(ConnectorError::Config("no fabric here".into())));
        let cfg = EngineConfig {
            kv_pool: ByteSize::mib(8),
            ..EngineConfig::default()
        };
        let err = start_with_connector(
            crate::model::test_model(),
            &cfg,
            EngineMetrics::new(),
            &mut Registry::default(),
            Some(connect),
        )
        .expect_err("the engine must not start without its connector");
        assert!(
            matches!(err, EngineError::Connector(ConnectorError::Config(_))),
            "{err:?}"
        );
    }
}
