//! The tenant gate on the OpenAI API, against the scripted scheduler
//! stand-in: 401 without a valid key, the tenant's namespace (and
//! `cache_salt`, and a shared namespace) reaching the scheduler, 429 with
//! `Retry-After` over a tenant's rate or concurrency limit, a revoked key
//! refused after one reload, and per-tenant metrics.

use kvfabric_testkit::engine::http as http_support;

use std::path::Path;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use http_support::*;
use kvfabric_tenants::KeyHash;
use serde_json::{json, Value};

fn tenants_file(path: &Path, keys_a: &[&str]) {
    let hashes = |ks: &[&str]| {
        ks.iter()
            .map(|k| format!("\"{}\"", KeyHash::of(k)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let text = format!(
        r#"
[[tenants]]
name = "a"
api_keys = [{}]
[[tenants]]
name = "b"
api_keys = [{}]
[[tenants]]
name = "slow"
api_keys = [{}]
rate_limit_per_s = 0.2
rate_burst = 1
[[tenants]]
name = "one"
api_keys = [{}]
max_concurrent = 1
[[tenants]]
name = "p1"
api_keys = [{}]
[[tenants]]
name = "p2"
api_keys = [{}]
[[shared]]
name = "public"
members = ["p1", "p2"]
"#,
        hashes(keys_a),
        hashes(&["key-b"]),
        hashes(&["key-slow"]),
        hashes(&["key-one"]),
        hashes(&["key-p1"]),
        hashes(&["key-p2"]),
    );
    // Write then rename: a reader never sees half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write tenants file");
    std::fs::rename(&tmp, path).expect("rename tenants file");
}

async fn post(server: &Server, key: Option<&str>, body: Value) -> (u16, Value, Option<String>) {
    let auth = key.map(|k| format!("Bearer {k}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("authorization", a)])
        .unwrap_or_default();
    let resp = send(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &body.to_string(),
        &headers,
    )
    .await;
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().expect("ascii").to_string());
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, v, retry)
}

async fn setup() -> (tempfile::TempDir, std::path::PathBuf, Server) {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("tenants.toml");
    tenants_file(&path, &["key-a"]);
    let server = start_gated(true, Some(&path)).await;
    (dir, path, server)
}

#[tokio::test]
async fn missing_malformed_and_unknown_keys_get_401_with_an_openai_error() {
    let (_dir, _path, server) = setup().await;
    for key in [None, Some("wrong-key")] {
        let (status, v, _) = post(&server, key, chat_body("hi")).await;
        assert_openai_error(status, &v, 401, None);
        assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }
    let resp = send(
        server.addr,
        "GET",
        "/v1/models",
        "",
        &[("authorization", "Basic a2V5LWE=")],
    )
    .await;
    assert_eq!(resp.status().as_u16(), 401);
    assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    // Health and metrics stay open (probes and scrapers hold no key).
    assert_eq!(call(server.addr, "GET", "/health", "").await.0, 200);
    assert_eq!(call(server.addr, "GET", "/metrics", "").await.0, 200);
    let (status, _, _) = post(&server, Some("key-a"), chat_body("hi")).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn tenants_salts_and_shared_namespaces_reach_the_scheduler() {
    let (_dir, _path, mut server) = setup().await;
    let ns = |key: &'static str, salt: Option<&'static str>| {
        let mut body = chat_body("the same prompt");
        if let Some(s) = salt {
            body["cache_salt"] = json!(s);
        }
        (key, body)
    };
    let cases = [
        ns("key-a", None),
        ns("key-b", None),
        ns("key-a", Some("s1")),
        ns("key-a", Some("s2")),
        ns("key-p1", None),
        ns("key-p2", None),
    ];
    let mut seen = Vec::new();
    for (key, body) in cases {
        let (status, v, _) = post(&server, Some(key), body).await;
        assert_eq!(status, 200, "{v}");
        seen.push(next_seen(&mut server).await.namespace);
    }
    assert_eq!(seen[0], b"tenant:a");
    assert_eq!(seen[1], b"tenant:b");
    assert_ne!(seen[2], seen[0], "a salt splits a tenant");
    assert_ne!(seen[2], seen[3], "two salts split each other");
    assert_eq!(seen[4], b"shared:public");
    assert_eq!(seen[4], seen[5], "members of a shared namespace share it");
    let (status, v, _) = post(&server, Some("key-a"), {
        let mut b = chat_body("x");
        b["cache_salt"] = json!("");
        b
    })
    .await;
    assert_openai_error(status, &v, 400, Some("cache_salt"));
}

#[tokio::test]
async fn over_the_rate_limit_is_429_with_retry_after() {
    let (_dir, _path, server) = setup().await;
    let (status, _, _) = post(&server, Some("key-slow"), chat_body("hi")).await;
    assert_eq!(status, 200);
    let (status, v, retry) = post(&server, Some("key-slow"), chat_body("hi")).await;
    assert_openai_error(status, &v, 429, None);
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
    let secs: u64 = retry.expect("Retry-After").parse().expect("seconds");
    assert!((1..=5).contains(&secs), "retry after {secs}s at 0.2 req/s");
    // Another tenant is not limited by it.
    assert_eq!(post(&server, Some("key-b"), chat_body("hi")).await.0, 200);
    let metrics = call(server.addr, "GET", "/metrics", "").await.1;
    assert!(
        metrics.contains(
            r#"kvfabric_tenant_rejected_requests_total{tenant="slow",reason="rate_limit"} 1"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"kvfabric_tenant_requests_total{tenant="b"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"kvfabric_tenant_cached_tokens_total{tenant="b"}"#),
        "{metrics}"
    );
    // The stand-in reports half the prompt cached: one hit request for b.
    assert!(
        metrics.contains(r#"kvfabric_tenant_hit_requests_total{tenant="b"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn over_the_concurrency_limit_is_429_until_the_stream_ends() {
    let (_dir, _path, server) = setup().await;
    // A slow stream holds tenant `one`'s only slot while it streams.
    let mut body = chat_body("SLOW");
    body["stream"] = json!(true);
    body["max_tokens"] = json!(30);
    let resp = send(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &body.to_string(),
        &[("authorization", "Bearer key-one")],
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let (status, v, retry) = post(&server, Some("key-one"), chat_body("hi")).await;
    assert_openai_error(status, &v, 429, None);
    assert_eq!(v["error"]["code"], "concurrency_limit_exceeded", "{v}");
    assert_eq!(retry.as_deref(), Some("1"));
    let _ = resp.into_body().collect().await.expect("stream ends");
    // The slot is back once the stream was sent.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, _, _) = post(&server, Some("key-one"), chat_body("hi")).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "slot never freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_revoked_key_is_refused_after_one_reload() {
    let (_dir, path, server) = setup().await;
    tenants_file(&path, &["key-a", "key-a2"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while post(&server, Some("key-a2"), chat_body("hi")).await.0 != 200 {
        assert!(Instant::now() < deadline, "added key never accepted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tenants_file(&path, &["key-a2"]);
    let revoked = Instant::now();
    loop {
        let (status, v, _) = post(&server, Some("key-a"), chat_body("hi")).await;
        if status == 401 {
            assert_eq!(v["error"]["code"], "invalid_api_key");
            break;
        }
        // The reloader reads the file every 50 ms: one period, plus slack.
        assert!(
            revoked.elapsed() < Duration::from_secs(2),
            "revoked key still accepted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(post(&server, Some("key-a2"), chat_body("hi")).await.0, 200);
}

#[tokio::test]
async fn single_tenant_mode_needs_no_key_and_uses_the_empty_namespace() {
    let mut server = start_gated(true, None).await;
    let (status, v, _) = post(&server, None, chat_body("hi")).await;
    assert_eq!(status, 200, "{v}");
    assert!(next_seen(&mut server).await.namespace.is_empty());
}
