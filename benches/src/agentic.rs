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

mod args;
mod compare;
mod configuration;
pub mod driver;
pub mod dtype;
pub mod engines;
pub mod eviction;
pub mod fabric;
pub mod routing;
pub mod stats;
pub mod trace;

use std::sync::Arc;

use anyhow::{anyhow, Context};
use kvfabric_engine::model::LlamaModel;
use serde_json::{json, Value};

use engines::stats_json;
use fabric::FabricCluster;
use kvfabric_router::pick::Policy;
use stats::same_answers;
use trace::{Workload, WorkloadShape};

pub use args::AgenticArgs;
use configuration::{run_configuration, save_on_off, Reuse};

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
    anyhow::ensure!(
        args.prefix_session_weight.is_finite() && args.prefix_session_weight >= 0.0,
        "--prefix-session-weight must be a number >= 0"
    );
    let path = crate::model_file(&args.model)?;
    anyhow::ensure!(args.engines > 0, "--engines must be > 0");
    anyhow::ensure!(args.answer_tokens > 0, "--answer-tokens must be > 0");
    let model = Arc::new(LlamaModel::load(&path, |_, _| {}).context("loading the model")?);
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
    let hosts = crate::hosts::Hosts::optional(args.hosts, args.link_gbit)?;
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
        "kv_pool_mib": args.kv_pool_mib,
        "node_ram_mib": args.node_ram_mib,
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
    use std::path::PathBuf;

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
            prefix_session_weight: kvfabric_router::pick::DEFAULT_PREFIX_SESSION_WEIGHT,
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
            adaptive_node_feed: false,
            watermarks: (1.0, 1.0),
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
