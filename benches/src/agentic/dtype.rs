//! `bench agentic --compare-dtype f32`: the KV dtype's effect on the hit
//! ratio of a RAM tier too small for the trace.
//!
//! The fabric configuration runs twice, on fresh engines and a fresh cluster
//! each time: with `--kv-dtype` (default f16) and with the compared dtype.
//! Both runs get the same RAM tiers, sized from the trace: together the
//! nodes hold `--compare-ram-fraction` (default 0.25) of the trace's
//! distinct KV bytes in f32 ([`distinct_blocks`] x the f32 block size), split
//! evenly over the nodes. A dtype of half the bytes fits twice the blocks in
//! the same tier, so its token hit ratio should be higher.
//!
//! The RAM tier stores blocks as they are (the block codec applies to the
//! disk tier and not to RAM; the nodes of this bench have no disk tier), so
//! what this measures is the dtype's bytes, not the codec's.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use kvfabric_engine::kv::KvPool;
use kvfabric_engine::model::LlamaModel;
use kvfabric_router::pick::Policy;
use kvfabric_store::DType;
use serde_json::{json, Map, Value};

use super::args::AgenticArgs;
pub use super::args::DtypeArgs;
use super::configuration::{run_configuration, ConfigRun, Reuse};
use super::engines::stats_json;
use super::fabric::FabricCluster;
use super::stats::same_answers;
use super::trace::Workload;

/// Distinct full blocks of KV the sequences `(prompt, answer)` compute (the
/// prompt and all answer tokens but the last), counted by their whole
/// prefix, as the fabric's chained block keys count them.
pub fn distinct_blocks<'a>(
    seqs: impl IntoIterator<Item = (&'a [u32], &'a [u32])>,
    block_tokens: usize,
) -> usize {
    let bt = block_tokens.max(1);
    let mut seen = HashSet::new();
    for (prompt, answer) in seqs {
        let computed = answer.len().saturating_sub(1);
        let tokens: Vec<u32> = prompt.iter().chain(&answer[..computed]).copied().collect();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for block in tokens.chunks_exact(bt) {
            block.hash(&mut h);
            seen.insert(h.finish());
        }
    }
    seen.len()
}

/// The trace's distinct blocks before it runs: answers are not known yet,
/// so each is `answer_tokens` placeholder tokens (the count only depends on
/// where prompts share prefixes, which the answers do not change).
fn planned_blocks(workload: &Workload, answer_tokens: usize, block_tokens: usize) -> usize {
    let answer = vec![0u32; answer_tokens];
    let mut seqs = Vec::new();
    for s in 0..workload.users.len() {
        for t in 0..workload.users[s].len() {
            seqs.push((workload.prompt(s, &vec![answer.clone(); t]), answer.clone()));
        }
    }
    distinct_blocks(
        seqs.iter().map(|(p, a)| (p.as_slice(), a.as_slice())),
        block_tokens,
    )
}

/// Run the fabric configuration with `args.dtype.kv_dtype` and with the
/// compared dtype, at the same RAM tiers, and report both.
pub(super) async fn measure_dtypes(
    args: &AgenticArgs,
    model: Arc<LlamaModel>,
    workload: &Workload,
    model_name: String,
    policy: Policy,
    other: DType,
) -> anyhow::Result<Value> {
    args.dtype.check(args.hosts)?;
    let frac = args.dtype.compare_ram_fraction;
    let base = args.dtype.kv_dtype;
    let cfg = super::engines::engine_config(args.threads, args.kv_pool_mib, true);
    let c = &model.config;
    let block_bytes =
        |d| KvPool::layout_for(c.layers, c.kv_heads, c.head_dim, cfg.block_tokens, d).block_bytes();
    let blocks = planned_blocks(workload, args.answer_tokens, cfg.block_tokens);
    let f32_bytes = blocks as f64 * block_bytes(DType::F32) as f64;
    let engines = args.engines.max(1) as f64;
    let ram_mib = ((f32_bytes * frac / engines) / (1 << 20) as f64)
        .floor()
        .max(1.0) as u64;
    let mut runs: Vec<(DType, ConfigRun)> = Vec::new();
    for dtype in [base, other] {
        let mut a = args.clone();
        a.dtype.kv_dtype = dtype;
        let cluster = FabricCluster::start(args.engines, ram_mib).await?;
        let run =
            run_configuration(&a, &model, workload, Reuse::Fabric, Some(&cluster), policy).await;
        cluster.stop().await;
        let run = run?;
        tracing::info!(%dtype, hit = run.summary.hit_ratio, "dtype run done");
        runs.push((dtype, run));
    }
    let mut per = Map::new();
    for (d, run) in &runs {
        let mut m = run.summary.to_json();
        m["block_bytes"] = json!(block_bytes(*d));
        m["blocks_ram_holds"] =
            json!(ram_mib as f64 * engines * (1 << 20) as f64 / block_bytes(*d) as f64);
        m["connector"] = json!(run.connector.as_ref().map(stats_json));
        m["distinct_blocks_run"] = json!(distinct_blocks(
            run.records
                .iter()
                .map(|r| (r.prompt.as_slice(), r.answer.as_slice())),
            cfg.block_tokens,
        ));
        per.insert(d.name().to_owned(), m);
    }
    let hit = |i: usize| runs[i].1.summary.hit_ratio;
    let ratio = if hit(1) > 0.0 {
        Some(hit(0) / hit(1))
    } else {
        None
    };
    Ok(json!({
        "model": model_name,
        "engines": args.engines,
        "sessions": args.sessions,
        "turns": args.turns,
        "rate": args.rate,
        "answer_tokens": args.answer_tokens,
        "seed": args.seed,
        "routing": policy.as_str(),
        "kv_pool_mib": args.kv_pool_mib,
        "trace_distinct_blocks": blocks,
        "trace_distinct_f32_bytes": f32_bytes,
        "ram_fraction_of_f32_bytes": frac,
        "node_ram_mib": ram_mib,
        "ram_tier_compressed": false,
        "dtypes": Value::Object(per),
        "answers_identical": same_answers(&runs[0].1.records, &runs[1].1.records),
        "hit_ratio_over_compared": ratio,
        "compared": format!("{base} over {other}"),
        "targets": { "hit_ratio_over_compared_min_exclusive": 1.0 },
    }))
}

/// The table of a dtype comparison report.
pub(super) fn print_table(report: &Value) {
    println!(
        "agentic bench, KV dtypes compared: {} engines, {} sessions x {} turns, RAM tier {} MiB per node ({} of the trace's {} distinct f32 blocks)",
        report["engines"],
        report["sessions"],
        report["turns"],
        report["node_ram_mib"],
        report["ram_fraction_of_f32_bytes"],
        report["trace_distinct_blocks"]
    );
    if let Some(d) = report["dtypes"].as_object() {
        for (name, m) in d {
            let f = |k: &str| m[k].as_f64().unwrap_or(0.0);
            println!(
                "  {name:<5} hit {:.3}  ttft p50 {:.1} ms  p90 {:.1} ms  blocks the tiers hold {:.1}",
                f("hit_ratio"),
                f("ttft_p50_ms"),
                f("ttft_p90_ms"),
                f("blocks_ram_holds")
            );
        }
    }
    for k in ["compared", "hit_ratio_over_compared", "answers_identical"] {
        println!("  {k:<24} {}", report[k]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_that_cannot_run_are_refused() {
        let ok = DtypeArgs {
            compare_dtype: Some(DType::F32),
            ..DtypeArgs::default()
        };
        assert!(ok.check(0).is_ok());
        assert!(DtypeArgs::default().check(3).is_ok(), "no comparison asked");
        let err = |a: DtypeArgs, hosts| a.check(hosts).expect_err("refused").to_string();
        assert!(err(ok.clone(), 3).contains("--hosts 0"));
        for frac in [0.0, -1.0, f64::NAN] {
            let a = DtypeArgs {
                compare_ram_fraction: frac,
                ..ok.clone()
            };
            assert!(err(a, 0).contains("--compare-ram-fraction"));
        }
        let same = DtypeArgs {
            compare_dtype: Some(DType::F16),
            ..DtypeArgs::default()
        };
        assert!(err(same, 0).contains("nothing to compare"));
    }

    #[test]
    fn distinct_blocks_count_shared_prefixes_once() {
        let sys: Vec<u32> = (0..8).collect();
        let a: Vec<u32> = sys.iter().copied().chain(100..104).collect();
        let b: Vec<u32> = sys.iter().copied().chain(200..204).collect();
        let none: &[u32] = &[];
        // Blocks of 4: the shared 8 tokens are 2 blocks, each prompt adds 1.
        assert_eq!(distinct_blocks([(&a[..], none), (&b[..], none)], 4), 4);
        // Same tokens at another position are a different block (chained).
        let c: Vec<u32> = (100..104).chain(0..8).collect();
        assert_eq!(distinct_blocks([(&a[..], none), (&c[..], none)], 4), 6);
        // Answer tokens but the last have KV: 3 of these 5 complete a block.
        let ans: Vec<u32> = vec![7; 5];
        assert_eq!(distinct_blocks([(&sys[..6], &ans[..])], 4), 2);
        assert_eq!(distinct_blocks([(&sys[..6], &ans[..2])], 4), 1);
    }

    #[test]
    fn planned_blocks_follow_the_sessions() {
        let w = Workload {
            system: (0..64).collect(),
            users: vec![
                vec![(1000..1064).collect(), (2000..2032).collect()],
                vec![(3000..3064).collect(), (4000..4032).collect()],
            ],
        };
        // Per session: turn 0 = system + 64 (2 full blocks of 64, 1 shared);
        // turn 1 adds 16 answer tokens + 32: 176 tokens + 15 = 191 -> the
        // same 2 blocks. So 1 shared + 1 per session.
        assert_eq!(planned_blocks(&w, 16, 64), 3);
        assert_eq!(planned_blocks(&w, 16, 32), 2 + 2 * (2 + 1));
    }
}
