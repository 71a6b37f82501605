//! `kvfabric bench batch`: what a running batch job costs interactive
//! requests. One engine (the reference model, in this process, over
//! HTTP on loopback) is measured twice in the same run: interactive TTFT
//! with no batch job (the peer), then with a `--requests`-line batch job
//! running (`/v1/files` + `/v1/batches`, batch class below interactive).
//! TTFT is the latency of a `max_tokens: 1` chat request (prefill plus
//! the first token), sent one at a time `--gap-ms` apart, each prompt new
//! (no prefix-cache hit from the other phase). Then the batch job is
//! waited for: its duration and request counts are reported (it must
//! complete). Run it under `chrt -f 10` (shared, noisy machine).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};

/// Arguments of `kvfabric bench batch`.
#[derive(clap::Args, Debug, Clone)]
pub struct BatchArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// GGUF model (default: the fetched SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Kernel threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Lines of the batch job.
    #[arg(long, default_value_t = 500)]
    pub requests: usize,
    /// max_tokens of each batch line.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: usize,
    /// Interactive requests measured per phase.
    #[arg(long, default_value_t = 20)]
    pub interactive: usize,
    /// Pause between interactive requests, ms.
    #[arg(long, default_value_t = 100)]
    pub gap_ms: u64,
    /// `[engine.batch] max_seqs`: batch sequences running at once.
    #[arg(long, default_value_t = 4)]
    pub batch_seqs: usize,
}

const SYSTEM: &str = "You are a support assistant for a company that runs GPU clusters. \
Answer in two sentences at most. Name the resource that limits the answer first, then \
the simplest fix. Do not invent numbers. ";

/// Run the bench and print its report.
pub fn run(a: &BatchArgs) -> anyhow::Result<()> {
    let model = crate::model_file(&a.model)?;
    let (json, a) = (a.json, a.clone());
    let report = crate::on_own_runtime(move |rt| measure(rt, &a, model))?;
    crate::print_report(json, &report, |r| {
        println!(
            "interactive TTFT p50, no batch job:   {:.1} ms",
            r["ttft_p50_idle_ms"].as_f64().unwrap_or(0.0)
        );
        println!(
            "interactive TTFT p50, batch job runs: {:.1} ms",
            r["ttft_p50_batch_ms"].as_f64().unwrap_or(0.0)
        );
        println!(
            "ratio (target <= 1.2):                {:.2}",
            r["ttft_p50_ratio"].as_f64().unwrap_or(0.0)
        );
        println!(
            "batch job: {} requests, {} completed in {:.1} s",
            r["batch_requests"],
            r["batch_completed"],
            r["batch_duration_s"].as_f64().unwrap_or(0.0)
        );
    })
}

fn measure(rt: &tokio::runtime::Runtime, a: &BatchArgs, model: PathBuf) -> anyhow::Result<Value> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut cfg = kvfabric_engine::EngineConfig {
        threads: a.threads,
        listen: addr.parse()?,
        ..kvfabric_engine::EngineConfig::default()
    };
    cfg.batch.max_seqs = a.batch_seqs;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(async move {
        kvfabric_engine::EngineBuilder::new(cfg)
            .serve(&model, async move {
                let _ = stopped.await;
            })
            .await
    });
    wait_healthy(&addr)?;
    // Warm up (first touches of the weights), not measured.
    ttfts(&addr, "warm", 2, 0)?;
    let idle = ttfts(&addr, "idle", a.interactive, a.gap_ms)?;

    let lines: Vec<String> = (0..a.requests)
        .map(|i| {
            json!({"custom_id": format!("r{i}"), "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "smollm2", "max_tokens": a.max_tokens, "temperature": 0,
                    "messages": [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": format!("Ticket {i}: node {} is slow, why?", i % 13)}]}})
            .to_string()
        })
        .collect();
    let file = upload(&addr, &lines.join("\n"))?;
    let started = Instant::now();
    let b = call(
        &addr,
        "POST",
        "/v1/batches",
        Some(
            &json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
        ),
    )?;
    let id = b["id"]
        .as_str()
        .ok_or_else(|| anyhow!("no batch id: {b}"))?
        .to_string();
    // Measure once batch work is running.
    wait_batch(&addr, &id, |b| {
        b["request_counts"]["completed"].as_u64() >= Some(1)
    })?;
    let loaded = ttfts(&addr, "load", a.interactive, a.gap_ms)?;
    let during = call(&addr, "GET", &format!("/v1/batches/{id}"), None)?;
    let still_running = during["status"] == "in_progress";
    let done = wait_batch(&addr, &id, |b| {
        !matches!(
            b["status"].as_str(),
            Some("validating" | "in_progress" | "finalizing")
        )
    })?;
    let duration = started.elapsed().as_secs_f64();
    let yields = metric(&addr, "kvfabric_engine_batch_yields_total")?;
    let _ = stop.send(());
    rt.block_on(server)
        .map_err(|e| anyhow!("engine task: {e}"))?
        .map_err(|e| anyhow!("engine: {e}"))?;
    let (p_idle, p_load) = (p50(&idle), p50(&loaded));
    Ok(json!({
        "bench": "batch",
        "ttft_method": "latency of a max_tokens=1 chat request",
        "interactive_requests": a.interactive,
        "gap_ms": a.gap_ms,
        "ttft_p50_idle_ms": p_idle,
        "ttft_p50_batch_ms": p_load,
        "ttft_p50_ratio": p_load / p_idle,
        "batch_running_while_measured": still_running,
        "batch_requests": a.requests,
        "batch_max_tokens": a.max_tokens,
        "batch_seqs": a.batch_seqs,
        "batch_status": done["status"],
        "batch_completed": done["request_counts"]["completed"],
        "batch_failed": done["request_counts"]["failed"],
        "batch_duration_s": duration,
        "batch_yields": yields,
    }))
}

fn p50(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `n` max_tokens=1 chat requests, one at a time: their latencies in ms.
fn ttfts(addr: &str, tag: &str, n: usize, gap_ms: u64) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let body = json!({"model": "smollm2", "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "user", "content": format!("{tag} {i}: summarize why a prefix cache lowers the time to first token for agents that resend long histories")}]});
        let t = Instant::now();
        let v = call(addr, "POST", "/v1/chat/completions", Some(&body))?;
        out.push(t.elapsed().as_secs_f64() * 1e3);
        if v.get("choices").is_none() {
            bail!("interactive request failed: {v}");
        }
        std::thread::sleep(Duration::from_millis(gap_ms));
    }
    Ok(out)
}

fn wait_healthy(addr: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if call(addr, "GET", "/health", None).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("the engine never became healthy")
}

fn wait_batch(addr: &str, id: &str, done: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        let b = call(addr, "GET", &format!("/v1/batches/{id}"), None)?;
        if done(&b) {
            return Ok(b);
        }
        if Instant::now() > deadline {
            bail!("batch stuck: {b}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn metric(addr: &str, name: &str) -> anyhow::Result<f64> {
    let (_, body) = raw(addr, "GET", "/metrics", "text/plain", b"")?;
    Ok(String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

fn upload(addr: &str, jsonl: &str) -> anyhow::Result<String> {
    let b = "kvfabricbench0b4";
    let body = format!("--{b}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"bench.jsonl\"\r\n\r\n{jsonl}\r\n--{b}--\r\n");
    let (status, out) = raw(
        addr,
        "POST",
        "/v1/files",
        &format!("multipart/form-data; boundary={b}"),
        body.as_bytes(),
    )?;
    let v: Value = serde_json::from_slice(&out)?;
    anyhow::ensure!(status == 200, "upload: {v}");
    Ok(v["id"]
        .as_str()
        .ok_or_else(|| anyhow!("no file id: {v}"))?
        .to_string())
}

fn call(addr: &str, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
    let payload = body.map(Value::to_string).unwrap_or_default();
    let (status, out) = raw(addr, method, path, "application/json", payload.as_bytes())?;
    let v: Value =
        serde_json::from_slice(&out).with_context(|| format!("{method} {path}: {status}"))?;
    Ok(v)
}

/// One HTTP/1.1 request with `Connection: close`: (status, body).
fn raw(
    addr: &str,
    method: &str,
    path: &str,
    ctype: &str,
    body: &[u8],
) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(600)))?;
    let head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("no header end"))?;
    let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("bad status line"))?;
    let body = &out[end + 4..];
    if head.contains("transfer-encoding: chunked") {
        let body = crate::soak::client::dechunk(body).map_err(|e| anyhow!(e))?;
        return Ok((status, body));
    }
    Ok((status, body.to_vec()))
}
