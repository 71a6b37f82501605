//! Session affinity through the router: `x-session-affinity` reaches the
//! engine, a session's requests stay on one engine, different sessions
//! spread, and the hits are counted (`kvfabric_router_affinity_hits_total`).
//! Scripted engines (axum on loopback) record which requests they got and
//! with which header.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::routing::post;
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use kvfabric_testkit::router::{metric, plain, start_router, LIMIT};
use serde_json::json;

/// (engine index, session header) of every request an engine got.
type Seen = Arc<Mutex<Vec<(usize, Option<String>)>>>;

async fn scripted_engine(index: usize, seen: Seen) -> String {
    let app = Router::new()
        .route(
            "/v1/completions",
            post(
                |State((i, seen)): State<(usize, Seen)>, headers: HeaderMap, _body: Bytes| async move {
                    let session = headers
                        .get("x-session-affinity")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    seen.lock().expect("lock").push((i, session));
                    axum::Json(json!({
                        "id": "cmpl", "object": "text_completion", "model": "m",
                        "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
                    }))
                },
            ),
        )
        .with_state((index, seen));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

async fn complete(addr: SocketAddr, session: Option<&str>) -> StatusCode {
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let mut req = Request::builder()
            .method(Method::POST)
            .uri("/v1/completions")
            .header("host", addr.to_string())
            .header("content-type", "application/json");
        if let Some(s) = session {
            req = req.header("x-session-affinity", s);
        }
        let body = json!({"model": "m", "prompt": "hello there", "max_tokens": 4}).to_string();
        let resp = sender
            .send_request(req.body(Full::new(Bytes::from(body))).expect("request"))
            .await
            .expect("send");
        let status = resp.status();
        let _ = resp.into_body().collect().await.expect("body");
        status
    };
    tokio::time::timeout(LIMIT, exchange)
        .await
        .expect("in time")
}

#[tokio::test]
async fn the_affinity_header_is_forwarded_and_sessions_stick() {
    let seen: Seen = Arc::default();
    let mut urls = Vec::new();
    for i in 0..3 {
        urls.push(scripted_engine(i, seen.clone()).await);
    }
    let mut cfg = plain(&urls);
    cfg.policy = "affinity".into();
    let router = start_router(cfg).await;
    // Sequential requests: every engine is idle at each pick, so without
    // affinity the tie rotation would spread one session over all three.
    for _ in 0..4 {
        for s in ["alpha", "beta", "gamma"] {
            assert_eq!(complete(router.addr, Some(s)).await, StatusCode::OK);
        }
    }
    let log = seen.lock().expect("lock").clone();
    assert_eq!(log.len(), 12);
    let mut homes = Vec::new();
    for s in ["alpha", "beta", "gamma"] {
        let engines: Vec<usize> = log
            .iter()
            .filter(|(_, h)| h.as_deref() == Some(s))
            .map(|(e, _)| *e)
            .collect();
        assert_eq!(
            engines.len(),
            4,
            "the header reached the engine for {s}: {log:?}"
        );
        assert!(
            engines.iter().all(|e| *e == engines[0]),
            "{s} stuck: {engines:?}"
        );
        homes.push(engines[0]);
    }
    homes.sort_unstable();
    homes.dedup();
    assert_eq!(homes.len(), 3, "idle engines share the new sessions");
    // 3 new sessions, then 9 hits.
    assert_eq!(
        metric(router.addr, "kvfabric_router_affinity_hits_total").await,
        9.0
    );
    assert_eq!(
        metric(router.addr, "kvfabric_router_affinity_fallbacks_total").await,
        0.0
    );
    // Without the header: no header forwarded, least-loaded spreading.
    assert_eq!(complete(router.addr, None).await, StatusCode::OK);
    assert_eq!(
        seen.lock().expect("lock").last().map(|(_, h)| h.clone()),
        Some(None)
    );
    router.shut_down().await;
}
