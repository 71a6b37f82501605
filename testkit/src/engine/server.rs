//! The real engine (the reference model, the scheduler) behind the OpenAI
//! HTTP API on 127.0.0.1:0, for the engine's end-to-end HTTP tests
//! (http_e2e, http_agents, openai_client).

use std::net::SocketAddr;
use std::sync::Arc;

use bytesize::ByteSize;
use kvfabric_engine::chat::ChatTemplate;
use kvfabric_engine::gguf::GgufFile;
use kvfabric_engine::http::{EngineMetrics, HttpState};
use kvfabric_engine::tokenizer::Tokenizer;
use kvfabric_engine::{EngineConfig, EngineError, RunningEngine};
use prometheus_client::registry::Registry;
use tokio::sync::oneshot;

use super::model_path;

/// The model id the server answers to.
pub const MODEL_NAME: &str = "smollm2";

/// The engine and its API; dropped with the test's runtime, or stopped
/// cleanly with [`RealServer::shut_down`].
pub struct RealServer {
    pub addr: SocketAddr,
    engine: RunningEngine,
    shutdown: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), EngineError>>,
}

impl RealServer {
    /// Stop serving, then stop the scheduler and join its thread (panics if
    /// the scheduler thread panicked).
    pub async fn shut_down(self) {
        let _ = self.shutdown.send(());
        let _ = self.task.await;
        let RunningEngine { handle, thread, .. } = self.engine;
        drop(handle);
        thread.join().expect("scheduler thread");
    }
}

/// Two threads, 16-token blocks, 64 MiB of KV.
pub async fn real_server() -> RealServer {
    let path = model_path();
    let gguf = GgufFile::open(&path).expect("GGUF opens");
    let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf).expect("tokenizer"));
    let template = Arc::new(ChatTemplate::from_gguf(&gguf, &tokenizer).expect("template"));
    let model = super::model();
    let context = model.config.context_length;
    let cfg = EngineConfig {
        threads: 2,
        block_tokens: 16,
        kv_pool: ByteSize::mib(64),
        ..EngineConfig::default()
    };
    let metrics = EngineMetrics::new();
    let engine = kvfabric_engine::EngineBuilder::new(cfg)
        .metrics(metrics.clone())
        .start(model)
        .expect("engine starts");
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let state = HttpState::new(
        engine.handle.clone(),
        tokenizer,
        template,
        MODEL_NAME,
        context,
        metrics,
        Arc::new(registry),
    );
    let (addr, shutdown, task) = super::serve_on_loopback(state).await;
    RealServer {
        addr,
        engine,
        shutdown,
        task,
    }
}
