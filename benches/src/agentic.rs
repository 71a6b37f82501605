//! `kvfabric bench agentic`: multi-turn agent sessions over several engines
//! with random routing, the workload kvfabric exists for.
//!
//! S sessions x T turns (in the spirit of LMCache's multi-round-qa): a shared
//! ~1000-token system prompt with tool definitions, then per session its own
//! ~1500-token context (earlier turns and tool output, as multi-round-qa's
//! user history prompt) and a history that grows every turn by the previous
//! answer and a new user message ([`trace`]). Turns are sent at most `--rate` per second, each
//! routed uniformly at random (fixed by seed) to one of N in-process engines
//! driven at the token level ([`driver`]). The same trace runs three times,
//! on fresh engines each time:
//! - `none`: no prefix reuse at all (every prompt fully prefilled);
//! - `local`: each engine's own prefix cache only — what engines with prefix
//!   caching get under random routing (a session's history is reused only
//!   when two of its turns land on the same engine);
//! - `fabric`: every engine embeds a node of one kvfabric cluster (etcd
//!   membership, loopback) and reuses prefixes any engine computed.
//!
//! Reported per configuration: prompt / cached tokens, token hit ratio, TTFT
//! p50/p90, end-to-end p50, tokens/s; plus the oracle hit ratio (the most a
//! cache of whole blocks could reuse on this trace), whether all three runs
//! produced the same answers (greedy over bit-exact KV must), and the decode
//! step time of a batch with the connector saving on vs off ([`fabric`]).
//! Targets are ratios measured in this run: fabric hit ratio / oracle >= 0.95,
//! local TTFT p50 / fabric TTFT p50 >= 5, save-on / save-off step <= 1.05.
//!
//! `--routing` picks how turns are routed ([`routing`]: the router crate's
//! policies `random`, `least-loaded`, `affinity`, `prefix`). Given several
//! (`--routing random,prefix`), the bench compares them instead
//! ([`compare`]): only the fabric configuration, once per mode on a fresh
//! cluster, reporting per mode hit ratio, bytes moved between nodes and TTFT.

mod compare;
pub mod driver;
pub mod dtype;
pub mod engines;
pub mod eviction;
pub mod fabric;
pub mod routing;
pub mod stats;
pub mod trace;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use kvfabric_engine::gguf::GgufFile;
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::tokenizer::Tokenizer;
use serde_json::{json, Value};

use driver::{drive, DriveParams};
use engines::{engine_config, stats_json, EngineSet};
use fabric::{decode_step, FabricCluster};
use kvfabric_engine::kv::KvPool;
use kvfabric_router::pick::{PickParams, Policy};
use kvfabric_store::KeyChain;
use routing::{BenchRouter, PrefixSource};
use stats::{same_answers, RunSummary};
use trace::{Workload, WorkloadShape};

/// Arguments of `kvfabric bench agentic`.
#[derive(clap::Args, Debug, Clone)]
pub struct AgenticArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// GGUF model (default: the fetched SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Engines the requests are spread over.
    #[arg(long, default_value_t = 3)]
    pub engines: usize,
    /// Concurrent agent sessions.
    #[arg(long, default_value_t = 4)]
    pub sessions: usize,
    /// Turns per session.
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// Most requests sent per second (0 = each turn as soon as it is ready).
    #[arg(long, default_value_t = 2.0)]
    pub rate: f64,
    /// Tokens generated per turn (greedy, no stop token).
    #[arg(long, default_value_t = 16)]
    pub answer_tokens: usize,
    /// Seed of the workload text and the routing.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Routing of the turns: random, least-loaded, affinity or prefix; a
    /// comma-separated list compares the modes (fabric configuration only).
    /// `prefix` needs the fabric (its index comes from the nodes' KV events):
    /// in the none/local configurations it has no index and routes as least-loaded.
    #[arg(long, value_delimiter = ',', default_value = "random")]
    pub routing: Vec<String>,
    /// `prefix` routing: weight of the prompt tokens an engine would still
    /// have to compute against the tokens it has in flight (Dynamo's
    /// overlap weight; 1 = the router's default).
    #[arg(long, default_value_t = 1.0)]
    pub prefix_overlap_weight: f64,
    /// Start every session at once (default: each session joins when the
    /// previous one's first turn is answered, so the shared system prompt is
    /// computed once before the others arrive).
    #[arg(long)]
    pub burst_start: bool,
    /// Tokens of the shared system prompt (grown tool definition by tool definition).
    #[arg(long, default_value_t = 1000)]
    pub system_tokens: usize,
    /// Tokens of context each session starts with (its earlier turns and
    /// tool output; multi-round-qa's `--user-history-prompt`, 2000 in its
    /// example: 1500 keeps the default run under 10 minutes here).
    /// 0 = sessions start from the system prompt alone.
    #[arg(long, default_value_t = 1500)]
    pub session_history_tokens: usize,
    /// Kernel threads per engine (0 = one per core).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// KV pool of each engine, MiB (512: two ~3.5k-token sessions at once).
    #[arg(long, default_value_t = 512)]
    pub kv_pool_mib: u64,
    /// RAM tier of each fabric node, MiB.
    #[arg(long, default_value_t = 1024)]
    pub node_ram_mib: u64,
    /// Sequences decoding at once in the save on/off step-time measurement.
    #[arg(long, default_value_t = 8)]
    pub step_batch: usize,
    /// Tokens each of them decodes.
    #[arg(long, default_value_t = 96)]
    pub step_tokens: usize,
    /// Save on/off measurements (alternated; the best of each is reported).
    #[arg(long, default_value_t = 3)]
    pub step_repeats: usize,
    /// Hosts (network namespaces; needs root) the fabric configuration's
    /// nodes run on, one per engine: 0 = all in this network namespace
    /// (loopback, shm), else equal to --engines (tcp between hosts).
    #[arg(long, default_value_t = 0)]
    pub hosts: usize,
    /// Rate of each host's link, Gbit/s (tbf; with --hosts).
    #[arg(long)]
    pub link_gbit: Option<f64>,
    /// Compare the RAM tier's default eviction order with this one (lru,
    /// s3fifo): only the fabric configuration, once per order, on RAM tiers
    /// holding --ram-fraction of the trace's distinct blocks, no disk.
    #[arg(long)]
    pub compare_eviction: Option<String>,
    /// With --compare-eviction: the nodes' RAM tiers together hold this
    /// fraction of the trace's distinct blocks.
    #[arg(long, default_value_t = 0.5)]
    pub ram_fraction: f64,
    /// KV dtype, and the dtype comparison (`--compare-dtype`, [`dtype`]).
    #[command(flatten)]
    pub dtype: dtype::DtypeArgs,
}

/// Run the bench and print its report.
pub fn run(args: &AgenticArgs) -> anyhow::Result<()> {
    crate::print_report(args.json, &measure(args)?, print_table)
}

/// Run the bench and return the report (what `--json` prints).
pub fn measure(args: &AgenticArgs) -> anyhow::Result<Value> {
    anyhow::ensure!(
        args.hosts == 0 || args.hosts == args.engines,
        "--hosts is 0 (one host) or --engines (one engine per host)"
    );
    anyhow::ensure!(
        args.link_gbit.is_none() || args.hosts > 0,
        "--link-gbit shapes the links between hosts: give --hosts"
    );
    let policies = parse_routing(&args.routing)?;
    let compare_eviction = eviction::check(args, policies.len())?;
    args.dtype.check(args.hosts)?;
    anyhow::ensure!(
        compare_eviction.is_none() || args.dtype.compare_dtype.is_none(),
        "--compare-eviction and --compare-dtype are separate runs: give one"
    );
    anyhow::ensure!(
        args.prefix_overlap_weight.is_finite() && args.prefix_overlap_weight >= 0.0,
        "--prefix-overlap-weight must be a number >= 0"
    );
    let path = crate::model_file(&args.model)?;
    anyhow::ensure!(args.engines > 0, "--engines must be > 0");
    anyhow::ensure!(args.answer_tokens > 0, "--answer-tokens must be > 0");
    let model = Arc::new(LlamaModel::load(&path, |_, _| {}).context("loading the model")?);
    let gguf = GgufFile::open(&path).context("opening the model")?;
    let tokenizer = Tokenizer::from_gguf(&gguf).context("building the tokenizer")?;
    drop(gguf);
    let workload = Workload::generate(
        &|text| tokenizer.encode(text, true),
        args.seed,
        &WorkloadShape {
            sessions: args.sessions,
            turns: args.turns,
            system_tokens: args.system_tokens,
            history_tokens: args.session_history_tokens,
        },
    );
    let args = args.clone();
    let model_name = path.display().to_string();
    if let Some(other) = compare_eviction {
        return crate::on_own_runtime(move |rt| {
            rt.block_on(eviction::measure_eviction(
                &args,
                model,
                &workload,
                model_name,
                policies[0],
                other,
            ))
        });
    }
    if let Some(other) = args.dtype.compare_dtype {
        return crate::on_own_runtime(move |rt| {
            rt.block_on(dtype::measure_dtypes(
                &args,
                model,
                &workload,
                model_name,
                policies[0],
                other,
            ))
        });
    }
    if policies.len() > 1 {
        return crate::on_own_runtime(move |rt| {
            rt.block_on(compare::measure_routing(
                &args, model, &workload, model_name, &policies,
            ))
        });
    }
    crate::on_own_runtime(move |rt| rt.block_on(measure_all(&args, model, &workload, model_name)))
}

/// The `--routing` list as policies (at least one, no repeats).
fn parse_routing(names: &[String]) -> anyhow::Result<Vec<Policy>> {
    let mut out = Vec::new();
    for n in names {
        let p = Policy::parse(n.trim()).ok_or_else(|| {
            anyhow!("--routing: {n:?} is not random, least-loaded, affinity or prefix")
        })?;
        anyhow::ensure!(!out.contains(&p), "--routing lists {n} twice");
        out.push(p);
    }
    anyhow::ensure!(!out.is_empty(), "--routing needs a mode");
    Ok(out)
}

/// Which prefix reuse a configuration has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reuse {
    None,
    Local,
    Fabric,
}

struct ConfigRun {
    summary: RunSummary,
    records: Vec<stats::RequestRecord>,
    connector: Option<kvfabric_connector::ConnectorStats>,
    /// Affinity picks that kept / moved a session.
    affinity: (u64, u64),
}

/// The router of one run: `policy` over the engines; for `prefix`, an index
/// fed by the fabric nodes' KV events and keys chained as the engines chain them.
fn bench_router(
    args: &AgenticArgs,
    model: &LlamaModel,
    cfg: &kvfabric_engine::EngineConfig,
    policy: Policy,
    fabric: Option<&FabricCluster>,
) -> BenchRouter {
    let prefix = match (policy, fabric) {
        (Policy::Prefix, Some(f)) => {
            let c = &model.config;
            let layout = KvPool::layout_for(
                c.layers,
                c.kv_heads,
                c.head_dim,
                cfg.block_tokens,
                cfg.kv_dtype.into(),
            );
            let chain = KeyChain::new(b"", &model.fingerprint(), &layout);
            let events = (0..args.engines).map(|i| f.kv_events(i)).collect();
            Some(PrefixSource::follow(events, chain, cfg.block_tokens))
        }
        _ => None,
    };
    let params = PickParams {
        prefix_overlap_weight: args.prefix_overlap_weight,
        ..PickParams::default()
    };
    BenchRouter::new(policy, params, args.seed, args.engines, prefix)
}

async fn run_configuration(
    args: &AgenticArgs,
    model: &Arc<LlamaModel>,
    workload: &Workload,
    reuse: Reuse,
    fabric: Option<&FabricCluster>,
    policy: Policy,
) -> anyhow::Result<ConfigRun> {
    let cfg = kvfabric_engine::EngineConfig {
        kv_dtype: args.dtype.kv_dtype.into(),
        ..engine_config(args.threads, args.kv_pool_mib, reuse != Reuse::None)
    };
    let mut router = bench_router(args, model, &cfg, policy, fabric);
    let connects = (0..args.engines)
        .map(|i| match (reuse, fabric) {
            (Reuse::Fabric, Some(f)) => Ok(Some(f.connect_fn(i, true))),
            (Reuse::Fabric, None) => Err(anyhow!("the fabric configuration needs a cluster")),
            _ => Ok(None),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let set = EngineSet::start(model, &cfg, connects)?;
    let params = DriveParams {
        rate: args.rate,
        answer_tokens: args.answer_tokens,
        seed: args.seed,
        burst_start: args.burst_start,
    };
    let handles = set.handles();
    let driven = drive(&handles, workload, &params, &mut router).await;
    drop(handles);
    let connectors = set.connectors();
    let connector = if connectors.is_empty() {
        None
    } else {
        // Counters once every save ended (pending_saves > 0 in the report
        // means they did not within 30 s).
        let flushed = connectors.clone();
        tokio::task::spawn_blocking(move || {
            flushed.iter().all(|c| c.flush(Duration::from_secs(30)))
        })
        .await
        .map_err(|e| anyhow!("flush task: {e}"))?;
        Some(connectors.iter().map(|c| c.stats()).sum())
    };
    drop(connectors);
    set.stop().await?;
    let (records, wall) = driven?;
    Ok(ConfigRun {
        summary: RunSummary::new(&records, cfg.block_tokens, wall),
        records,
        connector,
        affinity: (router.affinity_hits, router.affinity_fallbacks),
    })
}

/// Decode step time with saving on and off, alternated, best of each.
async fn save_on_off(
    args: &AgenticArgs,
    model: &Arc<LlamaModel>,
    fabric: &FabricCluster,
) -> anyhow::Result<(f64, f64, u64)> {
    let cfg = engine_config(args.threads, args.kv_pool_mib, true);
    let (mut on, mut off, mut saved) = (f64::MAX, f64::MAX, 0);
    for r in 0..args.step_repeats.max(1) {
        for save in [true, false] {
            let seed = args.seed.wrapping_mul(1000) + 2 * r as u64 + u64::from(save);
            let (step, s) = decode_step(
                model,
                &cfg,
                fabric.connect_fn(r, save),
                args.step_batch,
                100,
                args.step_tokens,
                seed,
            )
            .await?;
            let ms = step.as_secs_f64() * 1e3;
            if save {
                on = on.min(ms);
                saved += s;
            } else {
                off = off.min(ms);
                anyhow::ensure!(s == 0, "the save-off connector saved {s} blocks");
            }
        }
    }
    Ok((on, off, saved))
}

async fn measure_all(
    args: &AgenticArgs,
    model: Arc<LlamaModel>,
    workload: &Workload,
    model_name: String,
) -> anyhow::Result<Value> {
    let policy = parse_routing(&args.routing)?[0];
    let none = run_configuration(args, &model, workload, Reuse::None, None, policy).await?;
    let local = run_configuration(args, &model, workload, Reuse::Local, None, policy).await?;
    // One RAM tier per engine, enough for the whole trace and the step runs.
    let hosts = match args.hosts {
        0 => None,
        n => Some(crate::hosts::Hosts::up(n, args.link_gbit)?),
    };
    let fabric_nodes = FabricCluster::start_on(args.engines, args.node_ram_mib, hosts).await?;
    let measured = async {
        let fabric = run_configuration(
            args,
            &model,
            workload,
            Reuse::Fabric,
            Some(&fabric_nodes),
            policy,
        )
        .await?;
        let transfer = fabric_nodes.transfer_bytes_all().await?;
        let steps = save_on_off(args, &model, &fabric_nodes).await?;
        anyhow::Ok((fabric, transfer, steps))
    }
    .await;
    fabric_nodes.stop().await;
    let (fabric, transfer, (save_on, save_off, step_saved_blocks)) = measured?;
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let f = &fabric.summary;
    Ok(json!({
        "model": model_name,
        "engines": args.engines,
        "sessions": args.sessions,
        "turns": args.turns,
        "rate": args.rate,
        "answer_tokens": args.answer_tokens,
        "seed": args.seed,
        "routing": policy.as_str(),
        "burst_start": args.burst_start,
        "threads_per_engine": args.threads,
        "system_prompt_tokens": workload.system.len(),
        "session_history_tokens": args.session_history_tokens,
        "oracle_hit_ratio": f.oracle_hit_ratio,
        "none": none.summary.to_json(),
        "local": local.summary.to_json(),
        "fabric": f.to_json(),
        "fabric_connector": fabric.connector.as_ref().map(stats_json),
        "hosts": args.hosts,
        "link_gbit": args.link_gbit,
        // What the nodes' transfer engines moved during the fabric run.
        "fabric_transfer": crate::hosts::transfer_json(&transfer),
        "answers_identical": same_answers(&none.records, &local.records)
            && same_answers(&none.records, &fabric.records),
        "fabric_over_oracle": ratio(f.hit_ratio, f.oracle_hit_ratio),
        "local_over_fabric_ttft_p50": ratio(local.summary.ttft_p50_ms, f.ttft_p50_ms),
        "none_over_fabric_ttft_p50": ratio(none.summary.ttft_p50_ms, f.ttft_p50_ms),
        "save_on_step_ms": save_on,
        "save_off_step_ms": save_off,
        "save_on_over_off": ratio(save_on, save_off),
        "save_step_batch": args.step_batch,
        "save_step_saved_blocks": step_saved_blocks,
        "targets": {
            "fabric_over_oracle_min": 0.95,
            "local_over_fabric_ttft_p50_min": 5.0,
            "save_on_over_off_max": 1.05,
        },
    }))
}

fn print_table(report: &Value) {
    if report["routing"].is_object() {
        return compare::print_table(report);
    }
    if report["eviction"].is_object() {
        return eviction::print_table(report);
    }
    if report["dtypes"].is_object() {
        return dtype::print_table(report);
    }
    println!(
        "agentic bench: {} engines, {} sessions x {} turns, rate {}/s, {} answer tokens",
        report["engines"],
        report["sessions"],
        report["turns"],
        report["rate"],
        report["answer_tokens"]
    );
    println!(
        "  oracle hit ratio {:.3}",
        report["oracle_hit_ratio"].as_f64().unwrap_or(0.0)
    );
    println!(
        "  {:<8} {:>9} {:>12} {:>12} {:>12} {:>10}",
        "config", "hit", "ttft p50 ms", "ttft p90 ms", "e2e p50 ms", "tok/s"
    );
    for c in ["none", "local", "fabric"] {
        let r = &report[c];
        if r.is_null() {
            continue;
        }
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        println!(
            "  {c:<8} {:>9.3} {:>12.1} {:>12.1} {:>12.1} {:>10.1}",
            f("hit_ratio"),
            f("ttft_p50_ms"),
            f("ttft_p90_ms"),
            f("e2e_p50_ms"),
            f("tokens_per_s")
        );
    }
    for k in [
        "answers_identical",
        "fabric_over_oracle",
        "local_over_fabric_ttft_p50",
        "save_on_step_ms",
        "save_off_step_ms",
        "save_on_over_off",
    ] {
        if !report[k].is_null() {
            println!("  {k:<28} {}", report[k]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_path() -> Option<PathBuf> {
        let p = kvfabric_engine::model::reference_model_path();
        p.exists().then_some(p)
    }

    fn small_args(model: Option<PathBuf>) -> AgenticArgs {
        AgenticArgs {
            json: true,
            model,
            engines: 3,
            sessions: 4,
            turns: 4,
            rate: 2.0,
            answer_tokens: 16,
            seed: 1,
            routing: vec!["random".into()],
            prefix_overlap_weight: 1.0,
            burst_start: false,
            system_tokens: 1000,
            session_history_tokens: 1500,
            threads: 1,
            kv_pool_mib: 512,
            node_ram_mib: 1024,
            step_batch: 8,
            step_tokens: 96,
            step_repeats: 3,
            hosts: 0,
            link_gbit: None,
            compare_eviction: None,
            ram_fraction: 0.5,
            dtype: dtype::DtypeArgs::default(),
        }
    }

    #[test]
    fn a_missing_model_or_bad_counts_are_refused() {
        let err = measure(&small_args(None)).expect_err("no model");
        assert!(err.to_string().contains("--model"), "{err}");
        let err = measure(&small_args(Some("/nonexistent/m.gguf".into()))).expect_err("missing");
        assert!(err.to_string().contains("kvfabric model fetch"), "{err}");
        if let Some(m) = model_path() {
            let args = AgenticArgs {
                engines: 0,
                ..small_args(Some(m))
            };
            let err = measure(&args).expect_err("no engines");
            assert!(err.to_string().contains("--engines"), "{err}");
        }
        for bad in [
            vec!["sticky".to_owned()],
            vec!["random".into(), "random".into()],
        ] {
            let args = AgenticArgs {
                routing: bad,
                ..small_args(None)
            };
            let err = measure(&args).expect_err("bad routing");
            assert!(err.to_string().contains("--routing"), "{err}");
        }
        for (order, fraction) in [("fifo", 0.5), ("lirs", 0.5), ("lru", 0.0), ("lru", 1.5)] {
            let args = AgenticArgs {
                compare_eviction: Some(order.into()),
                ram_fraction: fraction,
                ..small_args(None)
            };
            let err = measure(&args).expect_err("bad --compare-eviction");
            assert!(err.to_string().contains("--"), "{err}");
        }
    }

    /// The whole bench with its defaults, in release: `cargo test -p
    /// kvfabric-benches --release -- --ignored agentic --nocapture`.
    #[test]
    #[ignore = "runs the full bench (minutes); needs the fetched model"]
    fn agentic_bench_runs_with_defaults() {
        let model = model_path().expect("reference model (kvfabric model fetch)");
        let args = small_args(Some(model));
        let report = measure(&args).expect("bench");
        println!("{}", serde_json::to_string_pretty(&report).expect("json"));
        assert_eq!(report["answers_identical"], true);
    }

    /// Longer sessions (8 turns): histories grow, so a miss under random
    /// routing costs more. `cargo test -p kvfabric-benches --release --
    /// --ignored agentic_long --nocapture`.
    #[test]
    #[ignore = "runs the full bench with 8 turns (minutes); needs the fetched model"]
    fn agentic_long_sessions() {
        let model = model_path().expect("reference model (kvfabric model fetch)");
        let args = AgenticArgs {
            turns: 8,
            step_repeats: 1,
            hosts: 0,
            link_gbit: None,
            ..small_args(Some(model))
        };
        let report = measure(&args).expect("bench");
        println!("{}", serde_json::to_string_pretty(&report).expect("json"));
        assert_eq!(report["answers_identical"], true);
    }
}
