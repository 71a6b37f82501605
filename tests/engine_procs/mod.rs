//! Real `kvfabric engine` processes (each with its embedded fabric node) on
//! loopback, and a minimal blocking HTTP client for their OpenAI API.
#![allow(dead_code)]

mod response;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use response::parse_response;

pub use kvfabric_testkit::free_port;

pub use kvfabric_testkit::engine::model_path;

/// One `kvfabric engine` child process.
pub struct EngineProc {
    pub name: String,
    pub addr: String,
    log: PathBuf,
    child: Option<Child>,
}

impl EngineProc {
    /// Start an engine named `name` (also its node id) with `extra` flags
    /// (`--etcd ...`, `--fabric off`, `--role prefill`, ...).
    pub fn start(name: &str, dir: &Path, extra: &[String]) -> EngineProc {
        let addr = format!("127.0.0.1:{}", free_port());
        let log = dir.join(format!("{name}.log"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvfabric"));
        for (k, _) in std::env::vars() {
            if k.starts_with("KVFABRIC_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("KVFABRIC_LOG", "info,kvfabric_connector=debug")
            .arg("engine")
            .arg("--model")
            .arg(model_path())
            .args(["--listen", &addr, "--node-id", name, "--threads", "1"])
            .args(["--kv-pool", "128MiB", "--ram-capacity", "256MiB"])
            .args([
                "--grpc-listen",
                "127.0.0.1:0",
                "--http-listen",
                "127.0.0.1:0",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).expect("log file")));
        let child = cmd.spawn().expect("start kvfabric engine");
        let e = EngineProc {
            name: name.into(),
            addr,
            log,
            child: Some(child),
        };
        e.wait_ready();
        e
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok((200, _)) = http(&self.addr, "GET", "/health", None) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("engine {} never became healthy:\n{}", self.name, self.log());
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Send a signal by name (`STOP`, `CONT`, ...).
    pub fn signal(&self, name: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([&format!("-{name}"), &c.id().to_string()])
                .status();
        }
    }

    /// The last lines of the process log.
    pub fn log(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = s.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Greedy `/v1/completions`: (text, cached_tokens). Panics on failure.
    pub fn complete(&self, prompt: &str, max_tokens: usize) -> (String, u64) {
        let body = serde_json::json!({
            "model": "smollm2",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
        });
        let (status, v) = http(&self.addr, "POST", "/v1/completions", Some(&body))
            .unwrap_or_else(|e| panic!("engine {}: {e}\n{}", self.name, self.log()));
        assert_eq!(status, 200, "engine {}: {v}\n{}", self.name, self.log());
        let text = v["choices"][0]["text"].as_str().expect("text").to_string();
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        (text, cached)
    }
}

impl Drop for EngineProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Prometheus counter or gauge from an engine's /metrics (0 if absent).
pub fn metric(addr: &str, name: &str) -> f64 {
    let Ok(text) = raw_get(addr, "/metrics") else {
        return 0.0;
    };
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn raw_get(addr: &str, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let (_, body) = parse_response(&raw)?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// One HTTP/1.1 request (Connection: close); (status, JSON body or Null).
/// Chunked, sized and close-delimited bodies are all decoded (`response`).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), String> {
    http_with_key(addr, method, path, body, None)
}

/// [`http`] with `Authorization: Bearer <api_key>` when a key is given.
pub fn http_with_key(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
    api_key: Option<&str>,
) -> Result<(u16, Value), String> {
    let auth = api_key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(|e| e.to_string())?;
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let (status, body) = parse_response(&raw)?;
    let json = serde_json::from_slice(body.trim_ascii()).unwrap_or(Value::Null);
    Ok((status, json))
}
