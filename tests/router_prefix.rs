//! `kvfabric router --policy prefix` over real processes: three `kvfabric
//! engine`s (the reference model), each with its own embedded node (no
//! cluster: a block one engine computed is on its node only), and the
//! router following the nodes' KV events (`--engine-nodes`).
//!
//! - Requests sharing a long prefix with an earlier one go to the engine
//!   whose node holds it (their `cached_tokens` say so; least-loaded would
//!   rotate them onto engines that hold nothing), and their outputs equal
//!   the same request sent straight to an engine.
//! - `POST /v1/kvfabric/keys/...` names exactly the blocks the engine saves:
//!   the prompt's full blocks, all present on its node after the request
//!   (chat and completions), keyed under the request's `cache_salt`; a bad
//!   body gets the completion endpoint's own 400.
//!
//! The scripted-engine side (RESYNC, lost streams, failed keys calls, dead
//! nodes) is `router/tests/prefix.rs`.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use kvfabric_node::cluster::client;
use kvfabric_store::BlockKey;
use kvfabric_testkit::free_port;
use kvfabric_testkit::procs::{
    http, kvfabric_command, log_tail, metric, node, EngineOptions, EngineProc,
};
use serde_json::{json, Value};

const MODEL: &str = "smollm2";

fn keys_of(v: &Value) -> Vec<BlockKey> {
    v["block_keys"]
        .as_array()
        .unwrap_or_else(|| panic!("no block_keys: {v}"))
        .iter()
        .map(|k| {
            let hex = k.as_str().expect("hex");
            let bytes: Vec<u8> = (0..32)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
                .collect();
            BlockKey::from_slice(&bytes).expect("32 bytes")
        })
        .collect()
}

/// Which of `keys` the node at `grpc` holds.
fn on_node(grpc: &str, keys: &[BlockKey]) -> Vec<bool> {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut c = client::connect(grpc, Duration::from_secs(5))
            .await
            .expect("connect to the engine's node");
        node::exists(&mut c, keys).await
    })
}

/// A `kvfabric router` child process; killed on drop.
struct RouterProc {
    addr: String,
    log: std::path::PathBuf,
    child: Child,
}

impl Drop for RouterProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_router(dir: &std::path::Path, args: &[String]) -> RouterProc {
    let addr = format!("127.0.0.1:{}", free_port());
    let log = dir.join("router.log");
    let child = kvfabric_command("info")
        .args(["router", "--listen", &addr])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).expect("log")))
        .spawn()
        .expect("start kvfabric router");
    let deadline = Instant::now() + Duration::from_secs(20);
    while http(&addr, "GET", "/health", None).map(|r| r.0) != Ok(200) {
        assert!(
            Instant::now() < deadline,
            "router never healthy:\n{}",
            log_tail(&log)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    RouterProc { addr, log, child }
}

fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    http(addr, "POST", path, Some(body)).unwrap_or_else(|e| panic!("{addr}{path}: {e}"))
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Three engines with their own nodes (engine, node gRPC address) and a
/// prefix router following their KV event streams.
fn prefix_fleet(dir: &std::path::Path) -> (Vec<(EngineProc, String)>, RouterProc) {
    let engines: Vec<_> = ["pa", "pb", "pc"]
        .iter()
        .map(|name| {
            let grpc = format!("127.0.0.1:{}", free_port());
            let e = EngineOptions::new(name, dir)
                .memory("64MiB", "64MiB")
                .grpc_listen(&grpc)
                .start();
            (e, grpc)
        })
        .collect();
    let urls: Vec<String> = engines
        .iter()
        .map(|(e, _)| format!("http://{}", e.addr))
        .collect();
    let nodes: Vec<String> = engines
        .iter()
        .zip(&urls)
        .map(|((_, grpc), url)| format!("{url}={grpc}"))
        .collect();
    let router = start_router(
        dir,
        &[
            "--engines".into(),
            urls.join(","),
            "--policy".into(),
            "prefix".into(),
            "--engine-nodes".into(),
            nodes.join(","),
        ],
    );
    wait_for("three KV event streams", || {
        metric(&router.addr, "kvfabric_router_kv_event_streams") == 3.0
    });
    (engines, router)
}

/// The router's prefix metrics after 4 prefix picks whose last 3 each
/// matched at least `blocks - 1` blocks, with no fallback.
fn assert_prefix_metrics(router: &str, blocks: u64) {
    assert_eq!(metric(router, "kvfabric_router_prefix_picks_total"), 4.0);
    assert!(
        metric(router, "kvfabric_router_prefix_matched_blocks_total") >= 3.0 * (blocks - 1) as f64
    );
    assert_eq!(
        metric(router, "kvfabric_router_prefix_fallbacks_total"),
        0.0
    );
}

#[test]
fn prefix_router_sends_a_shared_prefix_to_the_engine_that_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let (engines, router) = prefix_fleet(dir.path());
    let logs = || log_tail(&router.log);

    // About 600 tokens shared, then a different question each time.
    let system = "You are a careful assistant for a fabric of attention caches. ".repeat(50);
    let body = |q: &str| {
        json!({
            "model": MODEL,
            "prompt": format!("{system}Question: {q}\nAnswer:"),
            "max_tokens": 6,
            "temperature": 0,
        })
    };
    let (status, first) = post(&router.addr, "/v1/completions", &body("rivers"));
    assert_eq!(status, 200, "{first}\n{}", logs());
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().expect("usage");
    let blocks = prompt_tokens / 64;
    assert!(blocks >= 8, "prompt of {prompt_tokens} tokens");
    wait_for("the first prompt's blocks indexed", || {
        metric(&router.addr, "kvfabric_router_kv_events_total") >= blocks as f64
    });
    let mut answers = Vec::new();
    for q in ["compilers", "bread", "tides"] {
        let (status, v) = post(&router.addr, "/v1/completions", &body(q));
        assert_eq!(status, 200, "{v}\n{}", logs());
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        // Everything before the question: (blocks - 1) whole blocks at least.
        assert!(
            cached >= (blocks - 1) * 64,
            "{q}: {cached} of {prompt_tokens} prompt tokens cached\n{}",
            logs()
        );
        answers.push((
            q,
            v["choices"][0]["text"].as_str().expect("text").to_owned(),
        ));
    }
    // All four on one engine: the one holding the prefix.
    let served: Vec<f64> = engines
        .iter()
        .map(|(e, _)| metric(&e.addr, "kvfabric_engine_requests_total"))
        .collect();
    assert_eq!(
        served.iter().filter(|&&n| n == 4.0).count(),
        1,
        "{served:?}"
    );
    assert_prefix_metrics(&router.addr, blocks);
    // The outputs are what an engine answers directly (one that held nothing).
    let cold = served
        .iter()
        .position(|&n| n == 0.0)
        .expect("an idle engine");
    for (q, routed) in answers {
        let (status, v) = post(&engines[cold].0.addr, "/v1/completions", &body(q));
        assert_eq!(status, 200, "{v}");
        assert_eq!(
            v["choices"][0]["text"].as_str(),
            Some(routed.as_str()),
            "{q}"
        );
    }
}

#[test]
fn keys_endpoint_names_the_blocks_the_engine_saves() {
    let dir = tempfile::tempdir().unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let engine = EngineOptions::new("keys", dir.path())
        .memory("64MiB", "64MiB")
        .grpc_listen(&grpc)
        .start();
    let addr = engine.addr.clone();
    let text = "Keys name blocks; blocks hold attention. ".repeat(50);
    let completion = json!({"model": MODEL, "prompt": text, "max_tokens": 2, "temperature": 0});
    let chat = json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": text}, {"role": "user", "content": "Why?"}],
        "max_tokens": 2,
        "temperature": 0,
    });
    for (api, body) in [("completions", &completion), ("chat/completions", &chat)] {
        let (status, k) = post(&addr, &format!("/v1/kvfabric/keys/{api}"), body);
        assert_eq!(status, 200, "{k}\n{}", engine.log());
        assert_eq!(k["block_tokens"], 64, "{k}");
        let keys = keys_of(&k);
        // A cache_salt keys the same prompt differently.
        let mut salted = body.clone();
        salted["cache_salt"] = json!("tenant-x");
        let (_, s) = post(&addr, &format!("/v1/kvfabric/keys/{api}"), &salted);
        let salted_keys = keys_of(&s);
        assert_eq!(salted_keys.len(), keys.len());
        assert!(salted_keys.iter().all(|k| !keys.contains(k)), "{api}");

        assert!(
            on_node(&grpc, &keys).iter().all(|p| !p),
            "{api}: nothing saved yet"
        );
        let (status, v) = post(&addr, &format!("/v1/{api}"), body);
        assert_eq!(status, 200, "{v}");
        let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().expect("usage");
        assert_eq!(k["prompt_tokens"].as_u64(), Some(prompt_tokens), "{api}");
        assert_eq!(keys.len() as u64, prompt_tokens / 64, "{api}: full blocks");
        assert!(keys.len() >= 4, "{api}: {prompt_tokens} tokens");
        wait_for("the saves land on the node", || {
            on_node(&grpc, &keys).iter().all(|p| *p)
        });
        assert!(
            on_node(&grpc, &salted_keys).iter().all(|p| !p),
            "{api}: the salted keys name blocks nobody saved"
        );
    }
    // A bad body: the completion endpoint's own 400, word for word.
    for (api, bad) in [
        (
            "chat/completions",
            json!({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}),
        ),
        (
            "completions",
            json!({"model": MODEL, "prompt": "hi", "n": 99}),
        ),
        ("completions", json!({"model": MODEL})),
    ] {
        let real = post(&addr, &format!("/v1/{api}"), &bad);
        let keys = post(&addr, &format!("/v1/kvfabric/keys/{api}"), &bad);
        assert_eq!(real.0, 400, "{}", real.1);
        assert_eq!(keys, real, "{api}: {bad}");
    }
}
