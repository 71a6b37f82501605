//! `bench agentic --compare-eviction POLICY`: the RAM tier's eviction order
//! on the real engine. Only the fabric configuration runs, once with
//! the default order and once with POLICY, each on fresh engines and a
//! fresh cluster whose nodes' RAM tiers together hold `--ram-fraction` of
//! the trace's distinct blocks, no disk tier. Both watermarks are 1.0 (a
//! full tier evicts one block per put), as in `bench eviction`, so the tier
//! holds exactly that many blocks; `--watermarks 0.95,0.85` runs a node's
//! default (a full tier evicts ~10% at once). Reported per order: the run's summary
//! (token hit ratio, TTFT p50/p90), the blocks held and evicted at the end;
//! and the default's hit ratio and TTFT p50 over POLICY's, same run.
//!
//! The distinct blocks come from the trace's token counts before it runs:
//! answers are greedy with no stop token, so every answer has
//! `--answer-tokens` tokens and each session's last request computes its
//! whole context; the shared system prompt's full blocks count once.

use std::sync::Arc;

use kvfabric_engine::kv::KvPool;
use kvfabric_engine::model::LlamaModel;
use kvfabric_router::pick::Policy;
use kvfabric_store::{EvictionPolicy, NodeConfig};
use serde_json::{json, Map, Value};

use super::args::AgenticArgs;
use super::configuration::{run_configuration, ConfigRun, Reuse};
use super::engines::engine_config;
use super::fabric::FabricCluster;
use super::stats::same_answers;
use super::trace::Workload;

/// `--compare-eviction` and `--ram-fraction` checked before the model
/// loads: the order to compare with the default (None: not asked for).
pub(super) fn check(
    args: &AgenticArgs,
    routing_modes: usize,
) -> anyhow::Result<Option<EvictionPolicy>> {
    let Some(n) = &args.compare_eviction else {
        return Ok(None);
    };
    let other = match n.trim() {
        "lru" => EvictionPolicy::Lru,
        "s3fifo" => EvictionPolicy::S3fifo,
        "lirs" => EvictionPolicy::Lirs,
        "adaptive" => EvictionPolicy::Adaptive,
        "door" => EvictionPolicy::Door,
        other => {
            anyhow::bail!(
                "--compare-eviction: {other:?} is not lru, s3fifo, lirs, adaptive or door"
            )
        }
    };
    anyhow::ensure!(
        other != NodeConfig::default().eviction,
        "--compare-eviction {} is the default order already",
        name(other)
    );
    anyhow::ensure!(
        args.ram_fraction > 0.0 && args.ram_fraction <= 1.0,
        "--ram-fraction must be in (0, 1]"
    );
    anyhow::ensure!(
        args.hosts == 0 && routing_modes == 1,
        "--compare-eviction runs on one host (--hosts 0) with one --routing mode"
    );
    Ok(Some(other))
}

fn name(p: EvictionPolicy) -> &'static str {
    match p {
        EvictionPolicy::Lru => "lru",
        EvictionPolicy::S3fifo => "s3fifo",
        EvictionPolicy::Lirs => "lirs",
        EvictionPolicy::Adaptive => "adaptive",
        EvictionPolicy::Door => "door",
    }
}

/// Distinct blocks the trace computes (see the module doc).
pub fn distinct_blocks(workload: &Workload, answer_tokens: usize, block_tokens: usize) -> usize {
    // Each session's last turn holds all its earlier turns as prefixes; the
    // answers (unknown before the run) are placeholders of the right length.
    let last_turns: Vec<(Vec<u32>, Vec<u32>)> = (0..workload.users.len())
        .map(|s| {
            let turns = workload.users[s].len();
            let answers = vec![vec![0u32; answer_tokens]; turns.saturating_sub(1)];
            (workload.prompt(s, &answers), vec![0u32; answer_tokens])
        })
        .collect();
    let seqs = last_turns.iter().map(|(p, a)| (p.as_slice(), a.as_slice()));
    super::dtype::distinct_blocks(seqs, block_tokens)
}

/// What a run's nodes held at its end: RAM blocks and evictions (all
/// nodes), and each node's `adaptive` order (mode, shadow hits).
struct Held {
    blocks: u64,
    evictions: u64,
    adaptive: Vec<Option<kvfabric_store::AdaptiveStats>>,
}

/// One order's run on its own cluster of `per_node` blocks per node.
async fn run_order(
    args: &AgenticArgs,
    model: &Arc<LlamaModel>,
    workload: &Workload,
    routing: Policy,
    (eviction, per_node, slot): (EvictionPolicy, u64, u64),
) -> anyhow::Result<(ConfigRun, Held)> {
    let cluster = FabricCluster::start_with(args.engines, None, |n: &mut NodeConfig| {
        n.ram_capacity = bytesize::ByteSize::b(per_node * slot);
        n.eviction = eviction;
        (n.high_watermark, n.low_watermark) = args.watermarks;
        n.adaptive_cluster_feed = !args.adaptive_node_feed;
    })
    .await?;
    let measured = async {
        let run = run_configuration(
            args,
            model,
            workload,
            Reuse::Fabric,
            Some(&cluster),
            routing,
        )
        .await?;
        let (blocks, evictions) = cluster.ram_blocks_and_evictions();
        let held = Held {
            blocks,
            evictions,
            adaptive: cluster.adaptive_stats(),
        };
        anyhow::Ok((run, held))
    }
    .await;
    cluster.stop().await;
    measured
}

/// Run the default order and `other` and report them side by side.
pub(super) async fn measure_eviction(
    args: &AgenticArgs,
    model: Arc<LlamaModel>,
    workload: &Workload,
    model_name: String,
    routing: Policy,
    other: EvictionPolicy,
) -> anyhow::Result<Value> {
    let default = NodeConfig::default().eviction;
    let cfg = engine_config(args.threads, args.kv_pool_mib, true);
    let c = &model.config;
    let layout = KvPool::layout_for(
        c.layers,
        c.kv_heads,
        c.head_dim,
        cfg.block_tokens,
        cfg.kv_dtype.into(),
    );
    // The arena gives each block a 4 KiB-aligned slot.
    let slot = (layout.block_bytes().div_ceil(4096) * 4096) as u64;
    let distinct = distinct_blocks(workload, args.answer_tokens, cfg.block_tokens);
    let total = ((distinct as f64 * args.ram_fraction).round() as u64).max(1);
    let per_node = total.div_ceil(args.engines as u64).max(1);
    let mut runs = Vec::new();
    for policy in [default, other] {
        let (run, held) =
            run_order(args, &model, workload, routing, (policy, per_node, slot)).await?;
        tracing::info!(
            order = name(policy),
            hit = run.summary.hit_ratio,
            "eviction order done"
        );
        runs.push((policy, run, held));
    }
    let mut orders = Map::new();
    for (p, run, held) in &runs {
        let mut m = run.summary.to_json();
        m["ram_blocks_at_end"] = json!(held.blocks);
        m["ram_evictions"] = json!(held.evictions);
        m["adaptive_per_node"] = json!(held.adaptive);
        orders.insert(name(*p).to_owned(), m);
    }
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let (d, o) = (&runs[0].1.summary, &runs[1].1.summary);
    Ok(json!({
        "model": model_name,
        "engines": args.engines,
        "sessions": args.sessions,
        "turns": args.turns,
        "rate": args.rate,
        "answer_tokens": args.answer_tokens,
        "seed": args.seed,
        "routing": routing.as_str(),
        "block_tokens": cfg.block_tokens,
        "distinct_blocks": distinct,
        "ram_fraction": args.ram_fraction,
        "adaptive_cluster_feed": !args.adaptive_node_feed,
        "watermarks": { "high": args.watermarks.0, "low": args.watermarks.1 },
        "ram_blocks_per_node": per_node,
        "ram_bytes_per_node": per_node * slot,
        "default_eviction": name(default),
        "compared_eviction": name(other),
        "eviction": orders,
        "oracle_hit_ratio": d.oracle_hit_ratio,
        "answers_identical": same_answers(&runs[0].1.records, &runs[1].1.records),
        "default_over_compared_hit_ratio": ratio(d.hit_ratio, o.hit_ratio),
        "default_over_compared_ttft_p50": ratio(d.ttft_p50_ms, o.ttft_p50_ms),
    }))
}

/// The table of a `--compare-eviction` report.
pub(super) fn print_table(report: &Value) {
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    println!(
        "agentic eviction: {} engines, {} sessions x {} turns; RAM tiers hold {:.0}% of {} distinct blocks ({} per node), no disk",
        report["engines"],
        report["sessions"],
        report["turns"],
        f(&report["ram_fraction"]) * 100.0,
        report["distinct_blocks"],
        report["ram_blocks_per_node"]
    );
    for (name, m) in report["eviction"].as_object().into_iter().flatten() {
        let modes: Vec<&str> = m["adaptive_per_node"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| s["mode"].as_str().unwrap_or("-"))
            .collect();
        println!(
            "  {name:<7} hit ratio {:.3}  TTFT p50 {:.1} ms  p90 {:.1} ms  evictions {}  adaptive modes [{}]",
            f(&m["hit_ratio"]),
            f(&m["ttft_p50_ms"]),
            f(&m["ttft_p90_ms"]),
            m["ram_evictions"],
            modes.join(", ")
        );
    }
    println!(
        "  {} / {}: hit ratio x{:.2}, TTFT p50 x{:.2} (oracle {:.3}); answers identical: {}",
        report["default_eviction"].as_str().unwrap_or("?"),
        report["compared_eviction"].as_str().unwrap_or("?"),
        f(&report["default_over_compared_hit_ratio"]),
        f(&report["default_over_compared_ttft_p50"]),
        f(&report["oracle_hit_ratio"]),
        report["answers_identical"]
    );
}

#[cfg(test)]
mod tests {
    use super::super::trace::WorkloadShape;
    use super::*;

    /// The estimate counts each session's context once and the shared
    /// system prompt's full blocks once (bytes as tokens).
    #[test]
    fn distinct_blocks_counts_the_shared_prefix_once() {
        let shape = WorkloadShape {
            sessions: 3,
            turns: 2,
            system_tokens: 300,
            history_tokens: 200,
        };
        let w = Workload::generate(&|s| s.bytes().map(u32::from).collect(), 1, &shape);
        let bt = 16;
        let mut keys = std::collections::HashSet::new();
        for s in 0..3 {
            let mut ctx = w.prompt(s, &[vec![7; 5]]);
            ctx.extend_from_slice(&[7; 4]);
            for b in 0..ctx.len() / bt {
                keys.insert(ctx[..(b + 1) * bt].to_vec());
            }
        }
        assert_eq!(distinct_blocks(&w, 5, bt), keys.len());
    }
}
