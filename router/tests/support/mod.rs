//! Shared by the router tests: real engines in-process on 127.0.0.1:0, the
//! router in front of them, and a small hyper client.
//!
//! Engines: [`start_engine`] builds one from the reference model with a role;
//! [`serve_running`] serves a caller-built [`RunningEngine`] (e.g. one with a
//! fabric connector) and [`serve_handle`] any [`EngineHandle`]. Every engine
//! records the [`GenerationRequest`]s it received (prompt length and
//! `max_tokens`) by putting a forwarding handle in front of the scheduler.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytesize::ByteSize;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use kvfabric_engine::chat::ChatTemplate;
use kvfabric_engine::gguf::GgufFile;
use kvfabric_engine::http::{serve, EngineMetrics, HttpState};
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::tokenizer::Tokenizer;
use kvfabric_engine::{EngineConfig, EngineHandle, GenerationRequest, Role, RunningEngine};
use kvfabric_router::RouterConfig;
use prometheus_client::registry::Registry;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

/// The model id the test engines answer to.
pub const MODEL: &str = "smollm2";
/// Every test request/await is bounded by this.
pub const LIMIT: Duration = Duration::from_secs(60);

pub use kvfabric_testkit::engine::model_path;

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
        let model = kvfabric_testkit::engine::model();
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, state, async move {
        let _ = rx.await;
    }));
    TestEngine {
        addr,
        received,
        shutdown: Some(tx),
        task: Some(task),
        thread: None,
    }
}

/// A router on loopback.
pub struct TestRouter {
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), kvfabric_router::RouterError>>,
}

impl TestRouter {
    pub async fn shut_down(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(LIMIT, self.task)
            .await
            .expect("router stops in time")
            .expect("router task")
            .expect("router result");
    }
}

/// Start the router with `cfg` on 127.0.0.1:0.
pub async fn start_router(cfg: RouterConfig) -> TestRouter {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(kvfabric_router::serve(cfg, listener, async move {
        let _ = rx.await;
    }));
    TestRouter {
        addr,
        shutdown: Some(tx),
        task,
    }
}

fn owned<S: AsRef<str>>(urls: &[S]) -> Vec<String> {
    urls.iter().map(|u| u.as_ref().to_owned()).collect()
}

/// Router config over these URLs (timeouts short enough for tests).
pub fn disaggregated<S: AsRef<str>>(prefill: &[S], decode: &[S]) -> RouterConfig {
    RouterConfig {
        prefill: owned(prefill),
        decode: owned(decode),
        request_timeout_ms: 30_000,
        connect_timeout_ms: 1_000,
        ..RouterConfig::default()
    }
}

pub fn plain<S: AsRef<str>>(engines: &[S]) -> RouterConfig {
    RouterConfig {
        engines: owned(engines),
        request_timeout_ms: 30_000,
        connect_timeout_ms: 1_000,
        ..RouterConfig::default()
    }
}

/// One HTTP/1.1 request on a fresh connection; (status, content-type, body).
pub async fn request(
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Vec<u8>,
) -> (StatusCode, String, Bytes) {
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", addr.to_string())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("request");
        let resp = sender.send_request(req).await.expect("send");
        let status = resp.status();
        let ct = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (status, ct, bytes)
    };
    tokio::time::timeout(LIMIT, exchange)
        .await
        .expect("request finishes in time")
}

/// POST JSON, parse the JSON answer.
pub async fn post_json(addr: SocketAddr, path: &str, body: &Value) -> (StatusCode, Value) {
    let (status, _, bytes) = request(addr, Method::POST, path, body.to_string().into_bytes()).await;
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, v)
}

/// POST a streaming request; the `data:` payloads in order (`[DONE]` included).
pub async fn post_stream(addr: SocketAddr, path: &str, body: &Value) -> (StatusCode, Vec<String>) {
    let (status, ct, bytes) =
        request(addr, Method::POST, path, body.to_string().into_bytes()).await;
    assert!(ct.starts_with("text/event-stream"), "content-type {ct}");
    let text = String::from_utf8(bytes.to_vec()).expect("utf8");
    let events = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.trim_start().to_owned())
        .collect();
    (status, events)
}

/// The generated text of a non-streamed answer (either API).
pub fn answer_text(v: &Value) -> String {
    let c = &v["choices"][0];
    c["text"]
        .as_str()
        .or_else(|| c["message"]["content"].as_str())
        .unwrap_or_else(|| panic!("no text in {v}"))
        .to_owned()
}

/// The concatenated text of streamed events, and the usage chunk if any.
pub fn stream_text(events: &[String]) -> (String, Option<Value>) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let mut text = String::new();
    let mut usage = None;
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}"));
        assert!(v.get("error").is_none(), "error event: {v}");
        if let Some(c) = v["choices"].get(0) {
            if let Some(t) = c["text"].as_str() {
                text.push_str(t);
            }
            if let Some(t) = c["delta"]["content"].as_str() {
                text.push_str(t);
            }
        }
        if v.get("usage").is_some_and(|u| !u.is_null()) {
            usage = Some(v["usage"].clone());
        }
    }
    (text, usage)
}

/// GET `/metrics` and return the value of the series line starting with `prefix`
/// (summed over every line that starts with it).
pub async fn metric(addr: SocketAddr, prefix: &str) -> f64 {
    let (status, _, bytes) = request(addr, Method::GET, "/metrics", Vec::new()).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(bytes.to_vec()).expect("utf8");
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
