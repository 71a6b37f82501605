//! The router in front of real engines (reference model, in-process,
//! loopback): plain mode, the disaggregated two hops, prefill fallback, and
//! bad bodies that never reach an engine.
//!
//! Greedy decoding is deterministic and the kernels are batch-invariant, so
//! a routed answer must be the exact text a colocated engine gives.

use kvfabric_engine::Role;
use kvfabric_testkit::router::*;
use serde_json::{json, Value};

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "1, 2, 3, 4,",
    "Once upon a time, a small robot",
];
const MAX_TOKENS: u64 = 8;

fn completion(prompt: &str) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
}

fn streamed(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    body
}

fn chat(text: &str) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": text}],
           "max_completion_tokens": MAX_TOKENS, "temperature": 0})
}

/// (text, prompt_tokens, completion_tokens) of one request, streamed or not.
async fn generate(addr: std::net::SocketAddr, path: &str, body: &Value) -> (String, u64, u64, u64) {
    if body["stream"] == json!(true) {
        let (status, events) = post_stream(addr, path, body).await;
        assert_eq!(status, 200, "{events:?}");
        let (text, usage) = stream_text(&events);
        let usage = usage.expect("usage chunk");
        (
            text,
            usage["prompt_tokens"].as_u64().expect("prompt_tokens"),
            usage["completion_tokens"]
                .as_u64()
                .expect("completion_tokens"),
            usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .expect("cached"),
        )
    } else {
        let (status, v) = post_json(addr, path, body).await;
        assert_eq!(status, 200, "{v}");
        (
            answer_text(&v),
            v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens"),
            v["usage"]["completion_tokens"]
                .as_u64()
                .expect("completion_tokens"),
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .expect("cached"),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disaggregated_answers_match_a_colocated_engine() {
    let mut colocated = start_engine(Role::Both).await;
    let mut prefill = start_engine(Role::Prefill).await;
    let mut decode = start_engine(Role::Decode).await;
    let router = start_router(disaggregated(&[prefill.url()], &[decode.url()])).await;

    let mut bodies = Vec::new();
    for p in PROMPTS {
        bodies.push(("/v1/completions", completion(p)));
        bodies.push(("/v1/completions", streamed(completion(p))));
    }
    bodies.push(("/v1/chat/completions", chat(PROMPTS[0])));
    bodies.push(("/v1/chat/completions", streamed(chat(PROMPTS[0]))));

    for (path, body) in &bodies {
        let (want, want_prompt, want_completion, _) = generate(colocated.addr, path, body).await;
        let (got, got_prompt, got_completion, _) = generate(router.addr, path, body).await;
        assert!(!want.is_empty());
        assert_eq!(got, want, "{path} {body}");
        assert_eq!(
            (got_prompt, got_completion),
            (want_prompt, want_completion),
            "{body}"
        );
    }

    // Exactly one prefill request (of one token) per client request, and the
    // decode engine got the client's own max_tokens.
    let pre = prefill.received();
    assert_eq!(pre.len(), bodies.len(), "{pre:?}");
    assert!(pre.iter().all(|r| r.max_tokens == 1), "{pre:?}");
    let dec = decode.received();
    assert_eq!(dec.len(), bodies.len(), "{dec:?}");
    assert!(
        dec.iter().all(|r| r.max_tokens == MAX_TOKENS as usize),
        "{dec:?}"
    );
    for (p, d) in pre.iter().zip(&dec) {
        assert_eq!(p.prompt_tokens, d.prompt_tokens, "same prompt on both hops");
    }
    // The prefill engine generated one token per request.
    let generated = metric(prefill.addr, "kvfabric_engine_generation_tokens_total").await;
    assert_eq!(generated, bodies.len() as f64);
    let ok = metric(
        router.addr,
        r#"kvfabric_router_requests_total{mode="disaggregated""#,
    )
    .await;
    assert_eq!(ok, bodies.len() as f64);
    let fallbacks = metric(router.addr, "kvfabric_router_prefill_fallbacks_total").await;
    assert_eq!(fallbacks, 0.0);
    // Every reserved token was released.
    assert_eq!(
        metric(router.addr, "kvfabric_router_inflight_prefill_tokens").await,
        0.0
    );
    assert_eq!(
        metric(router.addr, "kvfabric_router_inflight_decode_tokens").await,
        0.0
    );

    router.shut_down().await;
    prefill.shut_down().await;
    decode.shut_down().await;
    colocated.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_prefill_engine_falls_back_to_decode() {
    let mut prefill = start_engine(Role::Prefill).await;
    let mut decode = start_engine(Role::Decode).await;
    let router = start_router(disaggregated(&[prefill.url()], &[decode.url()])).await;

    let body = completion(PROMPTS[0]);
    let (two_hop, ..) = generate(router.addr, "/v1/completions", &body).await;
    assert_eq!(prefill.received().len(), 1);

    prefill.shut_down().await;
    let (fallback, ..) = generate(router.addr, "/v1/completions", &body).await;
    assert_eq!(fallback, two_hop, "decode recomputed the prompt");
    let (streamed_fallback, ..) =
        generate(router.addr, "/v1/completions", &streamed(body.clone())).await;
    assert_eq!(streamed_fallback, two_hop);

    assert_eq!(decode.received().len(), 3);
    let fallbacks = metric(router.addr, "kvfabric_router_prefill_fallbacks_total").await;
    assert_eq!(fallbacks, 2.0);
    let errors = metric(
        router.addr,
        r#"kvfabric_router_upstream_errors_total{endpoint=""#,
    )
    .await;
    assert_eq!(errors, 2.0);
    let outcome = metric(
        router.addr,
        r#"kvfabric_router_requests_total{mode="disaggregated",route="/v1/completions",outcome="fallback"}"#,
    )
    .await;
    assert_eq!(outcome, 2.0);

    router.shut_down().await;
    decode.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_mode_spreads_requests_and_matches_one_engine() {
    let mut a = start_engine(Role::Both).await;
    let mut b = start_engine(Role::Both).await;
    let router = start_router(plain(&[a.url(), b.url()])).await;

    for p in PROMPTS {
        let body = completion(p);
        let (want, ..) = generate(a.addr, "/v1/completions", &body).await;
        let (got, ..) = generate(router.addr, "/v1/completions", &body).await;
        assert_eq!(got, want, "{p}");
        let (got, ..) = generate(router.addr, "/v1/completions", &streamed(body)).await;
        assert_eq!(got, want, "{p} streamed");
    }
    // 3 direct requests on a, 6 routed: idle engines alternate, so both got some.
    let (on_a, on_b) = (a.received().len(), b.received().len());
    assert_eq!(on_a + on_b, 9);
    assert!(on_b >= 1 && on_a > 3, "a {on_a}, b {on_b}");

    // Models are forwarded from an engine.
    let (status, _, bytes) =
        request(router.addr, hyper::Method::GET, "/v1/models", Vec::new()).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(v["data"][0]["id"], MODEL);

    router.shut_down().await;
    a.shut_down().await;
    b.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_are_400_json_and_reach_no_engine() {
    let mut prefill = start_engine(Role::Prefill).await;
    let mut decode = start_engine(Role::Decode).await;
    let router = start_router(disaggregated(&[prefill.url()], &[decode.url()])).await;

    let cases: [(&str, &[u8], Option<&str>); 5] = [
        ("/v1/completions", b"{not json", None),
        ("/v1/completions", b"[1,2]", None),
        ("/v1/completions", br#"{"prompt":"hi"}"#, Some("model")),
        ("/v1/completions", br#"{"model":"smollm2"}"#, Some("prompt")),
        (
            "/v1/chat/completions",
            br#"{"model":"smollm2","prompt":"hi"}"#,
            Some("messages"),
        ),
    ];
    for (path, body, param) in cases {
        let (status, ct, bytes) =
            request(router.addr, hyper::Method::POST, path, body.to_vec()).await;
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(body));
        assert!(ct.starts_with("application/json"), "{ct}");
        let v: Value = serde_json::from_slice(&bytes).expect("json error body");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        if let Some(param) = param {
            assert_eq!(v["error"]["param"], param, "{v}");
        }
    }
    // An engine's own 4xx (unknown model) comes back as is from the prefill hop.
    let (status, v) = post_json(
        router.addr,
        "/v1/completions",
        &json!({"model": "no-such-model", "prompt": "hi", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");

    assert!(prefill.received().is_empty());
    assert!(decode.received().is_empty());
    let client_errors = metric(
        router.addr,
        r#"kvfabric_router_requests_total{mode="disaggregated""#,
    )
    .await;
    assert_eq!(client_errors, 6.0);

    router.shut_down().await;
    prefill.shut_down().await;
    decode.shut_down().await;
}
