//! The async batch API on real `kvfabric engine` processes with the
//! reference model and a RocksDB job store (`[engine.batch] dir`):
//! - a 50-request batch (greedy and seeded chat requests over a shared long
//!   prefix) survives a SIGKILL mid-batch: the restarted engine resumes it,
//!   runs only the requests without a stored result, and every one of the
//!   50 results equals the same request sent interactively;
//! - bad inputs: an unknown file id is a 404, a wrong endpoint a 400, bad
//!   JSONL lines and a bad request body go to the error file while the good
//!   lines complete, and a cancelled batch ends `cancelled`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use kvfabric_testkit::procs::*;
use serde_json::{json, Value};

const SYSTEM: &str = "You are a careful assistant for a team of engineers who run a \
cluster of inference servers. Answer in one or two short sentences, plainly, without \
lists. When a question is about capacity, name the limiting resource first; when it \
is about latency, name the stage that dominates; when it is about cost, compare \
against the simplest alternative. Never invent numbers you were not given. ";

/// A config file that keeps batch jobs in `dir/batches`.
fn config(dir: &Path, max_seqs: usize) -> String {
    let path = dir.join("engine.toml");
    let store = dir.join("batches");
    std::fs::write(
        &path,
        format!(
            "[engine.batch]\ndir = \"{}\"\nmax_seqs = {max_seqs}\n",
            store.display()
        ),
    )
    .expect("config");
    path.display().to_string()
}

fn start(name: &str, dir: &Path, config: &str) -> EngineProc {
    let extra = [
        "--config",
        config,
        "--fabric",
        "off",
        "--block-tokens",
        "16",
    ];
    EngineProc::start(name, dir, &extra.map(String::from))
}

/// One raw request: (status, body bytes).
fn raw(addr: &str, method: &str, path: &str, content_type: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write");
    s.write_all(body).expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("read");
    parse_response(&out).expect("response")
}

/// `POST /v1/files` (multipart, purpose=batch): the file id.
fn upload(addr: &str, jsonl: &str) -> String {
    let b = "kvfabricboundary7d3f";
    let body = format!(
        "--{b}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n{jsonl}\r\n--{b}--\r\n"
    );
    let (status, out) = raw(
        addr,
        "POST",
        "/v1/files",
        &format!("multipart/form-data; boundary={b}"),
        body.as_bytes(),
    );
    let v: Value = serde_json::from_slice(&out).expect("json");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["bytes"], jsonl.len() as u64, "{v}");
    v["id"].as_str().expect("id").to_string()
}

/// The lines of file `id`'s content.
fn content(addr: &str, id: &str) -> Vec<Value> {
    let (status, out) = raw(
        addr,
        "GET",
        &format!("/v1/files/{id}/content"),
        "text/plain",
        b"",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&out));
    String::from_utf8(out)
        .expect("utf8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("jsonl line"))
        .collect()
}

fn create_batch(addr: &str, file: &str) -> Value {
    let body = json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h"});
    let (status, v) = http(addr, "POST", "/v1/batches", Some(&body)).expect("create");
    assert_eq!(status, 200, "{v}");
    v
}

fn batch(addr: &str, id: &str) -> Value {
    let (status, v) = http(addr, "GET", &format!("/v1/batches/{id}"), None).expect("get");
    assert_eq!(status, 200, "{v}");
    v
}

/// Poll batch `id` until `done` holds (panics after `secs`).
fn wait_for(e: &EngineProc, id: &str, secs: u64, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let b = batch(&e.addr, id);
        if done(&b) {
            return b;
        }
        assert!(Instant::now() < deadline, "batch stuck: {b}\n{}", e.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// 50 chat requests: even ones greedy, odd ones seeded at temperature 0.9.
fn requests() -> Vec<Value> {
    (0..50)
        .map(|i| {
            let mut body = json!({
                "model": "smollm2",
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": format!("Question {i}: why would node {} run out of KV blocks first?", i % 7)},
                ],
                "max_tokens": 24,
                "temperature": 0,
            });
            if i % 2 == 1 {
                body["temperature"] = json!(0.9);
                body["seed"] = json!(1000 + i);
            }
            json!({"custom_id": format!("req-{i}"), "method": "POST", "url": "/v1/chat/completions", "body": body})
        })
        .collect()
}

fn jsonl(lines: &[Value]) -> String {
    lines
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_batch_survives_a_sigkill_and_every_result_equals_the_interactive_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), 4);
    let reqs = requests();
    let mut e1 = start("b1", dir.path(), &cfg);
    let file = upload(&e1.addr, &jsonl(&reqs));
    let id = create_batch(&e1.addr, &file)["id"]
        .as_str()
        .expect("id")
        .to_string();
    // Kill it once some, not all, results are stored.
    let before = wait_for(&e1, &id, 600, |b| {
        b["request_counts"]["completed"].as_u64() >= Some(5)
    });
    let done_before = before["request_counts"]["completed"].as_u64().unwrap_or(0);
    e1.kill();
    assert!(
        done_before < 50,
        "the batch ended before the kill: {before}"
    );

    let e2 = start("b2", dir.path(), &cfg);
    let b = wait_for(&e2, &id, 900, |b| b["status"] == "completed");
    assert_eq!(
        b["request_counts"],
        json!({"total": 50, "completed": 50, "failed": 0}),
        "{b}"
    );
    assert!(b["error_file_id"].is_null(), "{b}");
    // Only the requests without a stored result ran again.
    let rerun = metric(&e2.addr, "kvfabric_engine_requests_total");
    assert!(
        rerun > 0.0 && rerun <= (50 - done_before) as f64,
        "reran {rerun} of {}",
        50 - done_before
    );

    let out = content(&e2.addr, b["output_file_id"].as_str().expect("output file"));
    assert_eq!(out.len(), 50);
    let mut seen = std::collections::HashSet::new();
    for line in &out {
        let cid = line["custom_id"].as_str().expect("custom_id");
        assert!(seen.insert(cid.to_string()), "{cid} twice");
        let i: usize = cid.trim_start_matches("req-").parse().expect("index");
        assert_eq!(line["response"]["status_code"], 200, "{line}");
        let got = &line["response"]["body"]["choices"][0];
        let (status, want) = http(
            &e2.addr,
            "POST",
            "/v1/chat/completions",
            Some(&reqs[i]["body"]),
        )
        .expect("interactive");
        assert_eq!(status, 200, "{want}");
        let want = &want["choices"][0];
        assert_eq!(got["message"], want["message"], "{cid}");
        assert_eq!(got["finish_reason"], want["finish_reason"], "{cid}");
    }
}

#[test]
fn bad_inputs_are_refused_or_go_to_the_error_file_and_a_batch_can_be_cancelled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), 2);
    let e = start("bad", dir.path(), &cfg);
    unknown_ids_are_404(&e);
    bad_lines_go_to_the_error_file(&e);
    a_batch_can_be_cancelled_listed_and_its_file_deleted(&e);
}

/// Unknown file and batch ids: 404, naming the parameter where there is one.
fn unknown_ids_are_404(e: &EngineProc) {
    let body = json!({"input_file_id": "file-nope", "endpoint": "/v1/chat/completions", "completion_window": "24h"});
    let (status, v) = http(&e.addr, "POST", "/v1/batches", Some(&body)).expect("create");
    assert_eq!(
        (status, v["error"]["param"].clone()),
        (404, json!("input_file_id")),
        "{v}"
    );
    let (status, _) = http(&e.addr, "GET", "/v1/files/file-nope", None).expect("get");
    assert_eq!(status, 404);
    let (status, _) = http(&e.addr, "GET", "/v1/batches/batch-nope", None).expect("get");
    assert_eq!(status, 404);
}

/// A wrong endpoint is a 400; bad lines (not JSON, bad parameters, a wrong
/// url) go to the error file with the interactive 400 body, good lines to
/// the output file.
fn bad_lines_go_to_the_error_file(e: &EngineProc) {
    let reqs = requests();
    let mut bad_params = reqs[1].clone();
    bad_params["body"]["temperature"] = json!(-3);
    let lines = [
        reqs[0].to_string(),
        "{not json".to_string(),
        bad_params.to_string(),
        json!({"custom_id": "wrong-url", "method": "POST", "url": "/v1/completions", "body": {}})
            .to_string(),
        reqs[2].to_string(),
    ];
    let file = upload(&e.addr, &lines.join("\n"));
    // Wrong endpoint: 400.
    let body =
        json!({"input_file_id": file, "endpoint": "/v1/embeddings", "completion_window": "24h"});
    let (status, v) = http(&e.addr, "POST", "/v1/batches", Some(&body)).expect("create");
    assert_eq!(
        (status, v["error"]["param"].clone()),
        (400, json!("endpoint")),
        "{v}"
    );

    let id = create_batch(&e.addr, &file)["id"]
        .as_str()
        .expect("id")
        .to_string();
    let b = wait_for(e, &id, 600, |b| b["status"] == "completed");
    assert_eq!(
        b["request_counts"],
        json!({"total": 5, "completed": 2, "failed": 3}),
        "{b}"
    );
    let errors = content(&e.addr, b["error_file_id"].as_str().expect("error file"));
    assert_eq!(errors.len(), 3);
    assert_eq!(errors[0]["error"]["code"], "invalid_json", "{}", errors[0]);
    // The bad parameter gets the very 400 body an interactive request gets.
    let (status, want) = http(
        &e.addr,
        "POST",
        "/v1/chat/completions",
        Some(&bad_params["body"]),
    )
    .expect("interactive");
    assert_eq!(status, 400);
    assert_eq!(errors[1]["custom_id"], "req-1");
    assert_eq!(errors[1]["response"]["status_code"], 400);
    assert_eq!(errors[1]["response"]["body"], want);
    assert_eq!(errors[2]["custom_id"], "wrong-url");
    assert_eq!(
        content(&e.addr, b["output_file_id"].as_str().expect("output")).len(),
        2
    );
}

/// Cancel: a long batch stops early and ends cancelled; the list shows it
/// first; its input file can be deleted.
fn a_batch_can_be_cancelled_listed_and_its_file_deleted(e: &EngineProc) {
    let mut long = requests();
    for r in &mut long {
        r["body"]["max_tokens"] = json!(200);
    }
    let file = upload(&e.addr, &jsonl(&long));
    let id = create_batch(&e.addr, &file)["id"]
        .as_str()
        .expect("id")
        .to_string();
    let (status, v) =
        http(&e.addr, "POST", &format!("/v1/batches/{id}/cancel"), None).expect("cancel");
    assert_eq!(status, 200, "{v}");
    assert!(
        v["status"] == "cancelling" || v["status"] == "cancelled",
        "{v}"
    );
    let b = wait_for(e, &id, 600, |b| b["status"] == "cancelled");
    assert!(b["cancelled_at"].is_u64(), "{b}");
    assert!(b["request_counts"]["completed"].as_u64() < Some(50), "{b}");
    // Listing: newest first, limit honoured.
    let (status, v) = http(&e.addr, "GET", "/v1/batches?limit=1", None).expect("list");
    assert_eq!(status, 200);
    assert_eq!(v["data"][0]["id"], json!(id), "{v}");
    assert_eq!(v["has_more"], true);
    // Delete a file: gone afterwards.
    let (status, v) = http(&e.addr, "DELETE", &format!("/v1/files/{file}"), None).expect("delete");
    assert_eq!((status, v["deleted"].clone()), (200, json!(true)));
    let (status, _) = http(&e.addr, "GET", &format!("/v1/files/{file}"), None).expect("get");
    assert_eq!(status, 404);
}

/// The official `openai` Python client (the venv of scripts/install-deps.sh,
/// `$KVFABRIC_OPENAI_PYTHON`): files.create, batches.create / retrieve /
/// list, files.content; checks in engine/tests/python/batch_client.py.
#[test]
fn the_official_openai_client_runs_a_batch() {
    let python = std::env::var_os("KVFABRIC_OPENAI_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            std::path::PathBuf::from(home).join(".cache/kvfabric/openai-venv/bin/python")
        });
    assert!(
        python.exists(),
        "the openai client venv is missing at {}: run scripts/install-deps.sh",
        python.display()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), 2);
    let e = start("py", dir.path(), &cfg);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("engine/tests/python/batch_client.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .arg(format!("http://{}", e.addr))
        .arg("smollm2")
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("ok batch"),
        "stdout:\n{stdout}\nstderr:\n{stderr}\n{}",
        e.log()
    );
}
