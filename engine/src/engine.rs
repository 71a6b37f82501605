//! Wiring: load the model, start the scheduler thread, serve the OpenAI API.
//!
//! [`EngineBuilder`] is the one way to start an engine: set the config,
//! optionally the metrics to report into and the fabric connector, then
//! [`EngineBuilder::start`] a scheduler for an in-process model (tests,
//! benches) or [`EngineBuilder::serve`] a model file over HTTP until
//! shutdown (what `kvfabric engine` runs). Either validates the config
//! exactly once, before anything is allocated.
//!
//! ```no_run
//! # fn demo(model: std::sync::Arc<kvfabric_engine::model::LlamaModel>) -> Result<(), kvfabric_engine::EngineError> {
//! use kvfabric_engine::{EngineBuilder, EngineConfig, EngineMetrics};
//!
//! let metrics = EngineMetrics::new();
//! let engine = EngineBuilder::new(EngineConfig::default())
//!     .metrics(metrics.clone())
//!     .start(model)?;
//! // Submit through engine.handle; drop every handle clone, then join.
//! drop(engine.handle);
//! let _ = engine.thread.join();
//! # Ok(()) }
//! ```

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kvfabric_connector::{ConnectFn, KvConnector, KvMemory};
use kvfabric_tenants::{TenantGate, TenantMetrics};
use prometheus_client::registry::Registry;

use crate::batch::{BatchService, BatchStore, Catalog, MemoryBatchStore};
use crate::chat::ChatTemplate;
use crate::config::{EngineConfig, IsaChoice};
use crate::gguf::GgufFile;
use crate::http::{self, HttpState};
use crate::kernels::{Compute, Isa};
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
    /// The connector's metrics (empty without one). The engine's own
    /// metrics are not in it: register them here to serve both.
    pub registry: Registry,
}

/// How to start an engine: `EngineBuilder::new(config)`, then optionally
/// `.metrics(..)` and `.connector(..)`, then `.start(model)` or `.serve(..)`.
pub struct EngineBuilder {
    config: EngineConfig,
    metrics: EngineMetrics,
    connect: Option<ConnectFn>,
    batch_store: Option<Arc<dyn BatchStore>>,
}

impl std::fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("config", &self.config)
            .field("connector", &self.connect.is_some())
            .finish()
    }
}

impl EngineBuilder {
    /// An engine with `config`'s threads, pool and batching limits, fresh
    /// metrics and no fabric.
    pub fn new(config: EngineConfig) -> EngineBuilder {
        EngineBuilder {
            config,
            metrics: EngineMetrics::new(),
            connect: None,
            batch_store: None,
        }
    }

    /// Report the scheduler's metrics (and, with `serve`, the HTTP layer's) into `metrics`.
    pub fn metrics(mut self, metrics: EngineMetrics) -> EngineBuilder {
        self.metrics = metrics;
        self
    }

    /// Attach the fabric connector `connect` builds over the engine's KV
    /// pool (None: no fabric).
    pub fn connector(mut self, connect: impl Into<Option<ConnectFn>>) -> EngineBuilder {
        self.connect = connect.into();
        self
    }

    /// Keep the batch API's files, batches and results in `store` (with
    /// `serve`; default: in memory, lost at exit).
    pub fn batch_store(mut self, store: Arc<dyn BatchStore>) -> EngineBuilder {
        self.batch_store = Some(store);
        self
    }

    /// Start the scheduler thread for `model`.
    pub fn start(self, model: Arc<LlamaModel>) -> Result<RunningEngine, EngineError> {
        self.config.validate()?;
        self.launch(model)
    }

    /// Load the model file at `model_path` (with a progress bar) and serve
    /// it over HTTP until `shutdown` resolves.
    pub async fn serve(
        self,
        model_path: &Path,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), EngineError> {
        self.config.validate()?;
        let path = model_path.to_path_buf();
        let model = tokio::task::spawn_blocking(move || load_with_progress(&path))
            .await
            .map_err(|source| EngineError::Task {
                task: "model loading",
                source,
            })??;
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
        let (listen, model_name, metrics, batch_cfg) = (
            self.config.listen,
            self.config.model_name.clone(),
            self.metrics.clone(),
            self.config.batch.clone(),
        );
        let batch_store = self.batch_store.clone().unwrap_or_else(|| {
            tracing::warn!(
                "[engine.batch] dir unset: batch jobs are kept in memory and lost at exit"
            );
            Arc::new(MemoryBatchStore::default())
        });
        let tenants = TenantGate::from_config(
            self.config.tenants_file.as_deref(),
            TenantMetrics::default(),
            "openai-api",
        )?;
        tenants.spawn_reloader(Duration::from_millis(self.config.tenants_reload_ms));
        let mut engine = self.launch(model)?;
        let mut registry = std::mem::take(&mut engine.registry);
        metrics.register(&mut registry);
        tenants.metrics().register(&mut registry);
        let state = HttpState::new(
            engine.handle.clone(),
            tokenizer,
            template,
            model_name,
            context_length,
            metrics,
            Arc::new(registry),
        )
        .with_tenants(tenants);
        // Batch jobs run through the same handlers on the low-priority intake.
        let mut batch_state = state.clone();
        batch_state.engine = engine.handle.batch_class();
        let (batches, runner) =
            BatchService::start(Catalog::new(batch_store), batch_cfg, batch_state);
        let state = state.with_batches(batches);
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let served = http::serve(listener, state, shutdown).await;
        // The runner holds an engine handle: stop it so the scheduler can exit.
        runner.abort();
        let _ = runner.await;
        let RunningEngine { handle, thread, .. } = engine;
        drop(handle);
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        served
    }

    /// Allocate the KV pool, attach the connector, spawn the scheduler (the
    /// config is validated).
    fn launch(self, model: Arc<LlamaModel>) -> Result<RunningEngine, EngineError> {
        let cfg = &self.config;
        let isa = pick_isa(cfg.isa, Isa::detect())?;
        let c = &model.config;
        let layout = KvPool::layout_for(
            c.layers,
            c.kv_heads,
            c.head_dim,
            cfg.block_tokens,
            cfg.kv_dtype.into(),
        );
        let kv = KvPool::with_bytes(layout, cfg.kv_pool.as_u64())?;
        let kv_pool_bytes = kv.capacity_bytes();
        let mut registry = Registry::default();
        let connector = match self.connect {
            Some(connect) => {
                let memory = KvMemory {
                    region: kv.region().clone(),
                    layout,
                    blocks: kv.blocks(),
                };
                Some(connect(memory, &mut registry)?)
            }
            None => None,
        };
        let mut cx = Compute::new(cfg.threads);
        cx.isa = isa;
        let sched = Scheduler::new(
            model,
            cx,
            kv,
            SchedulerConfig {
                max_batch_tokens: cfg.max_batch_tokens,
                max_seqs: cfg.max_seqs,
                role: cfg.role,
                metrics: self.metrics,
                prefix_cache: cfg.prefix_cache,
                spec: cfg.spec.clone(),
            },
            connector.clone(),
        )
        .with_batch_cap(cfg.batch.max_seqs);
        let (handle, thread) = sched.spawn(256)?;
        Ok(RunningEngine {
            handle,
            thread,
            kv_pool_bytes,
            connector,
            registry,
        })
    }
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

/// The kernels' ISA for the configured `choice` on a CPU whose best is `best`.
fn pick_isa(choice: IsaChoice, best: Isa) -> Result<Isa, EngineError> {
    let want = match choice {
        IsaChoice::Auto => return Ok(best),
        IsaChoice::Scalar => Isa::Scalar,
        IsaChoice::Avx2 => Isa::Avx2,
        IsaChoice::Avx512 => Isa::Avx512,
    };
    let available = match want {
        Isa::Scalar => true,
        Isa::Avx2 => best != Isa::Scalar,
        Isa::Avx512 => best == Isa::Avx512,
    };
    if available {
        Ok(want)
    } else {
        Err(EngineError::InvalidRequest(format!(
            "engine config: isa {choice:?} is not available on this CPU (best: {best:?})"
        )))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use bytesize::ByteSize;
    use kvfabric_connector::{ConfigProblem, ConnectorError};

    use super::*;

    #[test]
    fn a_connector_that_fails_to_attach_is_a_connector_error() {
        let connect: ConnectFn =
            Box::new(|_, _| Err(ConnectorError::Config(ConfigProblem::NoRuntime)));
        let cfg = EngineConfig {
            kv_pool: ByteSize::mib(8),
            ..EngineConfig::default()
        };
        let err = EngineBuilder::new(cfg)
            .connector(connect)
            .start(crate::model::test_model())
            .expect_err("the engine must not start without its connector");
        assert!(
            matches!(err, EngineError::Connector(ConnectorError::Config(_))),
            "{err:?}"
        );
    }

    #[test]
    fn the_configured_isa_is_used_and_one_the_cpu_lacks_is_refused() {
        use IsaChoice::*;
        assert_eq!(pick_isa(Auto, Isa::Avx2).ok(), Some(Isa::Avx2));
        assert_eq!(pick_isa(Scalar, Isa::Avx512).ok(), Some(Isa::Scalar));
        assert_eq!(pick_isa(Avx2, Isa::Avx512).ok(), Some(Isa::Avx2));
        assert_eq!(pick_isa(Avx512, Isa::Avx512).ok(), Some(Isa::Avx512));
        assert!(pick_isa(Avx512, Isa::Avx2).is_err());
        assert!(pick_isa(Avx2, Isa::Scalar).is_err());
    }

    #[test]
    fn a_bad_config_is_refused_before_anything_starts() {
        let cfg = EngineConfig {
            max_seqs: 0,
            ..EngineConfig::default()
        };
        let connect: ConnectFn = Box::new(|_, _| panic!("the connector must not be built"));
        let err = EngineBuilder::new(cfg)
            .connector(connect)
            .start(crate::model::test_model())
            .expect_err("max_seqs = 0 is refused");
        assert!(matches!(err, EngineError::InvalidRequest(_)), "{err:?}");
    }
}
