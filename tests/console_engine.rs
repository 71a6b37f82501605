//! The console of an engine's embedded node plots the engine: one real
//! `kvfabric engine` (the reference model, `KVFABRIC_MODEL_PATH`) with its
//! embedded fabric node, history sampled every 300 ms; after two chat
//! requests with the same long prompt, `GET /api/v1/history` on the node's
//! HTTP port has TTFT p50/p90 points and a share of prompt tokens served from
//! cache above 0 (the second request reuses the first one's blocks).

mod engine_procs;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use engine_procs::{free_port, http, model_path, parse_response};
use serde_json::Value;

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get_json(addr: &str, path: &str) -> Result<Value, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let (status, body) = parse_response(&raw)?;
    if status != 200 {
        return Err(format!("{path}: HTTP {status}"));
    }
    serde_json::from_slice(body.trim_ascii()).map_err(|e| e.to_string())
}

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
    let engine = format!("127.0.0.1:{}", free_port());
    let node = format!("127.0.0.1:{}", free_port());
    let log = dir.path().join("engine.log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvfabric"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVFABRIC_") {
            cmd.env_remove(k);
        }
    }
    let child = cmd
        .arg("--config")
        .arg(&config)
        .arg("engine")
        .arg("--model")
        .arg(model_path())
        .args(["--listen", &engine, "--node-id", "eng", "--threads", "1"])
        .args(["--kv-pool", "64MiB", "--ram-capacity", "64MiB"])
        .args(["--grpc-listen", "127.0.0.1:0", "--http-listen", &node])
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .expect("start kvfabric engine");
    let _child = Kill(child);
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(http(&engine, "GET", "/health", None), Ok((200, _))) {
        assert!(
            Instant::now() < deadline,
            "engine never healthy:\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The page itself is served on the node's port too.
    let mut s = TcpStream::connect(&node).expect("node http port");
    let req = format!("GET / HTTP/1.1\r\nHost: {node}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let (status, page) = parse_response(&raw).unwrap();
    assert_eq!(status, 200);
    assert!(
        String::from_utf8_lossy(&page).contains("<html"),
        "not the console page"
    );

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
