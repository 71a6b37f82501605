//! The console of an engine's embedded node plots the engine: one real
//! `kvfabric engine` (the reference model, `KVFABRIC_MODEL_PATH`) with its
//! embedded fabric node, history sampled every 300 ms; after two chat
//! requests with the same long prompt, `GET /api/v1/history` on the node's
//! HTTP port has TTFT p50/p90 points and a share of prompt tokens served from
//! cache above 0 (the second request reuses the first one's blocks).

use std::time::{Duration, Instant};

use kvfabric_testkit::free_port;
use kvfabric_testkit::procs::{get_json, get_ok, http, EngineOptions};
use serde_json::Value;

/// The non-null values of `series` in the first node of a history answer.
fn points(history: &Value, series: &str) -> Vec<f64> {
    history["nodes"][0]["values"][series]
        .as_array()
        .map(|v| v.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

#[test]
fn an_engines_console_plots_ttft_and_the_cached_prompt_share() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("console.toml");
    std::fs::write(&config, "[node]\nconsole_interval_ms = 300\n").unwrap();
    let node = format!("127.0.0.1:{}", free_port());
    let proc = EngineOptions::new("eng", dir.path())
        .config(&config)
        .memory("64MiB", "64MiB")
        .node_http(&node)
        .start();
    let engine = proc.addr.clone();
    let logs = || proc.log();
    // The page itself is served on the node's port too.
    let page = get_ok(&node, "/").expect("node http port");
    assert!(page.contains("<html"), "not the console page");

    // Well over two 64-token blocks, so the second request reuses whole blocks.
    let prompt = "The fabric keeps every attention block a node computed. ".repeat(30);
    for _ in 0..2 {
        let body = serde_json::json!({
            "model": "smollm2",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 2,
            "temperature": 0,
        });
        let (status, v) = http(&engine, "POST", "/v1/chat/completions", Some(&body)).unwrap();
        assert_eq!(status, 200, "{v}\n{}", logs());
    }

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let h = get_json(&node, "/api/v1/history").expect("history");
        let (p50, p90) = (points(&h, "ttft_p50_s"), points(&h, "ttft_p90_s"));
        let share = points(&h, "prompt_cached_share");
        let done = !p50.is_empty() && !p90.is_empty() && share.iter().any(|s| *s > 0.0);
        if done {
            assert!(p50.iter().chain(&p90).all(|s| *s > 0.0), "{p50:?} {p90:?}");
            assert!(share.iter().all(|s| (0.0..=1.0).contains(s)), "{share:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no engine points in the node's history: ttft p50 {p50:?} p90 {p90:?} share {share:?}\n{h}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
