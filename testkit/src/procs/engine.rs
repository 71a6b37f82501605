//! One `kvfabric engine` child process (the reference model, its embedded
//! fabric node) on loopback, started from [`EngineOptions`] and waited on
//! until its /health answers.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::command::{kvfabric_command, log_tail};
use super::http::http;
use crate::engine::model_path;
use crate::free_port;

/// How to start an engine: its name (also its node id), where its log goes,
/// and what differs from the defaults (1 thread, 128 MiB of KV, 256 MiB of
/// node RAM, node ports on 127.0.0.1:0).
#[derive(Clone, Debug)]
pub struct EngineOptions {
    name: String,
    dir: PathBuf,
    config: Option<PathBuf>,
    node_http: Option<String>,
    grpc_listen: Option<String>,
    kv_pool: String,
    ram_capacity: String,
    extra: Vec<String>,
}

impl EngineOptions {
    /// Engine `name` with its log at `dir/<name>.log`.
    pub fn new(name: &str, dir: &Path) -> Self {
        EngineOptions {
            name: name.into(),
            dir: dir.to_path_buf(),
            config: None,
            node_http: None,
            grpc_listen: None,
            kv_pool: "128MiB".into(),
            ram_capacity: "256MiB".into(),
            extra: Vec::new(),
        }
    }

    /// A `--config` file (given before the subcommand).
    pub fn config(mut self, path: &Path) -> Self {
        self.config = Some(path.to_path_buf());
        self
    }

    /// The embedded node's HTTP address (/metrics, /health, the console);
    /// `127.0.0.1:0` otherwise.
    pub fn node_http(mut self, addr: &str) -> Self {
        self.node_http = Some(addr.into());
        self
    }

    /// The embedded node's gRPC address (its KV events, CacheService);
    /// `127.0.0.1:0` otherwise.
    pub fn grpc_listen(mut self, addr: &str) -> Self {
        self.grpc_listen = Some(addr.into());
        self
    }

    /// `--kv-pool` and `--ram-capacity` (e.g. `64MiB`).
    pub fn memory(mut self, kv_pool: &str, ram_capacity: &str) -> Self {
        self.kv_pool = kv_pool.into();
        self.ram_capacity = ram_capacity.into();
        self
    }

    /// More flags (`--etcd ...`, `--fabric off`, `--role prefill`, ...).
    pub fn args<S: AsRef<str>>(mut self, extra: &[S]) -> Self {
        self.extra
            .extend(extra.iter().map(|s| s.as_ref().to_string()));
        self
    }

    /// Start it and wait (up to 60 s) until it is healthy.
    pub fn start(self) -> EngineProc {
        EngineProc::start_with(self)
    }
}

/// One `kvfabric engine` child process; SIGKILLed on drop.
pub struct EngineProc {
    pub name: String,
    /// The OpenAI API's address.
    pub addr: String,
    /// The embedded node's HTTP address, when [`EngineOptions::node_http`] set it.
    pub node_http: Option<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl EngineProc {
    /// Start an engine named `name` with `extra` flags and the defaults.
    pub fn start(name: &str, dir: &Path, extra: &[String]) -> EngineProc {
        EngineOptions::new(name, dir).args(extra).start()
    }

    fn start_with(o: EngineOptions) -> EngineProc {
        let addr = format!("127.0.0.1:{}", free_port());
        let log = o.dir.join(format!("{}.log", o.name));
        let node_http = o.node_http.clone().unwrap_or("127.0.0.1:0".into());
        let grpc = o.grpc_listen.clone().unwrap_or("127.0.0.1:0".into());
        let mut cmd = kvfabric_command("info,kvfabric_connector=debug");
        if let Some(config) = &o.config {
            cmd.arg("--config").arg(config);
        }
        cmd.arg("engine")
            .arg("--model")
            .arg(model_path())
            .args(["--listen", &addr, "--node-id", &o.name, "--threads", "1"])
            .args(["--kv-pool", &o.kv_pool, "--ram-capacity", &o.ram_capacity])
            .args(["--grpc-listen", &grpc, "--http-listen", &node_http])
            .args(&o.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).expect("log file")));
        let child = cmd.spawn().expect("start kvfabric engine");
        let e = EngineProc {
            name: o.name,
            addr,
            node_http: o.node_http,
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
        log_tail(&self.log)
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
