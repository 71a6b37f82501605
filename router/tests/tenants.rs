//! The router's tenant gate: 401 without a valid key (OpenAI error body),
//! 429 with `Retry-After` over a tenant's rate limit, and the client's
//! `Authorization` forwarded to the engine (which checks it again and picks
//! the tenant's namespace). The engine here is a stub that answers with the
//! `Authorization` it received.

use std::net::SocketAddr;

use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::routing::post;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use kvfabric_router::RouterConfig;
use kvfabric_tenants::KeyHash;
use serde_json::{json, Value};

async fn stub_engine() -> SocketAddr {
    let app = axum::Router::new().route(
        "/v1/completions",
        post(|headers: HeaderMap| async move {
            let auth = headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            axum::Json(json!({
                "object": "text_completion",
                "choices": [{"index": 0, "text": auth, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn post_completion(addr: SocketAddr, key: Option<&str>) -> (StatusCode, HeaderMap, Value) {
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
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let body = json!({"model": "m", "prompt": "hi", "max_tokens": 1}).to_string();
    let req = req.body(Full::new(Bytes::from(body))).expect("request");
    let resp = sender.send_request(req).await.expect("send");
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (
        status,
        headers,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn keys_are_checked_limited_and_forwarded() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("tenants.toml");
    std::fs::write(
        &path,
        format!(
            "[[tenants]]\nname = \"a\"\napi_keys = [\"{}\"]\nrate_limit_per_s = 0.1\nrate_burst = 2\n",
            KeyHash::of("key-a")
        ),
    )
    .expect("tenants file");
    let engine = stub_engine().await;
    let cfg = RouterConfig {
        engines: vec![format!("http://{engine}")],
        tenants_file: Some(path),
        ..RouterConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let router = listener.local_addr().expect("addr");
    tokio::spawn(kvfabric_router::serve(
        cfg,
        listener,
        std::future::pending(),
    ));

    for key in [None, Some("key-b")] {
        let (status, headers, v) = post_completion(router, key).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
        assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(v["error"]["message"].is_string(), "{v}");
        assert_eq!(headers["www-authenticate"], "Bearer");
    }
    let (status, _, v) = post_completion(router, Some("key-a")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        v["choices"][0]["text"], "Bearer key-a",
        "forwarded to the engine"
    );
    assert_eq!(
        post_completion(router, Some("key-a")).await.0,
        StatusCode::OK
    );
    let (status, headers, v) = post_completion(router, Some("key-a")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
    let retry: u64 = headers["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=10).contains(&retry), "{retry}");
}
