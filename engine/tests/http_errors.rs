//! The OpenAI HTTP layer's failure paths against a scripted scheduler
//! stand-in: 4xx JSON errors, engine errors, shutdown, client disconnect,
//! plus `/v1/models`, `/health` and `/metrics`.

use kvfabric_testkit::engine::http as http_support;

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use http_support::*;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

#[tokio::test]
async fn bad_requests_get_openai_json_errors() {
    let server = start().await;
    let a = server.addr;
    let (s, v) = call_json(
        a,
        "/v1/chat/completions",
        json!({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_openai_error(s, &v, 404, Some("model"));
    assert_eq!(v["error"]["code"], "model_not_found");
    let (s, v) = call_json(
        a,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": []}),
    )
    .await;
    assert_openai_error(s, &v, 400, Some("messages"));
    let (s, v) = call_json(a, "/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": CONTEXT})).await;
    assert_openai_error(s, &v, 400, Some("max_tokens"));
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let (s, v) = call_json(
        a,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "y".repeat(CONTEXT)}),
    )
    .await;
    assert_openai_error(s, &v, 400, Some("prompt"));
    let (s, v) = call_json(a, "/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"})).await;
    assert_openai_error(s, &v, 400, Some("max_tokens"));
    let (s, v) = call_json(
        a,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 3}),
    )
    .await;
    assert_openai_error(s, &v, 400, Some("temperature"));
    let (s, v) = call_json(
        a,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": "hi"}),
    )
    .await;
    assert_openai_error(s, &v, 400, Some("messages"));
    let (s, v) = call_json(
        a,
        "/v1/completions",
        json!({"model": MODEL, "prompt": [70000]}),
    )
    .await;
    assert_openai_error(s, &v, 400, Some("prompt"));
    let (s, text) = call(a, "POST", "/v1/chat/completions", "{\"model\": ").await;
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("malformed JSON must get a JSON error ({e}): {text}"));
    assert_openai_error(s, &v, 400, None);
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let (s, text) = call(a, "GET", "/v1/nope", "").await;
    let v: Value = serde_json::from_str(&text).expect("JSON 404");
    assert_openai_error(s, &v, 404, None);
}

/// Nothing is silently ignored: an unknown role, an unknown key and a
/// known-but-unimplemented parameter are 400s naming the field (the old
/// server answered all three 200 as if they were absent).
#[tokio::test]
async fn ignored_parameters_and_unknown_roles_are_400s() {
    let server = start().await;
    let a = server.addr;
    let (s, v) = call_json(
        a,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}),
    )
    .await;
    assert_openai_error(s, &v, 400, Some("messages[0].role"));
    let mut body = chat_body("hi");
    body["logit_bias"] = json!({"42": 5});
    let (s, v) = call_json(a, "/v1/chat/completions", body).await;
    assert_openai_error(s, &v, 400, Some("logit_bias"));
    let mut body = chat_body("hi");
    body["no_such_thing"] = json!(1);
    let (s, v) = call_json(a, "/v1/chat/completions", body).await;
    assert_openai_error(s, &v, 400, Some("no_such_thing"));
    let (s, v) = call_json(
        a,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "hi", "suffix": "end"}),
    )
    .await;
    assert_openai_error(s, &v, 400, Some("suffix"));
    // Neutral values and nulls pass.
    let mut body = chat_body("hi");
    body["presence_penalty"] = json!(0);
    body["frequency_penalty"] = Value::Null;
    let (s, _) = call_json(a, "/v1/chat/completions", body).await;
    assert_eq!(s, 200);
}

#[tokio::test]
async fn client_disconnect_cancels_the_request() {
    let mut server = start().await;
    let mut body = chat_body("SLOW please");
    body["stream"] = json!(true);
    let stream = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    let conn_task = tokio::spawn(conn);
    let req = hyper::Request::post("/v1/chat/completions")
        .header("host", "localhost")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let mut resp = sender.send_request(req).await.expect("response");
    assert_eq!(resp.status(), 200);
    // Read until some content arrived, then hang up.
    let mut got = String::new();
    while !got.contains("\"content\":\"T") {
        let frame = tokio::time::timeout(Duration::from_secs(5), resp.body_mut().frame())
            .await
            .expect("a frame in time")
            .expect("stream open")
            .expect("frame");
        if let Ok(data) = frame.into_data() {
            got.push_str(&String::from_utf8_lossy(&data));
        }
    }
    drop(resp);
    drop(sender);
    conn_task.abort();
    let seen = next_seen(&mut server).await;
    let (_, metrics) = call(server.addr, "GET", "/metrics", "").await;
    assert!(
        metrics.contains("kvfabric_engine_requests_total{outcome=\"cancelled\"} 1"),
        "{metrics}"
    );
    assert!(
        seen.cancelled_after.is_some_and(|n| n < seen.max_tokens),
        "{seen:?}"
    );
}

#[tokio::test]
async fn engine_errors_and_shutdown_are_server_errors() {
    let server = start().await;
    let (s, v) = call_json(server.addr, "/v1/chat/completions", chat_body("FAIL now")).await;
    assert_openai_error(s, &v, 500, None);
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("boom")));
    let mut body = chat_body("FAIL now");
    body["stream"] = json!(true);
    let (s, text) = call(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &body.to_string(),
    )
    .await;
    assert_eq!(s, 200);
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert!(
        data.iter()
            .any(|d| d.contains("\"error\"") && d.contains("boom")),
        "{text}"
    );
    let stopped = start_with(false).await;
    let (s, v) = call_json(stopped.addr, "/v1/chat/completions", chat_body("hi")).await;
    assert_openai_error(s, &v, 503, None);
}

#[tokio::test]
async fn models_health_and_metrics() {
    let mut server = start().await;
    let (s, text) = call(server.addr, "GET", "/v1/models", "").await;
    assert_eq!(s, 200);
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["max_model_len"], CONTEXT);
    let (s, text) = call(server.addr, "GET", "/health", "").await;
    assert_eq!((s, text.contains("ok")), (200, true));
    let (s, _) = call_json(server.addr, "/v1/chat/completions", chat_body("hi")).await;
    assert_eq!(s, 200);
    let seen = next_seen(&mut server).await;
    let (s, text) = call(server.addr, "GET", "/metrics", "").await;
    assert_eq!(s, 200);
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing in:\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(
        line("kvfabric_engine_time_to_first_token_seconds_count"),
        "1"
    );
    let reply_len = server.tokenizer.encode(REPLY, false).len();
    assert_eq!(
        line("kvfabric_engine_inter_token_latency_seconds_count"),
        (reply_len - 1).to_string()
    );
    assert_eq!(
        line("kvfabric_engine_generation_tokens_total"),
        reply_len.to_string()
    );
    assert_eq!(
        line("kvfabric_engine_prompt_tokens_total"),
        seen.prompt.len().to_string()
    );
    assert_eq!(
        line("kvfabric_engine_prefix_cache_hit_tokens_total"),
        (seen.prompt.len() / 2).to_string()
    );
    assert_eq!(
        line("kvfabric_engine_requests_total{outcome=\"stop\"}"),
        "1"
    );
    assert_eq!(line("kvfabric_engine_kv_blocks_used"), "3");
    assert!(text.contains("kvfabric_engine_batch_size"));
}

#[tokio::test]
async fn serve_returns_after_graceful_shutdown() {
    let server = start().await;
    let (s, _) = call(server.addr, "GET", "/health", "").await;
    assert_eq!(s, 200);
    server
        .shutdown
        .send(())
        .expect("server listening for shutdown");
    let result = tokio::time::timeout(Duration::from_secs(10), server.task)
        .await
        .expect("serve returns in time")
        .expect("serve task did not panic");
    assert!(result.is_ok(), "{result:?}");
    assert!(tokio::net::TcpStream::connect(server.addr).await.is_err());
}
