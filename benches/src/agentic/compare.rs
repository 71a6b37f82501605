//! `bench agentic --routing a,b,...`: the routing modes compared on the
//! fabric configuration. Each mode replays the same trace on fresh engines
//! and a fresh cluster (so no mode starts with blocks another computed) and
//! reports hit ratio, bytes moved between nodes (the transfer engines'
//! remote-read bytes), TTFT p50/p90, and whether every mode produced the
//! same answers (greedy over bit-exact KV must). With `--hosts N`, each
//! mode also gets its own test bed of N network-namespace hosts, so loads
//! cross the (rate-limited) links where the bytes a mode moves cost time.
//! Target, against `random` measured in the same run: `prefix` moves <=
//! 0.5x its bytes at a TTFT p50 no worse.

use std::sync::Arc;

use kvfabric_engine::model::LlamaModel;
use kvfabric_router::pick::Policy;
use serde_json::{json, Map, Value};

use super::args::AgenticArgs;
use super::configuration::{run_configuration, ConfigRun, Reuse};
use super::fabric::FabricCluster;
use super::stats::same_answers;
use super::trace::Workload;

/// Bytes the nodes read from other nodes (all transports).
fn bytes_moved(transfer: &std::collections::BTreeMap<(String, String), u64>) -> u64 {
    transfer
        .iter()
        .filter(|((_, direction), _)| direction == "read")
        .map(|(_, v)| v)
        .sum()
}

/// One mode's run on its own cluster; (run, bytes moved).
async fn run_mode(
    args: &AgenticArgs,
    model: &Arc<LlamaModel>,
    workload: &Workload,
    policy: Policy,
) -> anyhow::Result<(ConfigRun, u64)> {
    let hosts = crate::hosts::Hosts::optional(args.hosts, args.link_gbit)?;
    let cluster = FabricCluster::start_on(args.engines, args.node_ram_mib, hosts).await?;
    let measured = async {
        let run =
            run_configuration(args, model, workload, Reuse::Fabric, Some(&cluster), policy).await?;
        let transfer = cluster.transfer_bytes_all().await?;
        anyhow::Ok((run, bytes_moved(&transfer)))
    }
    .await;
    cluster.stop().await;
    measured
}

/// Run every mode of `policies` and report them side by side.
pub(super) async fn measure_routing(
    args: &AgenticArgs,
    model: Arc<LlamaModel>,
    workload: &Workload,
    model_name: String,
    policies: &[Policy],
) -> anyhow::Result<Value> {
    let mut runs = Vec::new();
    for &p in policies {
        let (run, moved) = run_mode(args, &model, workload, p).await?;
        tracing::info!(routing = %p, moved, hit = run.summary.hit_ratio, "routing mode done");
        runs.push((p, run, moved));
    }
    let mut modes = Map::new();
    for (p, run, moved) in &runs {
        let mut m = run.summary.to_json();
        m["bytes_moved"] = json!(moved);
        m["affinity_hits"] = json!(run.affinity.0);
        m["affinity_fallbacks"] = json!(run.affinity.1);
        modes.insert(p.as_str().to_owned(), m);
    }
    let identical = runs
        .windows(2)
        .all(|w| same_answers(&w[0].1.records, &w[1].1.records));
    let find = |p: Policy| runs.iter().find(|(q, ..)| *q == p);
    let ratio = |a: f64, b: f64| if b > 0.0 { Some(a / b) } else { None };
    let (prefix_over_random_bytes, prefix_over_random_ttft_p50) =
        match (find(Policy::Prefix), find(Policy::Random)) {
            (Some((_, pr, pb)), Some((_, rr, rb))) => (
                ratio(*pb as f64, *rb as f64),
                ratio(pr.summary.ttft_p50_ms, rr.summary.ttft_p50_ms),
            ),
            _ => (None, None),
        };
    Ok(json!({
        "model": model_name,
        "engines": args.engines,
        "hosts": args.hosts,
        "link_gbit": args.link_gbit,
        "sessions": args.sessions,
        "turns": args.turns,
        "rate": args.rate,
        "answer_tokens": args.answer_tokens,
        "seed": args.seed,
        "prefix_overlap_weight": args.prefix_overlap_weight,
        "prefix_session_weight": args.prefix_session_weight,
        "burst_start": args.burst_start,
        "threads_per_engine": args.threads,
        "system_prompt_tokens": workload.system.len(),
        "session_history_tokens": args.session_history_tokens,
        "oracle_hit_ratio": runs.first().map(|r| r.1.summary.oracle_hit_ratio),
        "routing": Value::Object(modes),
        "answers_identical": identical,
        "prefix_over_random_bytes": prefix_over_random_bytes,
        "prefix_over_random_ttft_p50": prefix_over_random_ttft_p50,
        "targets": {
            "prefix_over_random_bytes_max": 0.5,
            "prefix_over_random_ttft_p50_max": 1.0,
        },
    }))
}

/// The table of a comparison report.
pub(super) fn print_table(report: &Value) {
    println!(
        "agentic bench, routing compared: {} engines, {} sessions x {} turns",
        report["engines"], report["sessions"], report["turns"]
    );
    println!(
        "  {:<13} {:>7} {:>14} {:>12} {:>12}",
        "routing", "hit", "bytes moved", "ttft p50 ms", "ttft p90 ms"
    );
    if let Some(modes) = report["routing"].as_object() {
        for (name, m) in modes {
            let f = |k: &str| m[k].as_f64().unwrap_or(0.0);
            println!(
                "  {name:<13} {:>7.3} {:>14} {:>12.1} {:>12.1}",
                f("hit_ratio"),
                m["bytes_moved"],
                f("ttft_p50_ms"),
                f("ttft_p90_ms")
            );
        }
    }
    for k in [
        "answers_identical",
        "prefix_over_random_bytes",
        "prefix_over_random_ttft_p50",
    ] {
        println!("  {k:<28} {}", report[k]);
    }
}
