//! `kvfabric bench vllm`: the agentic trace of `bench agentic` (sessions,
//! turns, a shared ~1000-token system prompt, a history growing by each
//! answer) through two real vLLM CPU servers with seeded random routing,
//! once per mode, each mode on fresh servers and a fresh store (issue 46):
//! - `vllm`: each server's own prefix cache only;
//! - `kvfabric`: `kvfabric.vllm.KvfabricConnector`, one `kvfabric node` of
//!   this binary per server, the two in one cluster;
//! - `mooncake`: vLLM's `MooncakeStoreConnector` on one `mooncake_master`
//!   (TCP, loopback);
//! - `lmcache`: vLLM's `LMCacheConnectorV1`, reported `refused` where LMCache
//!   is not installed in the venv or the server does not start with it.
//!
//! The trace is generated here (the reference model's tokenizer, the one the
//! HF conversion of scripts/vllm-model.sh carries) and sent as token ids to
//! `benches/peers/vllm_bench.py` (embedded, run by the venv's python, every
//! process it starts bounded and killed on exit), which returns per request
//! prompt, answer, `cached_tokens` and TTFT; [`report`] turns them into
//! per-mode hit ratio, oracle hit ratio, TTFT p50/p90, load bytes and answer
//! identity, and the ratios the issue sets targets on.
//!
//! The venv is `$KVFABRIC_VLLM_VENV` (default ~/.cache/kvfabric/vllm-venv,
//! scripts/vllm-env.sh, with this workspace's wheel from
//! scripts/python-build.sh); where it is missing every mode is `unavailable`.

mod report;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};

use crate::agentic::trace::{route, Workload, WorkloadShape};
use crate::engine::peers::child::{last_json_line, run_child, tail, Output};

const DRIVER: &str = include_str!("../peers/vllm_bench.py");
const HARNESS: &str = include_str!("../peers/vllm_harness.py");
/// The two servers turns are routed between.
const SERVERS: usize = 2;

/// Arguments of `kvfabric bench vllm`.
#[derive(clap::Args, Debug, Clone)]
pub struct VllmArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// GGUF model whose tokenizer builds the trace (default: the fetched reference model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The HF directory vLLM serves (default: ~/.cache/kvfabric/models/smollm2-135m-hf,
    /// scripts/vllm-model.sh).
    #[arg(long)]
    pub hf_model: Option<PathBuf>,
    /// The vLLM venv [env: KVFABRIC_VLLM_VENV] (default: ~/.cache/kvfabric/vllm-venv).
    #[arg(long)]
    pub venv: Option<PathBuf>,
    /// The `kvfabric` binary whose `node` the kvfabric mode starts (default: this one).
    #[arg(long)]
    pub kvfabric: Option<PathBuf>,
    /// Modes, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "vllm,kvfabric,mooncake,lmcache"
    )]
    pub modes: Vec<String>,
    /// Agent sessions.
    #[arg(long, default_value_t = 4)]
    pub sessions: usize,
    /// Turns per session.
    #[arg(long, default_value_t = 3)]
    pub turns: usize,
    /// Tokens of the shared system prompt.
    #[arg(long, default_value_t = 1000)]
    pub system_tokens: usize,
    /// Tokens of context each session starts with (0 = none).
    #[arg(long, default_value_t = 0)]
    pub session_history_tokens: usize,
    /// Tokens generated per turn (greedy).
    #[arg(long, default_value_t = 16)]
    pub answer_tokens: usize,
    /// Seed of the workload text and the routing.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Limit on the whole run (every mode), seconds.
    #[arg(long, default_value_t = 1800)]
    pub timeout_s: u64,
    /// Keep the servers' and stores' logs here (default: a temporary directory).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
}

fn home_cache(rel: &str) -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default()
        .join(".cache/kvfabric")
        .join(rel)
}

/// `$KVFABRIC_VLLM_VENV`, else ~/.cache/kvfabric/vllm-venv.
pub fn default_venv() -> PathBuf {
    std::env::var_os("KVFABRIC_VLLM_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| home_cache("vllm-venv"))
}

pub fn run(args: &VllmArgs) -> anyhow::Result<()> {
    crate::print_report(args.json, &measure(args)?, print_table)
}

/// The trace as the driver reads it: token ids and each turn's server.
fn trace_json(args: &VllmArgs) -> anyhow::Result<Value> {
    anyhow::ensure!(
        args.sessions > 0 && args.turns > 0,
        "--sessions and --turns must be > 0"
    );
    let path = crate::model_file(&args.model)?;
    let workload = Workload::for_model(
        &path,
        args.seed,
        &WorkloadShape {
            sessions: args.sessions,
            turns: args.turns,
            system_tokens: args.system_tokens,
            history_tokens: args.session_history_tokens,
        },
    )?;
    let routes: Vec<Vec<usize>> = (0..args.sessions)
        .map(|s| {
            (0..args.turns)
                .map(|t| route(args.seed, s, t, SERVERS))
                .collect()
        })
        .collect();
    Ok(json!({"system": workload.system, "users": workload.users, "routes": routes}))
}

/// Why the driver cannot run here, if it cannot.
fn missing(python: &Path, hf_model: &Path) -> Option<String> {
    if !python.exists() {
        return Some(format!(
            "no vLLM venv at {} (scripts/vllm-env.sh, then scripts/python-build.sh <venv>; \
             or set KVFABRIC_VLLM_VENV)",
            python
                .parent()
                .and_then(Path::parent)
                .unwrap_or(python)
                .display()
        ));
    }
    if !hf_model.join("config.json").exists() {
        return Some(format!(
            "no HF model at {} (scripts/vllm-model.sh)",
            hf_model.display()
        ));
    }
    None
}

fn measure(args: &VllmArgs) -> anyhow::Result<Value> {
    let python = args
        .venv
        .clone()
        .unwrap_or_else(default_venv)
        .join("bin/python");
    let hf_model = args
        .hf_model
        .clone()
        .unwrap_or_else(|| home_cache("models/smollm2-135m-hf"));
    let trace = trace_json(args)?;
    let workload = json!({
        "sessions": args.sessions, "turns": args.turns, "system_tokens": args.system_tokens,
        "session_history_tokens": args.session_history_tokens,
        "answer_tokens": args.answer_tokens, "seed": args.seed, "servers": SERVERS,
        "system_prompt_tokens": trace["system"].as_array().map_or(0, Vec::len),
    });
    let driver = match missing(&python, &hf_model) {
        Some(reason) => report::unavailable(&args.modes, &reason),
        None => run_driver(args, &python, &hf_model, &trace)?,
    };
    Ok(report::assemble(workload, &args.modes, &driver))
}

/// Run the driver on `trace`; its JSON line (`{"modes": {..}}`).
fn run_driver(
    args: &VllmArgs,
    python: &Path,
    hf_model: &Path,
    trace: &Value,
) -> anyhow::Result<Value> {
    let scripts = tempfile::tempdir()?;
    std::fs::write(scripts.path().join("vllm_bench.py"), DRIVER)?;
    std::fs::write(scripts.path().join("vllm_harness.py"), HARNESS)?;
    let kvfabric = match &args.kvfabric {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("finding the kvfabric binary")?,
    };
    let mut cmd = Command::new(python);
    cmd.arg(scripts.path().join("vllm_bench.py"))
        .arg("--kvfabric")
        .arg(&kvfabric)
        .arg("--python")
        .arg(python)
        .arg("--model")
        .arg(hf_model)
        .arg("--modes")
        .arg(args.modes.join(","))
        .arg("--answer-tokens")
        .arg(args.answer_tokens.to_string());
    if let Some(dir) = &args.workdir {
        cmd.arg("--workdir").arg(dir);
    }
    let input = serde_json::to_vec(trace)?;
    let done = run_child(
        cmd,
        &input,
        Output::Capture,
        Duration::from_secs(args.timeout_s),
    )?;
    anyhow::ensure!(
        done.status.success(),
        "vllm_bench.py failed ({}): {}",
        done.status,
        tail(&done.stderr, 20)
    );
    last_json_line(&done.stdout)
}

fn print_table(report: &Value) {
    println!("vllm bench: {}", report["workload"]);
    println!(
        "{:<10} {:>8} {:>8} {:>8} {:>8} {:>12} {:>9}  status",
        "mode", "hit", "oracle", "p50 ms", "p90 ms", "load bytes", "same ans"
    );
    let Some(modes) = report["modes"].as_object() else {
        return;
    };
    for (name, m) in modes {
        let f = |k: &str| m[k].as_f64().map_or("-".into(), |x| format!("{x:.3}"));
        let ms = |k: &str| m[k].as_f64().map_or("-".into(), |x| format!("{x:.0}"));
        println!(
            "{:<10} {:>8} {:>8} {:>8} {:>8} {:>12} {:>9}  {} {}",
            name,
            f("hit_ratio"),
            f("oracle_hit_ratio"),
            ms("ttft_p50_ms"),
            ms("ttft_p90_ms"),
            ms("load_bytes"),
            m["answers_identical"],
            m["status"].as_str().unwrap_or("?"),
            m["reason"].as_str().unwrap_or("")
        );
    }
    println!("ratios: {}", report["ratios"]);
    println!("targets: {}", report["targets"]);
}
