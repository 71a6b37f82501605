//! The real engine behind the HTTP API, for http_agents and openai_client.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use bytesize::ByteSize;
use kvfabric_engine::chat::ChatTemplate;
use kvfabric_engine::gguf::GgufFile;
use kvfabric_engine::http::{serve, EngineMetrics, HttpState};
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::tokenizer::Tokenizer;
use kvfabric_engine::EngineConfig;
use prometheus_client::registry::Registry;

use super::common::model_path;

pub const MODEL_NAME: &str = "smollm2";

/// The engine and its API on 127.0.0.1:0; dropped with the test's runtime.
pub struct RealServer {
    pub addr: SocketAddr,
    _engine: kvfabric_engine::RunningEngine,
}

pub async fn real_server() -> RealServer {
    let path = model_path();
    let gguf = GgufFile::open(&path).expect("GGUF opens");
    let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf).expect("tokenizer"));
    let template = Arc::new(ChatTemplate::from_gguf(&gguf, &tokenizer).expect("template"));
    let model = Arc::new(LlamaModel::load(&path, |_, _| {}).expect("model loads"));
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(serve(listener, state, std::future::pending()));
    RealServer {
        addr,
        _engine: engine,
    }
}
