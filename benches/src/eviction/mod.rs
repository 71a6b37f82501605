//! `kvfabric bench eviction`: how close each RAM-tier eviction order comes
//! to the optimum when the tier is too small for the traffic.
//!
//! Several seeded traces (`traces`: the agentic round-robin, Zipf-popular
//! returning sessions, sessions that end, a system prompt that changes
//! version, a scan beside the agents; or an external JSON-lines trace given
//! with `--trace`, see `file`) are replayed as block keys against a real
//! [`Store`] whose RAM tier holds exactly 10, 25, 50 and 75% of the trace's
//! distinct blocks, no disk. Each request looks up its prompt's blocks
//! (prefix order), reads the hits (a lease, as the connector does), then puts
//! the blocks the engine would have computed. Answers are fixed pseudo-random
//! tokens (no engine runs), so the replay is deterministic and takes seconds.
//!
//! The figure is the token hit ratio (prompt tokens served from the tier
//! over prompt tokens) per policy and capacity, and its ratio to Belady's
//! MIN under the prefix rule (`min`) on the same trace and capacity; a tier
//! that never evicts is the ceiling. The tier runs with both watermarks at
//! 1.0 (evict one block when full), so it holds the same number of blocks
//! as MIN's; `--watermarks HIGH,LOW` replays a tier that evicts in bursts
//! (a node's default is 0.95,0.85), holding fewer blocks than MIN's.

mod against_lru;
pub mod bound;
mod file;
pub mod min;
mod mooncake;
pub mod planner;
mod replay;
pub mod traces;

use anyhow::Context;
use clap::Args;
use kvfabric_engine::gguf::GgufFile;
use kvfabric_engine::tokenizer::Tokenizer;
use kvfabric_store::{
    AdaptiveMode, EvictionPolicy, KeyChain, KvLayout, ModelFingerprint, NodeConfig,
};
use serde_json::{json, Value};

use replay::small_layout;
pub use replay::{replay, replay_store, POLICIES};
use traces::{Shape, Trace};

/// Flags of `kvfabric bench eviction`.
#[derive(Args, Debug, Clone)]
pub struct EvictionArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// GGUF model whose tokenizer encodes the generated traces (default: the fetched reference model).
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    /// Replay this JSON-lines trace (one request per line: `tokens` or
    /// `blocks`, optional `namespace`, `timestamp`) instead of the generated ones.
    #[arg(long)]
    pub trace: Option<std::path::PathBuf>,
    /// Format of --trace: `jsonl` (the lines above) or `mooncake` (the
    /// Mooncake FAST'25 traces: `hash_ids` of 512-token blocks, `timestamp`).
    #[arg(long, value_enum, default_value_t = TraceFormat::Jsonl)]
    pub trace_format: TraceFormat,
    /// Concurrent agent sessions.
    #[arg(long, default_value_t = 24)]
    pub sessions: usize,
    /// Turns per session.
    #[arg(long, default_value_t = 8)]
    pub turns: usize,
    /// Tokens of the shared system prompt.
    #[arg(long, default_value_t = 1000)]
    pub system_tokens: usize,
    /// Tokens of history each session starts with.
    #[arg(long, default_value_t = 1500)]
    pub session_history_tokens: usize,
    /// Tokens of each answer.
    #[arg(long, default_value_t = 48)]
    pub answer_tokens: usize,
    /// One-off prompts of the scan trace's batch job.
    #[arg(long, default_value_t = 2000)]
    pub scan_prompts: usize,
    /// Tokens per block.
    #[arg(long, default_value_t = 64)]
    pub block_tokens: usize,
    /// Seed of the workload text and the answers.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// lirs: percent of resident blocks kept as HIR (config `lirs_hir_percent`).
    #[arg(long, default_value_t = NodeConfig::default().lirs_hir_percent)]
    pub lirs_hir_percent: f64,
    /// lirs: ghosts remembered per resident block (config `lirs_history`).
    #[arg(long, default_value_t = NodeConfig::default().lirs_history)]
    pub lirs_history: u32,
    /// lirs: idle factor after which a protected block is demoted (config `lirs_idle_factor`).
    #[arg(long, default_value_t = NodeConfig::default().lirs_idle_factor)]
    pub lirs_idle_factor: f64,
    /// adaptive: tiers' worth of lookups the score remembers (config `adaptive_window`).
    #[arg(long, default_value_t = NodeConfig::default().adaptive_window)]
    pub adaptive_window: f64,
    /// adaptive: the lead, times the tier's blocks, that switches (config `adaptive_margin`).
    #[arg(long, default_value_t = NodeConfig::default().adaptive_margin)]
    pub adaptive_margin: f64,
    /// adaptive: the lead, in standard deviations of an even duel, that
    /// switches too (config `adaptive_confidence`; 0 = the margin alone).
    #[arg(long, default_value_t = NodeConfig::default().adaptive_confidence)]
    pub adaptive_confidence: f64,
    /// adaptive: the order it starts with, lirs or lru (config
    /// `adaptive_start`; default: the config's default).
    #[arg(long, value_parser = parse_mode)]
    pub adaptive_start: Option<AdaptiveMode>,
    /// Also check the capacity planner: its curve (sampling at
    /// --planner-rate) against exact replays, on the agentic trace with this
    /// many sessions (~37 distinct blocks each; 0 = skip).
    #[arg(long, default_value_t = 0)]
    pub planner_sessions: usize,
    /// The tier's high and low watermarks, `HIGH,LOW` (default 1.0,1.0:
    /// evict one block when full, the tier MIN is computed for; a node's
    /// default is 0.95,0.85: a full tier evicts ~10% at once).
    #[arg(long, value_parser = parse_watermarks, default_value = "1.0,1.0")]
    pub watermarks: (f64, f64),
    /// The planner's sampling rate for --planner-sessions.
    #[arg(long, default_value_t = NodeConfig::default().planner_sample_rate)]
    pub planner_rate: f64,
}

impl EvictionArgs {
    /// The node config every replay starts from (the lirs knobs).
    fn node_config(&self) -> NodeConfig {
        NodeConfig {
            lirs_hir_percent: self.lirs_hir_percent,
            lirs_history: self.lirs_history,
            lirs_idle_factor: self.lirs_idle_factor,
            adaptive_window: self.adaptive_window,
            adaptive_margin: self.adaptive_margin,
            adaptive_confidence: self.adaptive_confidence,
            adaptive_start: self
                .adaptive_start
                .unwrap_or(NodeConfig::default().adaptive_start),
            high_watermark: self.watermarks.0,
            low_watermark: self.watermarks.1,
            ..Default::default()
        }
    }
}

/// `--trace-format`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// JSON lines of `tokens` or `blocks` (see `file`).
    Jsonl,
    /// The Mooncake FAST'25 traces (see `mooncake`).
    Mooncake,
}

/// `--adaptive-start`: lirs, lru or door.
fn parse_mode(s: &str) -> Result<AdaptiveMode, String> {
    match s {
        "lirs" => Ok(AdaptiveMode::Lirs),
        "lru" => Ok(AdaptiveMode::Lru),
        "door" => Ok(AdaptiveMode::Door),
        _ => Err(format!("{s:?} is not lirs, lru or door")),
    }
}

/// `--watermarks`: `HIGH,LOW`, each in (0, 1], LOW <= HIGH.
pub(crate) fn parse_watermarks(s: &str) -> Result<(f64, f64), String> {
    let (h, l) = s
        .split_once(',')
        .ok_or_else(|| format!("{s:?} is not HIGH,LOW"))?;
    let num = |v: &str| v.trim().parse::<f64>().map_err(|e| format!("{v:?}: {e}"));
    let (h, l) = (num(h)?, num(l)?);
    if !(l > 0.0 && l <= h && h <= 1.0) {
        return Err(format!(
            "watermarks must satisfy 0 < LOW ({l}) <= HIGH ({h}) <= 1"
        ));
    }
    Ok((h, l))
}

/// Tier sizes tried, as fractions of the trace's distinct blocks.
const CAPACITY_FRACTIONS: [f64; 5] = [0.05, 0.1, 0.25, 0.5, 0.75];

/// Run the bench and print its report.
pub fn run(args: &EvictionArgs) -> anyhow::Result<()> {
    crate::print_report(args.json, &measure(args)?, print_table)
}

/// The tokenizer of --model.
fn tokenizer(args: &EvictionArgs) -> anyhow::Result<Tokenizer> {
    let path = crate::model_file(&args.model)?;
    let gguf = GgufFile::open(&path).context("opening the model")?;
    Tokenizer::from_gguf(&gguf).context("building the tokenizer")
}

/// The traces' shape from the flags, with `sessions` sessions.
fn shape(args: &EvictionArgs, sessions: usize) -> Shape {
    Shape {
        sessions,
        turns: args.turns,
        system_tokens: args.system_tokens,
        history_tokens: args.session_history_tokens,
        answer_tokens: args.answer_tokens,
        scan_prompts: args.scan_prompts,
        seed: args.seed,
    }
}

/// `--planner-sessions`: the planner's curve against exact replays.
fn planner_section(args: &EvictionArgs, layout: &KvLayout) -> anyhow::Result<Value> {
    let tokenizer = tokenizer(args)?;
    let chain = KeyChain::new(b"bench-eviction", &ModelFingerprint([7; 32]), layout);
    let trace = traces::agentic(
        &|text| tokenizer.encode(text, true),
        &chain,
        &shape(args, args.planner_sessions),
    );
    planner::report(&trace, *layout, &args.node_config(), args.planner_rate)
}

/// The traces to replay: the file's, or the generated ones.
fn load_traces(args: &EvictionArgs, layout: &KvLayout) -> anyhow::Result<Vec<Trace>> {
    if let Some(path) = &args.trace {
        return Ok(vec![match args.trace_format {
            TraceFormat::Jsonl => file::load(path, layout)?,
            TraceFormat::Mooncake => mooncake::load(path, layout)?,
        }]);
    }
    let tokenizer = tokenizer(args)?;
    let chain = KeyChain::new(b"bench-eviction", &ModelFingerprint([7; 32]), layout);
    Ok(traces::all(
        &|text| tokenizer.encode(text, true),
        &chain,
        &shape(args, args.sessions),
    ))
}

/// Every policy and MIN on `trace` at each capacity.
pub fn measure_trace(trace: &Trace, layout: KvLayout, base: &NodeConfig) -> anyhow::Result<Value> {
    let never = replay(trace, layout, base, EvictionPolicy::Lru, None)?;
    let consistent = bound::prefix_consistent(&trace.requests);
    let mut rows = Vec::new();
    for frac in CAPACITY_FRACTIONS {
        let cap = ((trace.capacity_base as f64 * frac) as usize).max(1);
        let min = min::min_hits(&trace.requests, cap, trace.block_tokens);
        let bound = bound::block_min_hits(&trace.requests, cap, trace.block_tokens);
        let mut pol = serde_json::Map::new();
        for (name, policy) in POLICIES {
            let (h, store) = replay_store(trace, layout, base, policy, Some(cap))?;
            let mut row = json!({
                "hit_ratio": h.ratio(),
                "ratio_to_min": h.ratio() / min.ratio().max(f64::MIN_POSITIVE),
                "ratio_to_bound": h.ratio() / bound.ratio().max(f64::MIN_POSITIVE),
                "agent_hit_ratio": h.agent_ratio(),
            });
            // adaptive: its mode at the end, switches and shadow hits (why
            // it lands where it does).
            if let Some(st) = store.adaptive_stats() {
                row["adaptive_stats"] = serde_json::to_value(st)?;
            }
            pol.insert(name.into(), row);
        }
        rows.push(json!({
            "capacity_fraction": frac,
            "capacity_blocks": cap,
            "min_hit_ratio": min.ratio(),
            "min_agent_hit_ratio": min.agent_ratio(),
            "bound_hit_ratio": bound.ratio(),
            "policies": pol,
        }));
    }
    Ok(json!({
        "name": trace.name,
        "requests": trace.requests.len(),
        "agent_requests": trace.requests.iter().filter(|r| r.agent).count(),
        "distinct_blocks": trace.distinct_blocks(),
        "capacity_base_blocks": trace.capacity_base,
        "prefix_consistent": consistent,
        "never_evict_hit_ratio": never.ratio(),
        "capacities": rows,
    }))
}

/// Measure everything and return the report object.
pub fn measure(args: &EvictionArgs) -> anyhow::Result<Value> {
    anyhow::ensure!(
        args.sessions > 1 && args.turns > 1 && args.block_tokens > 0,
        "--sessions and --turns must be > 1, --block-tokens > 0"
    );
    let layout = small_layout(args.block_tokens);
    let traces = load_traces(args, &layout)?;
    let mut out = Vec::new();
    let cfg = args.node_config();
    for t in &traces {
        out.push(measure_trace(t, layout, &cfg)?);
    }
    let scan = scan_summary(&out);
    let planner = if args.planner_sessions > 0 && args.trace.is_none() {
        planner_section(args, &layout)?
    } else {
        Value::Null
    };
    Ok(json!({
        "block_tokens": args.block_tokens,
        "lirs": {
            "hir_percent": args.lirs_hir_percent,
            "history": args.lirs_history,
            "idle_factor": args.lirs_idle_factor,
        },
        "adaptive": {
            "window": cfg.adaptive_window,
            "margin": cfg.adaptive_margin,
            "confidence": cfg.adaptive_confidence,
            "start": cfg.adaptive_start,
        },
        "watermarks": { "high": cfg.high_watermark, "low": cfg.low_watermark },
        "policies": POLICIES.iter().map(|p| p.0).collect::<Vec<_>>(),
        "traces": out,
        "scan_vs_agentic": scan,
        "planner": planner,
    }))
}

/// The agents' hit ratio with the scan running over without it (the agentic
/// trace, same tier size), per policy and capacity.
fn scan_summary(traces: &[Value]) -> Value {
    let by = |n: &str| traces.iter().find(|t| t["name"] == n);
    let (Some(a), Some(s)) = (by("agentic"), by("scan")) else {
        return Value::Null;
    };
    let mut rows = Vec::new();
    let empty = Vec::new();
    let (ac, sc) = (
        a["capacities"].as_array().unwrap_or(&empty),
        s["capacities"].as_array().unwrap_or(&empty),
    );
    for (ra, rs) in ac.iter().zip(sc) {
        let mut pol = serde_json::Map::new();
        for (name, _) in POLICIES {
            let without = ra["policies"][name]["agent_hit_ratio"]
                .as_f64()
                .unwrap_or(0.0);
            let with = rs["policies"][name]["agent_hit_ratio"]
                .as_f64()
                .unwrap_or(0.0);
            pol.insert(
                name.into(),
                json!({"without": without, "with": with, "ratio": with / without.max(f64::MIN_POSITIVE)}),
            );
        }
        rows.push(json!({"capacity_fraction": ra["capacity_fraction"], "policies": pol}));
    }
    Value::Array(rows)
}

fn print_table(report: &Value) {
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    for p in report["planner"]["points"].as_array().into_iter().flatten() {
        println!(
            "planner {:<7} at {:>3.0}%: exact {:.3}, estimated {:.3}",
            p["policy"].as_str().unwrap_or("?"),
            f(&p["capacity_fraction"]) * 100.0,
            f(&p["exact_hit_ratio"]),
            f(&p["estimated_hit_ratio"])
        );
    }
    for t in report["traces"].as_array().into_iter().flatten() {
        println!(
            "{}: {} requests, {} distinct blocks, never-evict hit ratio {:.3}, prefix-consistent {}",
            t["name"].as_str().unwrap_or("?"),
            t["requests"],
            t["distinct_blocks"],
            f(&t["never_evict_hit_ratio"]),
            t["prefix_consistent"]
        );
        print!(
            "  {:>9} {:>7} {:>6} {:>6}",
            "capacity", "blocks", "min", "bound"
        );
        for (name, _) in POLICIES {
            print!(" {name:>14}");
        }
        println!();
        for r in t["capacities"].as_array().into_iter().flatten() {
            print!(
                "  {:>8.0}% {:>7} {:>6.3} {:>6.3}",
                f(&r["capacity_fraction"]) * 100.0,
                r["capacity_blocks"],
                f(&r["min_hit_ratio"]),
                f(&r["bound_hit_ratio"])
            );
            for (name, _) in POLICIES {
                let p = &r["policies"][name];
                print!(
                    " {:>6.3} ({:>4.2})",
                    f(&p["hit_ratio"]),
                    f(&p["ratio_to_min"])
                );
            }
            println!();
        }
    }
    for r in report["scan_vs_agentic"].as_array().into_iter().flatten() {
        print!(
            "scan, agents with/without at {:>3.0}%:",
            f(&r["capacity_fraction"]) * 100.0
        );
        for (name, _) in POLICIES {
            print!(" {name} {:.2}", f(&r["policies"][name]["ratio"]));
        }
        println!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    fn shape() -> Shape {
        Shape {
            sessions: 4,
            turns: 3,
            system_tokens: 300,
            history_tokens: 200,
            answer_tokens: 20,
            scan_prompts: 30,
            seed: 3,
        }
    }

    #[test]
    fn watermarks_flag_takes_high_then_low_and_refuses_bad_pairs() {
        assert_eq!(parse_watermarks("0.95,0.85"), Ok((0.95, 0.85)));
        assert_eq!(parse_watermarks("1.0, 1.0"), Ok((1.0, 1.0)));
        for bad in ["0.85,0.95", "1.2,0.5", "0.9,0", "0.9", "a,b"] {
            assert!(parse_watermarks(bad).is_err(), "{bad} accepted");
        }
    }

    /// The never-evicting replay of the agentic trace hits exactly what the
    /// trace's own oracle says; MIN with room for everything matches it; on
    /// a small tier no policy beats MIN, and each hits less than the oracle.
    #[test]
    fn replay_matches_the_oracle_and_no_policy_beats_min() {
        let layout = small_layout(16);
        let chain = KeyChain::new(b"t", &ModelFingerprint([1; 32]), &layout);
        let all = traces::all(&bytes, &chain, &shape());
        assert_eq!(all.len(), 5);
        let agentic = &all[0];
        let cfg = replay::one_at_a_time();
        let never = replay(agentic, layout, &cfg, EvictionPolicy::Lru, None).unwrap();
        let full = min::min_hits(&agentic.requests, agentic.distinct_blocks(), 16);
        assert_eq!(never.hit, full.hit);
        for t in &all {
            let cap = t.capacity_base / 4;
            let m = min::min_hits(&t.requests, cap, 16);
            for (name, policy) in POLICIES {
                let h = replay(t, layout, &cfg, policy, Some(cap)).unwrap();
                assert!(
                    h.hit <= m.hit,
                    "{} {name}: {} > MIN {}",
                    t.name,
                    h.hit,
                    m.hit
                );
            }
        }
    }
}
