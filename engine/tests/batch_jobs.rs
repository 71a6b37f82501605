//! The batch API's job lifecycle, against the scripted scheduler stand-in
//! (`SLOW` in a prompt: a token every 10 ms until cancelled): a batch past
//! its completion window ends `expired` with its finished results and the
//! rest in its error file; a cancel stops the requests already running and
//! the batch ends `cancelled` with partial output; a batch is invisible to
//! and not cancellable by another tenant (404), and resumes after a restart
//! as the tenant that created it.

use kvfabric_testkit::engine::http as http_support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use http_support::{stand_in, tokenizer, Seen, MODEL, SMOLLM2_TEMPLATE};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use kvfabric_engine::batch::{BatchConfig, BatchService, BatchStore, Catalog, MemoryBatchStore};
use kvfabric_engine::chat::ChatTemplate;
use kvfabric_engine::http::{EngineMetrics, HttpState};
use kvfabric_engine::EngineHandle;
use kvfabric_tenants::KeyHash;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

/// An engine API with the batch runner, over the stand-in.
struct Batched {
    addr: SocketAddr,
    seen: mpsc::UnboundedReceiver<Seen>,
    shutdown: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), kvfabric_engine::EngineError>>,
    runner: tokio::task::JoinHandle<()>,
}

impl Batched {
    /// Stop as a killed process would: the runner mid-batch, then the server.
    async fn stop(self) {
        self.runner.abort();
        let _ = self.runner.await;
        let _ = self.shutdown.send(());
        let _ = self.task.await;
    }
}

async fn start(store: Arc<dyn BatchStore>, tenants: Option<&Path>, cfg: BatchConfig) -> Batched {
    let tokenizer = Arc::new(tokenizer());
    let template = Arc::new(
        ChatTemplate::new(SMOLLM2_TEMPLATE, "<|im_start|>", "<|im_end|>").expect("template"),
    );
    let metrics = EngineMetrics::new();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let gate = kvfabric_tenants::TenantGate::from_config(tenants, Default::default(), "test")
        .expect("tenants file");
    let (submit, intake) = mpsc::channel(16);
    let (seen_tx, seen) = mpsc::unbounded_channel();
    tokio::spawn(stand_in(
        tokenizer.clone(),
        intake,
        seen_tx,
        metrics.clone(),
    ));
    let state = HttpState::new(
        EngineHandle::new(submit),
        tokenizer,
        template,
        MODEL,
        http_support::CONTEXT,
        metrics,
        Arc::new(registry),
    )
    .with_tenants(gate);
    let (service, runner) = BatchService::start(Catalog::new(store), cfg, state.clone());
    let (addr, shutdown, task) =
        kvfabric_testkit::engine::serve_on_loopback(state.with_batches(service)).await;
    Batched {
        addr,
        seen,
        shutdown,
        task,
        runner,
    }
}

/// One request; `key` as a bearer token. The status and body bytes.
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    key: Option<&str>,
) -> (u16, Vec<u8>) {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .header("content-type", content_type);
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let req = req.body(Full::new(Bytes::from(body))).expect("request");
    let resp = sender.send_request(req).await.expect("response");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, bytes.to_vec())
}

async fn json_call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<Value>,
    key: Option<&str>,
) -> (u16, Value) {
    let body = body.map_or_else(Vec::new, |b| b.to_string().into_bytes());
    let (status, out) = request(addr, method, path, "application/json", body, key).await;
    let v = serde_json::from_slice(&out)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out)));
    (status, v)
}

/// A chat line; `SLOW` prompts stream until cancelled or `max_tokens`.
fn line(custom_id: &str, prompt: &str, max_tokens: usize) -> Value {
    json!({
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
        },
    })
}

/// Upload `lines` and create a batch over them; the batch.
async fn submit(addr: SocketAddr, lines: &[Value], key: Option<&str>) -> Value {
    let jsonl: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let boundary = "kvfabricBoundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{jsonl}\r\n--{boundary}--\r\n"
    );
    let ct = format!("multipart/form-data; boundary={boundary}");
    let (status, out) = request(addr, "POST", "/v1/files", &ct, body.into_bytes(), key).await;
    let file: Value = serde_json::from_slice(&out).expect("file json");
    assert_eq!(status, 200, "{file}");
    let create = json!({
        "input_file_id": file["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    });
    let (status, b) = json_call(addr, "POST", "/v1/batches", Some(create), key).await;
    assert_eq!(status, 200, "{b}");
    b
}

/// Poll batch `id` until `done` holds (panics after `secs`).
async fn wait_for(
    addr: SocketAddr,
    id: &str,
    key: Option<&str>,
    secs: u64,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let (status, b) = json_call(addr, "GET", &format!("/v1/batches/{id}"), None, key).await;
        assert_eq!(status, 200, "{b}");
        if done(&b) {
            return b;
        }
        assert!(Instant::now() < deadline, "batch stuck: {b}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The lines of file `id` (none when the id is null).
async fn lines_of(addr: SocketAddr, id: &Value, key: Option<&str>) -> Vec<Value> {
    let Some(id) = id.as_str() else {
        return Vec::new();
    };
    let path = format!("/v1/files/{id}/content");
    let (status, out) = request(addr, "GET", &path, "text/plain", Vec::new(), key).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&out));
    String::from_utf8(out)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("jsonl line"))
        .collect()
}

fn custom_ids(lines: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> = lines
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    ids.sort();
    ids
}

/// The stand-in's reports of `n` requests (each once it ended).
async fn seen(server: &mut Batched, n: usize) -> Vec<Seen> {
    let mut out = Vec::new();
    for _ in 0..n {
        let s = tokio::time::timeout(Duration::from_secs(10), server.seen.recv())
            .await
            .expect("stand-in reports in time")
            .expect("stand-in alive");
        out.push(s);
    }
    out
}

fn config(window_secs: u64) -> BatchConfig {
    BatchConfig {
        max_seqs: 1, // two lines at a time
        completion_window_secs: window_secs,
        ..BatchConfig::default()
    }
}

#[tokio::test]
async fn a_batch_past_its_window_expires_keeping_its_finished_results() {
    let store: Arc<dyn BatchStore> = Arc::new(MemoryBatchStore::default());
    let mut s = start(store, None, config(2)).await;
    // Two quick lines, then four that would stream for 15 s each.
    let mut lines = vec![line("quick-0", "hi", 8), line("quick-1", "hello", 8)];
    lines.extend((0..4).map(|i| line(&format!("slow-{i}"), "SLOW", 1500)));
    let b = submit(s.addr, &lines, None).await;
    let id = b["id"].as_str().expect("id");
    let created = b["created_at"].as_u64().expect("created_at");
    assert_eq!(b["expires_at"].as_u64(), Some(created + 2), "{b}");
    let b = wait_for(s.addr, id, None, 10, |b| b["status"] == "expired").await;
    assert!(b["expired_at"].as_u64().is_some(), "{b}");
    assert_eq!(
        b["request_counts"],
        json!({"total": 6, "completed": 2, "failed": 4})
    );
    let out = lines_of(s.addr, &b["output_file_id"], None).await;
    assert_eq!(custom_ids(&out), ["quick-0", "quick-1"]);
    assert!(
        out.iter().all(|l| l["response"]["status_code"] == 200),
        "{out:?}"
    );
    let err = lines_of(s.addr, &b["error_file_id"], None).await;
    assert_eq!(custom_ids(&err), ["slow-0", "slow-1", "slow-2", "slow-3"]);
    assert!(
        err.iter().all(|l| l["error"]["code"] == "batch_expired"),
        "{err:?}"
    );
    // The two slow lines that were running were stopped, not left to run.
    let reports = seen(&mut s, 4).await;
    let stopped: Vec<_> = reports.iter().filter_map(|r| r.cancelled_after).collect();
    assert_eq!(
        stopped.len(),
        2,
        "running lines stopped at expiry: {stopped:?}"
    );
    assert!(stopped.iter().all(|&n| n < 1500), "{stopped:?}");
    s.stop().await;
}

#[tokio::test]
async fn cancel_stops_the_running_requests_and_keeps_partial_output() {
    let store: Arc<dyn BatchStore> = Arc::new(MemoryBatchStore::default());
    let mut s = start(store, None, config(24 * 3600)).await;
    let mut lines = vec![line("quick-0", "hi", 8)];
    lines.extend((0..3).map(|i| line(&format!("slow-{i}"), "SLOW", 1500)));
    let b = submit(s.addr, &lines, None).await;
    let id = b["id"].as_str().expect("id");
    wait_for(s.addr, id, None, 10, |b| {
        b["request_counts"]["completed"] == 1
    })
    .await;
    // Let the slow lines run a little (two at a time), then cancel.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, c) = json_call(
        s.addr,
        "POST",
        &format!("/v1/batches/{id}/cancel"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200, "{c}");
    assert!(
        c["status"] == "cancelling" || c["status"] == "cancelled",
        "{c}"
    );
    // A slow line would run 15 s: the batch ends well before that.
    let b = wait_for(s.addr, id, None, 3, |b| b["status"] == "cancelled").await;
    assert!(b["cancelled_at"].as_u64().is_some(), "{b}");
    let out = lines_of(s.addr, &b["output_file_id"], None).await;
    assert_eq!(custom_ids(&out), ["quick-0"]);
    assert_eq!(b["request_counts"]["completed"], 1, "{b}");
    let reports = seen(&mut s, 3).await;
    let stopped: Vec<usize> = reports.iter().filter_map(|r| r.cancelled_after).collect();
    assert_eq!(stopped.len(), 2, "both running lines stopped: {stopped:?}");
    assert!(stopped.iter().all(|&n| n > 0 && n < 1500), "{stopped:?}");
    s.stop().await;
}

fn tenants_file(path: &Path) {
    let text = format!(
        "[[tenants]]\nname = \"a\"\napi_keys = [\"{}\"]\n[[tenants]]\nname = \"b\"\napi_keys = [\"{}\"]\n",
        KeyHash::of("key-a"),
        KeyHash::of("key-b"),
    );
    std::fs::write(path, text).expect("write tenants file");
}

/// Tenant b sees nothing of batch `id`: 404 on get, cancel and its input
/// file, and not in its list.
async fn invisible_to_b(addr: SocketAddr, id: &str, input: &str) {
    let b = Some("key-b");
    let (status, v) = json_call(addr, "GET", &format!("/v1/batches/{id}"), None, b).await;
    assert_eq!(status, 404, "{v}");
    let (status, v) = json_call(addr, "POST", &format!("/v1/batches/{id}/cancel"), None, b).await;
    assert_eq!(status, 404, "{v}");
    let (status, v) = json_call(addr, "GET", &format!("/v1/files/{input}"), None, b).await;
    assert_eq!(status, 404, "{v}");
    let (status, v) = json_call(addr, "GET", "/v1/batches", None, b).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"], json!([]), "{v}");
}

#[tokio::test]
async fn a_batch_is_its_tenants_alone_and_resumes_as_it_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tenants = dir.path().join("tenants.toml");
    tenants_file(&tenants);
    // One store for both processes, as the RocksDB directory would be.
    let store: Arc<dyn BatchStore> = Arc::new(MemoryBatchStore::default());
    let a = Some("key-a");
    let s = start(store.clone(), Some(&tenants), config(24 * 3600)).await;
    let lines: Vec<Value> = (0..6)
        .map(|i| line(&format!("r-{i}"), "SLOW", 20))
        .collect();
    let b = submit(s.addr, &lines, a).await;
    let id = b["id"].as_str().expect("id").to_owned();
    let input = b["input_file_id"].as_str().expect("input").to_owned();
    invisible_to_b(s.addr, &id, &input).await;
    wait_for(s.addr, &id, a, 10, |b| {
        b["request_counts"]["completed"].as_u64() >= Some(1)
    })
    .await;
    s.stop().await;

    let s = start(store, Some(&tenants), config(24 * 3600)).await;
    invisible_to_b(s.addr, &id, &input).await;
    let b = wait_for(s.addr, &id, a, 10, |b| {
        !matches!(b["status"].as_str(), Some("in_progress" | "validating"))
    })
    .await;
    assert_eq!(b["status"], "completed", "{b}");
    assert_eq!(
        b["request_counts"],
        json!({"total": 6, "completed": 6, "failed": 0})
    );
    let out = lines_of(s.addr, &b["output_file_id"], a).await;
    assert_eq!(
        custom_ids(&out),
        (0..6).map(|i| format!("r-{i}")).collect::<Vec<_>>()
    );
    // Tenant b cannot read the output either.
    let out_id = b["output_file_id"].as_str().expect("output");
    let path = format!("/v1/files/{out_id}/content");
    let (status, _) = request(
        s.addr,
        "GET",
        &path,
        "text/plain",
        Vec::new(),
        Some("key-b"),
    )
    .await;
    assert_eq!(status, 404);
    s.stop().await;
}
