//! The router in front of real engines (feature `router`): a router on
//! 127.0.0.1:0 ([`start_router`]), its configs over engine URLs
//! ([`disaggregated`], [`plain`]), and a small hyper client that reads JSON
//! and SSE answers. The engines come from [`crate::engine::serve`],
//! re-exported here so a router test imports one module.

use std::net::SocketAddr;

use http_body_util::BodyExt;
use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use kvfabric_router::RouterConfig;
use serde_json::Value;
use tokio::sync::oneshot;

pub use crate::engine::model_path;
pub use crate::engine::serve::*;

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
        let body = String::from_utf8(body).expect("a UTF-8 request body");
        let resp = crate::engine::http::send(addr, method.as_str(), path, &body, &[]).await;
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
    crate::metrics::prefix_sum(&text, prefix)
}
