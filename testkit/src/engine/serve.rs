//! Real engines (the reference model, the scheduler) served over the OpenAI
//! HTTP API on 127.0.0.1:0, for tests that put something in front of them
//! (the router's): [`start_engine`] builds one with a role;
//! [`serve_running`] serves a caller-built [`RunningEngine`] (e.g. one with
//! a fabric connector) and [`serve_handle`] any [`EngineHandle`]. Every
//! engine records the [`GenerationRequest`]s it received (prompt length and
//! `max_tokens`) through a forwarding handle in front of the scheduler.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytesize::ByteSize;
use kvfabric_engine::chat::ChatTemplate;
use kvfabric_engine::gguf::GgufFile;
use kvfabric_engine::http::{EngineMetrics, HttpState};
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::tokenizer::Tokenizer;
use kvfabric_engine::{EngineConfig, EngineHandle, GenerationRequest, Role, RunningEngine};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot};

use super::{model, model_path};

/// The model id the test engines answer to.
pub const MODEL: &str = "smollm2";
/// Every test request/await is bounded by this.
pub const LIMIT: Duration = Duration::from_secs(60);

/// Model, tokenizer and chat template, loaded once per test binary.
pub struct Loaded {
    pub model: Arc<LlamaModel>,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Arc<ChatTemplate>,
}

pub fn loaded() -> &'static Loaded {
    static L: OnceLock<Loaded> = OnceLock::new();
    L.get_or_init(|| {
        let path = model_path();
        let model = model();
        let gguf = GgufFile::open(&path).expect("open gguf");
        let tokenizer = Tokenizer::from_gguf(&gguf).expect("tokenizer");
        let template = ChatTemplate::from_gguf(&gguf, &tokenizer).expect("template");
        Loaded {
            model,
            tokenizer: Arc::new(tokenizer),
            template: Arc::new(template),
        }
    })
}

/// Test engine config: one thread, 128 MiB of KV, `role`.
pub fn engine_config(role: Role) -> EngineConfig {
    EngineConfig {
        threads: 1,
        kv_pool: ByteSize::mib(128),
        role,
        ..EngineConfig::default()
    }
}

/// What an engine's scheduler was asked to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    pub prompt_tokens: usize,
    pub max_tokens: usize,
}

/// An engine serving HTTP on loopback.
pub struct TestEngine {
    pub addr: SocketAddr,
    /// Every request that reached the scheduler, in order.
    pub received: Arc<Mutex<Vec<Received>>>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), kvfabric_engine::EngineError>>>,
    /// The scheduler thread, joined (off the runtime) on shutdown.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestEngine {
    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }

    /// Stop serving (the port then refuses connections) and wait for it.
    pub async fn shut_down(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let served = tokio::time::timeout(LIMIT, task)
                .await
                .expect("engine stops in time")
                .expect("serve task");
            served.expect("serve result");
        }
        // The scheduler stops once every handle is gone (the HTTP state held the last).
        if let Some(thread) = self.thread.take() {
            tokio::time::timeout(LIMIT, tokio::task::spawn_blocking(move || thread.join()))
                .await
                .expect("scheduler stops in time")
                .expect("join task")
                .expect("scheduler thread");
        }
    }
}

/// Start an engine of `role` on the reference model.
pub async fn start_engine(role: Role) -> TestEngine {
    let metrics = EngineMetrics::new();
    let running = kvfabric_engine::EngineBuilder::new(engine_config(role))
        .metrics(metrics.clone())
        .start(loaded().model.clone())
        .expect("start engine");
    serve_running(running, metrics, Registry::default()).await
}

/// Serve a caller-built engine (e.g. one with a fabric connector). `metrics`
/// are the ones the scheduler reports into; they are registered here into
/// `registry` (which may already hold the connector's metrics).
pub async fn serve_running(
    running: RunningEngine,
    metrics: EngineMetrics,
    mut registry: Registry,
) -> TestEngine {
    metrics.register(&mut registry);
    let RunningEngine { handle, thread, .. } = running;
    let mut engine = serve_handle(handle, metrics, registry).await;
    engine.thread = Some(thread);
    engine
}

/// Serve any engine handle; `metrics` must be registered in `registry`.
pub async fn serve_handle(
    engine: EngineHandle,
    metrics: EngineMetrics,
    registry: Registry,
) -> TestEngine {
    let (submit, mut intake) = mpsc::channel::<GenerationRequest>(64);
    let received = Arc::new(Mutex::new(Vec::new()));
    let log = received.clone();
    // The forwarder records each request, then hands it to the real scheduler.
    tokio::spawn(async move {
        while let Some(req) = intake.recv().await {
            log.lock().expect("lock").push(Received {
                prompt_tokens: req.prompt.len(),
                max_tokens: req.max_tokens,
            });
            if engine.submit(req).await.is_err() {
                break;
            }
        }
    });
    let l = loaded();
    let state = HttpState::new(
        EngineHandle::new(submit),
        l.tokenizer.clone(),
        l.template.clone(),
        MODEL,
        l.model.config.context_length,
        metrics,
        Arc::new(registry),
    );
    let (addr, tx, task) = super::serve_on_loopback(state).await;
    TestEngine {
        addr,
        received,
        shutdown: Some(tx),
        task: Some(task),
        thread: None,
    }
}
