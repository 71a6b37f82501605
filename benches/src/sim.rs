//! `kvfabric bench sim`: what the agentic workload would see on 8 to 256
//! engines, predicted by a seeded discrete-event model ([`model`]) fed by
//! costs measured on this machine ([`costs`]), and checked against a
//! measured run (`--compare` a `bench agentic --json --hosts 3` report).
//!
//! Per engine count N: sessions = N x `--sessions-per-engine`, send rate =
//! N x `--rate-per-engine` (the defaults are the 3-engine agentic bench's 4
//! sessions at 2 requests/s), a cluster-wide cache of N x `--node-ram-mib`,
//! each engine's own KV pool of `--kv-pool-mib`, uniform random routing as
//! `bench agentic`'s. Reported: the token hit ratio (and the oracle's on
//! small runs), the share of hit blocks that came from another engine and
//! from the engine's own pool, the blocks loaded through the fabric, the
//! bytes each host link carried out and in (mean and busiest, as Gbit/s
//! over the run and as a fraction of the link),
//! TTFT p50/p90 and end-to-end p50, and the same trace's TTFT p50 with no
//! cache (the peer in the same run). Same flags and seed: the same figures
//! (the measured costs aside: pass `--prefill-fixed-ms`,
//! `--prefill-ms-per-token` and `--decode-ms-per-token` to fix them).

pub mod costs;
pub mod model;
pub mod pool;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use kvfabric_engine::gguf::GgufFile;
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::tokenizer::Tokenizer;
use serde_json::{json, Value};

use crate::agentic::trace::{Workload, WorkloadShape};
use model::{simulate, Costs, SimParams, SimResult};

/// Arguments of `kvfabric bench sim`.
#[derive(clap::Args, Debug, Clone)]
pub struct SimArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// GGUF model: its tokenizer builds the trace, its engine gives the costs.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Engine counts to simulate.
    #[arg(long, value_delimiter = ',', default_value = "8,16,32,64,128,256")]
    pub engines: Vec<usize>,
    /// Sessions per engine (rounded; 4 sessions on 3 engines in `bench agentic`).
    #[arg(long, default_value_t = 1.34)]
    pub sessions_per_engine: f64,
    /// Turns per session.
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// Sends per second per engine (2/s on 3 engines in `bench agentic`).
    #[arg(long, default_value_t = 2.0 / 3.0)]
    pub rate_per_engine: f64,
    /// Tokens generated per turn.
    #[arg(long, default_value_t = 16)]
    pub answer_tokens: usize,
    /// Seed of the workload text, the answers and the routing.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Tokens of the shared system prompt.
    #[arg(long, default_value_t = 1000)]
    pub system_tokens: usize,
    /// Tokens of context each session starts with.
    #[arg(long, default_value_t = 1500)]
    pub session_history_tokens: usize,
    /// RAM tier of each node, MiB (the cluster's cache is N times this).
    #[arg(long, default_value_t = 1024)]
    pub node_ram_mib: u64,
    /// KV pool of each engine, MiB: its own prefix cache, consulted before
    /// the cluster's (as `bench agentic --kv-pool-mib`; 0 = none).
    #[arg(long, default_value_t = 512)]
    pub kv_pool_mib: u64,
    /// Kernel threads per engine (as `bench agentic --threads`).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Line rate of each host link, Gbit/s.
    #[arg(long, default_value_t = 10.0)]
    pub link_gbit: f64,
    /// Fraction of the line rate a load reaches (0.87: `bench reuse --hosts
    /// 2 --link-gbit 10`, docs/BENCHMARKS.md, "across hosts").
    #[arg(long, default_value_t = 0.87)]
    pub link_efficiency: f64,
    /// Prefill cost per request, ms (with the two below: no measurement).
    #[arg(long)]
    pub prefill_fixed_ms: Option<f64>,
    /// Prefill cost per computed prompt token, ms.
    #[arg(long)]
    pub prefill_ms_per_token: Option<f64>,
    /// Decode cost per token, ms.
    #[arg(long)]
    pub decode_ms_per_token: Option<f64>,
    /// Measurements of each calibration prompt (the best is kept).
    #[arg(long, default_value_t = 2)]
    pub calibration_repeats: usize,
    /// A `bench agentic --json` report: also simulate its configuration
    /// (engines, sessions, turns, rate, answer tokens, seed, link) and
    /// report predicted against measured.
    #[arg(long)]
    pub compare: Option<PathBuf>,
}

/// Run the bench and print its report.
pub fn run(args: &SimArgs) -> anyhow::Result<()> {
    crate::print_report(args.json, &measure(args)?, print_table)
}

/// Runs with more requests than this skip the (quadratic) oracle.
const ORACLE_MAX_REQUESTS: usize = 400;

/// One simulated configuration.
struct Case {
    engines: usize,
    sessions: usize,
    turns: usize,
    rate: f64,
    answer_tokens: usize,
    seed: u64,
    link_gbit: f64,
    node_ram_mib: u64,
    kv_pool_mib: u64,
}

/// Run the bench and return the report (what `--json` prints).
pub fn measure(args: &SimArgs) -> anyhow::Result<Value> {
    anyhow::ensure!(
        args.engines.iter().all(|&n| n > 0) && !args.engines.is_empty(),
        "--engines: counts > 0"
    );
    anyhow::ensure!(
        args.turns > 0 && args.answer_tokens > 1,
        "--turns > 0, --answer-tokens > 1"
    );
    let path = crate::model_file(&args.model)?;
    let model = Arc::new(LlamaModel::load(&path, |_, _| {}).context("loading the model")?);
    let gguf = GgufFile::open(&path).context("opening the model")?;
    let tokenizer = Tokenizer::from_gguf(&gguf).context("building the tokenizer")?;
    drop(gguf);
    let encode = |text: &str| tokenizer.encode(text, true);
    let workload_of = |sessions: usize, turns: usize, seed: u64| {
        let shape = WorkloadShape {
            sessions,
            turns,
            system_tokens: args.system_tokens,
            history_tokens: args.session_history_tokens,
        };
        Workload::generate(&encode, seed, &shape)
    };
    let block_bytes = costs::block_bytes(&model, args.threads);
    let engine_costs = engine_costs(args, &model, &workload_of(1, 1, args.seed))?;
    let mut rows = Vec::new();
    for &n in &args.engines {
        let case = Case {
            engines: n,
            sessions: ((n as f64 * args.sessions_per_engine).round() as usize).max(1),
            turns: args.turns,
            rate: n as f64 * args.rate_per_engine,
            answer_tokens: args.answer_tokens,
            seed: args.seed,
            link_gbit: args.link_gbit,
            node_ram_mib: args.node_ram_mib,
            kv_pool_mib: args.kv_pool_mib,
        };
        let w = workload_of(case.sessions, case.turns, case.seed);
        rows.push(run_case(args, &case, &w, engine_costs, block_bytes)?.0);
    }
    let compared = match &args.compare {
        Some(file) => Some(compare(
            args,
            file,
            &workload_of,
            engine_costs,
            block_bytes,
        )?),
        None => None,
    };
    let c = costs::costs(
        engine_costs,
        args.link_gbit,
        args.link_efficiency,
        block_bytes,
    );
    Ok(json!({
        "model": path.display().to_string(),
        "seed": args.seed,
        "turns": args.turns,
        "sessions_per_engine": args.sessions_per_engine,
        "rate_per_engine": args.rate_per_engine,
        "node_ram_mib": args.node_ram_mib,
        "kv_pool_mib": args.kv_pool_mib,
        "costs": costs_json(&c, args),
        "runs": rows,
        "compare": compared,
    }))
}

/// The engine costs: given, or measured on this machine.
fn engine_costs(
    args: &SimArgs,
    model: &Arc<LlamaModel>,
    w: &Workload,
) -> anyhow::Result<(f64, f64, f64)> {
    if let (Some(f), Some(p), Some(d)) = (
        args.prefill_fixed_ms,
        args.prefill_ms_per_token,
        args.decode_ms_per_token,
    ) {
        return Ok((f, p, d));
    }
    let tokens = w.prompt(0, &[]);
    let long = tokens.len().min(2048);
    let short = (long / 8).max(64).min(long - 1);
    let (model, answer, repeats, threads) = (
        model.clone(),
        args.answer_tokens,
        args.calibration_repeats,
        args.threads,
    );
    crate::on_own_runtime(move |rt| {
        rt.block_on(costs::measure_engine(
            &model,
            threads,
            &tokens,
            (short, long),
            answer,
            repeats,
        ))
    })
}

/// Simulate `case` with a cache and without; its report row.
fn run_case(
    args: &SimArgs,
    case: &Case,
    w: &Workload,
    engine_costs: (f64, f64, f64),
    block_bytes: u64,
) -> anyhow::Result<(Value, SimResult, SimResult)> {
    let c = costs::costs(
        engine_costs,
        case.link_gbit,
        args.link_efficiency,
        block_bytes,
    );
    let requests = case.sessions * case.turns;
    let blocks_of = |mib: u64| ((mib << 20) / block_bytes.max(1)) as usize;
    let mut p = SimParams {
        engines: case.engines,
        rate: case.rate,
        answer_tokens: case.answer_tokens,
        seed: case.seed,
        capacity_blocks: case.engines * blocks_of(case.node_ram_mib),
        block_tokens: 64,
        pool_blocks: blocks_of(case.kv_pool_mib),
        oracle: requests <= ORACLE_MAX_REQUESTS,
    };
    let cached = simulate(w, &p, &c)?;
    // No cache: no fabric and no prefix cache in the engines (`bench
    // agentic`'s `none`).
    p.capacity_blocks = 0;
    p.pool_blocks = 0;
    p.oracle = false;
    let none = simulate(w, &p, &c)?;
    Ok((row(case, &p, &c, &cached, &none), cached, none))
}

fn row(case: &Case, p: &SimParams, c: &Costs, r: &SimResult, none: &SimResult) -> Value {
    let wall = r.wall_s.max(1e-9);
    let gbit = |bytes: u64| bytes as f64 * 8.0 / wall / 1e9;
    let link_gbit_eff = c.link_bytes_per_s * 8.0 / 1e9;
    let links = |v: &[u64]| {
        let mean = v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
        let max = v.iter().copied().max().unwrap_or(0);
        json!({
            "mean_gbit_s": mean * 8.0 / wall / 1e9,
            "max_gbit_s": gbit(max),
            "max_utilization": gbit(max) / link_gbit_eff,
            "max_bytes": max,
        })
    };
    let hits = (r.local_blocks + r.remote_blocks).max(1);
    json!({
        "engines": case.engines,
        "sessions": case.sessions,
        "requests": r.requests,
        "rate": case.rate,
        "capacity_blocks": p.capacity_blocks,
        "hit_ratio": r.hit_ratio,
        "oracle_hit_ratio": r.oracle_hit_ratio,
        "remote_hit_share": r.remote_blocks as f64 / hits as f64,
        "pool_hit_share": r.pool_hit_blocks as f64 / hits as f64,
        "pool_blocks": p.pool_blocks,
        // Blocks the engines loaded through the fabric (their node's or
        // another's): the connectors' `loaded_blocks`.
        "fabric_loaded_blocks": r.local_blocks - r.pool_hit_blocks + r.remote_blocks,
        "bytes_moved": r.link_in_bytes.iter().sum::<u64>(),
        "link_out": links(&r.link_out_bytes),
        "link_in": links(&r.link_in_bytes),
        "ttft_p50_ms": r.ttft_p(0.5),
        "ttft_p90_ms": r.ttft_p(0.9),
        "e2e_p50_ms": r.e2e_p(0.5),
        "load_p50_ms": crate::agentic::stats::percentile(&r.load_ms, 0.5),
        "no_cache_ttft_p50_ms": none.ttft_p(0.5),
        "no_cache_over_cache_ttft_p50": none.ttft_p(0.5) / r.ttft_p(0.5).max(1e-9),
        "wall_s": r.wall_s,
    })
}

fn costs_json(c: &Costs, args: &SimArgs) -> Value {
    let measured = args.prefill_fixed_ms.is_none()
        || args.prefill_ms_per_token.is_none()
        || args.decode_ms_per_token.is_none();
    json!({
        "measured_here": measured,
        "prefill_fixed_ms": c.prefill_fixed_ms,
        "prefill_ms_per_token": c.prefill_ms_per_token,
        "prefill_tokens_per_s": 1e3 / c.prefill_ms_per_token.max(1e-9),
        "decode_ms_per_token": c.decode_ms_per_token,
        "link_gbit": args.link_gbit,
        "link_efficiency": args.link_efficiency,
        "block_bytes": c.block_bytes,
    })
}

/// Simulate the configuration of a measured `bench agentic` report and set
/// the figures side by side.
fn compare(
    args: &SimArgs,
    file: &std::path::Path,
    workload_of: &dyn Fn(usize, usize, u64) -> Workload,
    engine_costs: (f64, f64, f64),
    block_bytes: u64,
) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let m: Value =
        serde_json::from_str(text.trim()).context("--compare: a bench agentic --json report")?;
    let get = |k: &str| {
        m[k].as_f64()
            .ok_or_else(|| anyhow::anyhow!("--compare: the report has no number {k:?}"))
    };
    let case = Case {
        engines: get("engines")? as usize,
        sessions: get("sessions")? as usize,
        turns: get("turns")? as usize,
        rate: get("rate")?,
        answer_tokens: get("answer_tokens")? as usize,
        seed: get("seed")? as u64,
        link_gbit: m["link_gbit"].as_f64().unwrap_or(args.link_gbit),
        // Reports before these were recorded ran the defaults.
        node_ram_mib: m["node_ram_mib"].as_u64().unwrap_or(args.node_ram_mib),
        kv_pool_mib: m["kv_pool_mib"].as_u64().unwrap_or(args.kv_pool_mib),
    };
    let w = workload_of(case.sessions, case.turns, case.seed);
    let (row, _, _) = run_case(args, &case, &w, engine_costs, block_bytes)?;
    let f = &m["fabric"];
    let measured_bytes: u64 = m["fabric_transfer"]["bytes_read"]
        .as_object()
        .map(|o| o.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
    let pair = |pred: &Value, meas: &Value| {
        let (p, x) = (pred.as_f64().unwrap_or(0.0), meas.as_f64().unwrap_or(0.0));
        json!({"predicted": p, "measured": x, "predicted_over_measured": if x > 0.0 { p / x } else { 0.0 }})
    };
    Ok(json!({
        "report": file.display().to_string(),
        "engines": case.engines,
        "hosts": m["hosts"],
        "link_gbit": case.link_gbit,
        "hit_ratio": pair(&row["hit_ratio"], &f["hit_ratio"]),
        "oracle_hit_ratio": pair(&row["oracle_hit_ratio"], &m["oracle_hit_ratio"]),
        "bytes_moved": pair(&row["bytes_moved"], &json!(measured_bytes)),
        "fabric_loaded_blocks": pair(
            &row["fabric_loaded_blocks"],
            &m["fabric_connector"]["loaded_blocks"],
        ),
        "ttft_p50_ms": pair(&row["ttft_p50_ms"], &f["ttft_p50_ms"]),
        "ttft_p90_ms": pair(&row["ttft_p90_ms"], &f["ttft_p90_ms"]),
        "e2e_p50_ms": pair(&row["e2e_p50_ms"], &f["e2e_p50_ms"]),
        "no_cache_ttft_p50_ms": pair(&row["no_cache_ttft_p50_ms"], &m["none"]["ttft_p50_ms"]),
        "simulated": row,
    }))
}

fn print_table(r: &Value) {
    println!("bench sim: costs {}", r["costs"]);
    println!(
        "  {:>7} {:>8} {:>6} {:>7} {:>11} {:>11} {:>11} {:>10} {:>12}",
        "engines",
        "requests",
        "hit",
        "remote",
        "link max",
        "ttft p50",
        "ttft p90",
        "e2e p50",
        "no-cache p50"
    );
    for row in r["runs"].as_array().into_iter().flatten() {
        let f = |k: &str| row[k].as_f64().unwrap_or(0.0);
        println!(
            "  {:>7} {:>8} {:>6.3} {:>7.3} {:>7.2} Gb/s {:>8.1} ms {:>8.1} ms {:>7.1} ms {:>9.1} ms",
            row["engines"],
            row["requests"],
            f("hit_ratio"),
            f("remote_hit_share"),
            row["link_in"]["max_gbit_s"].as_f64().unwrap_or(0.0),
            f("ttft_p50_ms"),
            f("ttft_p90_ms"),
            f("e2e_p50_ms"),
            f("no_cache_ttft_p50_ms"),
        );
    }
    if !r["compare"].is_null() {
        println!("  against {}:", r["compare"]["report"]);
        for k in [
            "hit_ratio",
            "bytes_moved",
            "fabric_loaded_blocks",
            "ttft_p50_ms",
            "ttft_p90_ms",
            "e2e_p50_ms",
            "no_cache_ttft_p50_ms",
        ] {
            let c = &r["compare"][k];
            println!(
                "    {k:<22} predicted {} measured {}",
                c["predicted"], c["measured"]
            );
        }
    }
}
