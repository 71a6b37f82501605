//! The two-hop protocol against scripted engines (axum on loopback): what
//! each hop receives, how `kv_transfer_params` and `cached_tokens` travel,
//! SSE pass-through without buffering, and every failure path (prefill 5xx,
//! timeout, 4xx; decode down, decode 5xx).
//!
//! Scripted engines are needed here because today's real engines have no
//! fabric connector yet, so a real prefill answer carries no
//! `kv_transfer_params`; `engines.rs` covers the same paths with real ones.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use kvfabric_testkit::router::{
    disaggregated, metric, post_json, post_stream, start_router, stream_text, LIMIT,
};
use serde_json::{json, Value};
use tokio::sync::Notify;

/// How a scripted engine answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Script {
    /// Prefill: JSON with kv_transfer_params and cached_tokens 64.
    Prefill,
    /// Prefill: 500 with an engine error body.
    Fail500,
    /// Prefill: 404 model_not_found.
    Refuse404,
    /// Prefill: answers only after 5 s.
    Slow,
    /// Decode: JSON (or SSE when `stream`), cached_tokens 0; SSE waits for
    /// `release` after its first event.
    Decode,
}

#[derive(Clone)]
struct Scripted {
    script: Script,
    bodies: Arc<Mutex<Vec<Value>>>,
    release: Arc<Notify>,
    /// Notified when a decode stream is dropped (its client went away).
    dropped: Arc<Notify>,
}

/// Notifies when dropped.
struct DropSignal(Arc<Notify>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

const BLOCK_KEY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn transfer_params() -> Value {
    json!({"holder": "node-a", "block_keys": [BLOCK_KEY], "block_tokens": 64, "cached_tokens": 64})
}

async fn answer(State(s): State<Scripted>, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    s.bodies.lock().expect("lock").push(v.clone());
    let usage = |cached: u64| json!({"prompt_tokens": 70, "completion_tokens": 1, "total_tokens": 71, "prompt_tokens_details": {"cached_tokens": cached}});
    match s.script {
        Script::Prefill => axum::Json(json!({
            "id": "cmpl-p", "object": "text_completion", "model": "m",
            "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
            "usage": usage(64),
            "kv_transfer_params": transfer_params(),
        }))
        .into_response(),
        Script::Fail500 => (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({"error": {"message": "kernel exploded", "type": "server_error"}})),
        )
            .into_response(),
        Script::Refuse404 => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"error": {"message": "no such model", "type": "invalid_request_error", "code": "model_not_found"}})),
        )
            .into_response(),
        Script::Slow => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            axum::Json(json!({"usage": usage(64)})).into_response()
        }
        Script::Decode if v["stream"] == json!(true) => {
            let release = s.release.clone();
            let chunk = |text: &str| format!("data: {}\n\n", json!({"choices": [{"index": 0, "text": text, "finish_reason": null}]}));
            let first = chunk("Hello");
            let rest = format!(
                "{}data: {}\n\ndata: [DONE]\n\n",
                chunk(" world"),
                json!({"choices": [], "usage": usage(0)})
            );
            let signal = DropSignal(s.dropped.clone());
            let stream = futures::stream::unfold(0, move |step| {
                let _owned_by_the_stream = &signal;
                let (first, rest, release) = (first.clone(), rest.clone(), release.clone());
                async move {
                    match step {
                        0 => Some((Ok::<_, std::io::Error>(Bytes::from(first)), 1)),
                        1 => {
                            release.notified().await;
                            Some((Ok(Bytes::from(rest)), 2))
                        }
                        _ => None,
                    }
                }
            });
            ([(header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(stream)).into_response()
        }
        Script::Decode => axum::Json(json!({
            "id": "cmpl-d", "object": "text_completion", "model": "m",
            "choices": [{"index": 0, "text": "Hello world", "finish_reason": "length"}],
            "usage": usage(0),
        }))
        .into_response(),
    }
}

struct Fake {
    url: String,
    bodies: Arc<Mutex<Vec<Value>>>,
    release: Arc<Notify>,
    dropped: Arc<Notify>,
}

impl Fake {
    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().expect("lock").clone()
    }
}

async fn fake(script: Script) -> Fake {
    let state = Scripted {
        script,
        bodies: Arc::new(Mutex::new(Vec::new())),
        release: Arc::new(Notify::new()),
        dropped: Arc::new(Notify::new()),
    };
    let app = Router::new()
        .route("/v1/completions", post(answer))
        .route("/v1/chat/completions", post(answer))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    Fake {
        url: format!("http://{addr}"),
        bodies: state.bodies,
        release: state.release,
        dropped: state.dropped,
    }
}

/// A URL where nothing listens.
async fn dead_url() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    format!("http://{addr}")
}

fn body() -> Value {
    json!({"model": "m", "prompt": "hello there", "max_tokens": 9, "temperature": 0})
}

#[tokio::test]
async fn hops_carry_the_protocol_fields_and_cached_tokens_come_from_prefill() {
    let prefill = fake(Script::Prefill).await;
    let decode = fake(Script::Decode).await;
    let router = start_router(disaggregated(&[&prefill.url], &[&decode.url])).await;

    let (status, v) = post_json(router.addr, "/v1/completions", &body()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], "Hello world");
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"], 64,
        "{v}"
    );

    let mut streamed = body();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let release = decode.release.clone();
    // Let the stream finish only once the router forwarded its first event (see the next test).
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        release.notify_one();
    });
    let (status, events) = post_stream(router.addr, "/v1/completions", &streamed).await;
    releaser.await.expect("releaser");
    assert_eq!(status, 200);
    let (text, usage) = stream_text(&events);
    assert_eq!(text, "Hello world");
    assert_eq!(
        usage.expect("usage")["prompt_tokens_details"]["cached_tokens"],
        64
    );

    let pre = prefill.bodies();
    assert_eq!(pre.len(), 2);
    for p in &pre {
        assert_eq!(p["max_tokens"], 1, "{p}");
        assert_eq!(p["stream"], false, "{p}");
        assert!(p.get("stream_options").is_none(), "{p}");
        assert_eq!(p["kv_transfer_params"], json!({"do_remote_decode": true}));
        assert_eq!(p["prompt"], "hello there");
    }
    let dec = decode.bodies();
    assert_eq!(dec.len(), 2);
    assert_eq!(dec[0]["max_tokens"], 9);
    assert_eq!(dec[0]["kv_transfer_params"], transfer_params());
    assert_eq!(dec[1]["stream"], true);
    assert_eq!(dec[1]["stream_options"]["include_usage"], true);
    assert_eq!(dec[1]["kv_transfer_params"], transfer_params());
    router.shut_down().await;
}

#[tokio::test]
async fn sse_events_reach_the_client_before_the_stream_ends() {
    let prefill = fake(Script::Prefill).await;
    let decode = fake(Script::Decode).await;
    let router = start_router(disaggregated(&[&prefill.url], &[&decode.url])).await;
    let mut streamed = body();
    streamed["stream"] = json!(true);

    let exchange = async {
        let stream = tokio::net::TcpStream::connect(router.addr)
            .await
            .expect("connect");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let req = hyper::Request::post("/v1/completions")
            .header("host", "router")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(streamed.to_string())))
            .expect("request");
        let mut resp = sender.send_request(req).await.expect("send");
        assert_eq!(resp.status(), 200);
        // The decode engine holds the rest back until released: the first
        // event can only arrive here if the router forwards without buffering.
        let first = resp.body_mut().frame().await.expect("a frame").expect("ok");
        let first = first.into_data().expect("data");
        assert!(
            String::from_utf8_lossy(&first).contains("Hello"),
            "{first:?}"
        );
        decode.release.notify_one();
        let rest = resp.into_body().collect().await.expect("rest").to_bytes();
        assert!(String::from_utf8_lossy(&rest).ends_with("data: [DONE]\n\n"));
    };
    tokio::time::timeout(LIMIT, exchange)
        .await
        .expect("in time");
    router.shut_down().await;
}

/// Prefill at `prefill_url` fails; the answer must come from decode alone.
async fn assert_falls_back(prefill_url: String, timeout_ms: Option<u64>, kind: &str) {
    let decode = fake(Script::Decode).await;
    let mut cfg = disaggregated(&[prefill_url.as_str()], &[decode.url.as_str()]);
    if let Some(ms) = timeout_ms {
        cfg.request_timeout_ms = ms;
    }
    let router = start_router(cfg).await;
    let (status, v) = post_json(router.addr, "/v1/completions", &body()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], "Hello world");
    // Decode's own count: no prefill value to substitute.
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let dec = decode.bodies();
    assert_eq!(dec.len(), 1);
    assert!(dec[0].get("kv_transfer_params").is_none(), "{}", dec[0]);
    assert_eq!(dec[0]["max_tokens"], 9);
    assert_eq!(
        metric(router.addr, "kvfabric_router_prefill_fallbacks_total").await,
        1.0
    );
    let errors = metric(
        router.addr,
        &format!(r#"kvfabric_router_upstream_errors_total{{endpoint="{prefill_url}",hop="prefill",kind="{kind}"}}"#),
    )
    .await;
    assert_eq!(errors, 1.0, "kind {kind}");
    router.shut_down().await;
}

#[tokio::test]
async fn prefill_5xx_falls_back_to_decode() {
    let prefill = fake(Script::Fail500).await;
    assert_falls_back(prefill.url.clone(), None, "status").await;
    assert_eq!(prefill.bodies().len(), 1);
}

#[tokio::test]
async fn prefill_timeout_falls_back_to_decode() {
    let prefill = fake(Script::Slow).await;
    let started = std::time::Instant::now();
    assert_falls_back(prefill.url.clone(), Some(300), "timeout").await;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "did not wait for the slow prefill"
    );
}

#[tokio::test]
async fn prefill_connection_refused_falls_back_to_decode() {
    assert_falls_back(dead_url().await, None, "connect").await;
}

#[tokio::test]
async fn prefill_4xx_is_returned_as_is_and_decode_is_not_called() {
    let prefill = fake(Script::Refuse404).await;
    let decode = fake(Script::Decode).await;
    let router = start_router(disaggregated(&[&prefill.url], &[&decode.url])).await;
    let (status, v) = post_json(router.addr, "/v1/completions", &body()).await;
    assert_eq!(status, 404);
    assert_eq!(v["error"]["code"], "model_not_found");
    assert!(decode.bodies().is_empty());
    router.shut_down().await;
}

async fn assert_decode_failure_is_502(decode_url: String) {
    let prefill = fake(Script::Prefill).await;
    let router = start_router(disaggregated(
        &[prefill.url.as_str()],
        &[decode_url.as_str()],
    ))
    .await;
    for stream in [false, true] {
        let mut b = body();
        b["stream"] = json!(stream);
        let (status, v) = post_json(router.addr, "/v1/completions", &b).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{v}");
        assert_eq!(v["error"]["type"], "server_error", "{v}");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    let failed = metric(
        router.addr,
        r#"kvfabric_router_requests_total{mode="disaggregated",route="/v1/completions",outcome="upstream_error"}"#,
    )
    .await;
    assert_eq!(failed, 2.0);
    assert_eq!(
        metric(router.addr, "kvfabric_router_inflight_decode_tokens").await,
        0.0
    );
    router.shut_down().await;
}

#[tokio::test]
async fn decode_down_is_a_502_json_error() {
    assert_decode_failure_is_502(dead_url().await).await;
}

#[tokio::test]
async fn decode_5xx_is_a_502_json_error() {
    let decode = fake(Script::Fail500).await;
    assert_decode_failure_is_502(decode.url.clone()).await;
}

#[tokio::test]
async fn invalid_config_is_refused_by_serve() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let cfg = kvfabric_router::RouterConfig::default(); // no endpoints
    let e = kvfabric_router::serve(cfg, listener, async {})
        .await
        .expect_err("no endpoints");
    assert!(matches!(e, kvfabric_router::RouterError::Config(_)), "{e}");
}

#[tokio::test]
async fn a_client_that_goes_away_releases_the_decode_engine() {
    let prefill = fake(Script::Prefill).await;
    let decode = fake(Script::Decode).await;
    let router = start_router(disaggregated(&[&prefill.url], &[&decode.url])).await;
    let mut streamed = body();
    streamed["stream"] = json!(true);
    let check = async {
        let stream = tokio::net::TcpStream::connect(router.addr)
            .await
            .expect("connect");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        let conn = tokio::spawn(conn);
        let req = hyper::Request::post("/v1/completions")
            .header("host", "router")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(streamed.to_string())))
            .expect("request");
        let mut resp = sender.send_request(req).await.expect("send");
        resp.body_mut().frame().await.expect("a frame").expect("ok");
        let decode_tokens = metric(router.addr, "kvfabric_router_inflight_decode_tokens").await;
        assert_eq!(decode_tokens, (3 + 9) as f64, "held while streaming");
        // The client goes away mid-stream.
        drop(resp);
        drop(sender);
        conn.abort();
        // The router drops its engine connection: the engine's stream ends.
        decode.dropped.notified().await;
        let mut released = false;
        for _ in 0..100 {
            if metric(router.addr, "kvfabric_router_inflight_decode_tokens").await == 0.0 {
                released = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(released, "decode tokens released");
        let cancelled = metric(
            router.addr,
            r#"kvfabric_router_requests_total{mode="disaggregated",route="/v1/completions",outcome="cancelled"}"#,
        )
        .await;
        assert_eq!(cancelled, 1.0);
    };
    tokio::time::timeout(LIMIT, check).await.expect("in time");
    router.shut_down().await;
}
