//! `kvfabric bench eviction`: which RAM-tier eviction order (LRU or
//! S3-FIFO) keeps more of the agentic trace's prefixes when the tier is too
//! small for them.
//!
//! The agentic workload (a shared system prompt with tool definitions, many
//! sessions that each resend their whole growing history every turn; see
//! `agentic::trace`) is replayed as block keys against a real [`Store`] with
//! a RAM tier of a fraction of the trace's distinct blocks and no disk. Each
//! request looks up its prompt's blocks (prefix order), reads the hits
//! (a lease, as the connector does), then puts the blocks the engine would
//! have computed: the rest of the prompt and the answer's full blocks.
//! Sessions advance round-robin, one turn each, the way concurrent agents
//! interleave. Answers are fixed pseudo-random tokens (no engine runs), so
//! the replay is deterministic and takes seconds; the trace's structure
//! (what is shared, what grows) is the agentic bench's own.
//!
//! The figure is the token hit ratio (prompt tokens served from the tier
//! over prompt tokens) per policy and capacity, against the oracle (a tier
//! that never evicts) measured on the same replay.

use anyhow::Context;
use clap::Args;
use kvfabric_engine::gguf::GgufFile;
use kvfabric_engine::tokenizer::Tokenizer;
use kvfabric_store::{
    BlockOrder, DType, EvictionPolicy, KeyChain, KvLayout, ModelFingerprint, NodeConfig,
    PutOptions, Registry, Store,
};
use serde_json::{json, Value};

use crate::agentic::trace::{SplitMix64, TraceEntry, Workload, WorkloadShape};

/// Flags of `kvfabric bench eviction`.
#[derive(Args, Debug, Clone)]
pub struct EvictionArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// GGUF model whose tokenizer encodes the trace (default: the fetched reference model).
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
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
    /// Tokens per block.
    #[arg(long, default_value_t = 64)]
    pub block_tokens: usize,
    /// Seed of the workload text and the answers.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Tier sizes tried, as fractions of the trace's distinct blocks.
const CAPACITY_FRACTIONS: [f64; 4] = [0.1, 0.25, 0.5, 0.75];

/// Run the bench and print its report.
pub fn run(args: &EvictionArgs) -> anyhow::Result<()> {
    crate::print_report(args.json, &measure(args)?, print_table)
}

/// The trace in replay order (turn by turn, sessions round-robin).
fn requests(args: &EvictionArgs, encode: &dyn Fn(&str) -> Vec<u32>) -> Vec<TraceEntry> {
    let shape = WorkloadShape {
        sessions: args.sessions,
        turns: args.turns,
        system_tokens: args.system_tokens,
        history_tokens: args.session_history_tokens,
    };
    let workload = Workload::generate(encode, args.seed, &shape);
    let mut rng = SplitMix64::new(args.seed ^ 0xa5a5);
    let mut answers: Vec<Vec<Vec<u32>>> = vec![Vec::new(); args.sessions];
    let mut out = Vec::new();
    for _turn in 0..args.turns {
        for (s, done) in answers.iter_mut().enumerate() {
            let prompt = workload.prompt(s, done);
            let answer: Vec<u32> = (0..args.answer_tokens)
                .map(|_| 100 + rng.below(40_000) as u32)
                .collect();
            done.push(answer.clone());
            out.push(TraceEntry { prompt, answer });
        }
    }
    out
}

/// Replay `reqs` on a RAM tier of `capacity_blocks` blocks (None: never
/// evicts); returns (prompt tokens hit, prompt tokens, distinct blocks put).
fn replay(
    reqs: &[TraceEntry],
    chain: &KeyChain,
    layout: KvLayout,
    policy: EvictionPolicy,
    capacity_blocks: Option<usize>,
) -> anyhow::Result<(usize, usize, usize)> {
    let bt = chain.block_tokens();
    let block = vec![0u8; layout.block_bytes()];
    // Room for every block the replay could put, when it must never evict.
    let every_block: usize = reqs
        .iter()
        .map(|r| (r.prompt.len() + r.answer.len()) / bt)
        .sum();
    let blocks = capacity_blocks.unwrap_or(every_block.max(1));
    // The arena gives each block a 4 KiB-aligned slot.
    let slot = layout.block_bytes().div_ceil(4096) * 4096;
    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::b((blocks * slot) as u64),
        eviction: policy,
        // Never evict in the oracle run; otherwise the default watermarks.
        high_watermark: if capacity_blocks.is_none() { 1.0 } else { 0.95 },
        ..Default::default()
    };
    let store = Store::open(cfg, &mut Registry::default())?;
    let (mut hit, mut total, mut puts) = (0usize, 0usize, 0usize);
    for r in reqs {
        // What the engine computed: the prompt and all answer tokens but the
        // last. Its first blocks are the prompt's: the ones looked up, full
        // blocks only and never the prompt's last token (fed through the model).
        let mut computed = r.prompt.clone();
        computed.extend_from_slice(&r.answer[..r.answer.len().saturating_sub(1)]);
        let all = chain.keys(&computed[..computed.len() / bt * bt]);
        let usable = r.prompt.len().saturating_sub(1) / bt;
        let found = store.lookup(&all[..usable]).len();
        for k in &all[..found] {
            // The connector reads every hit block.
            drop(store.lease(k)?.context("looked-up block vanished")?);
        }
        hit += found * bt;
        total += r.prompt.len();
        for k in &all[found..] {
            if !store
                .put(*k, layout, &block, PutOptions::default())?
                .already_present
            {
                puts += 1;
            }
        }
    }
    Ok((hit, total, puts))
}

/// A layout of small blocks (a few KiB): the tier's bookkeeping is what is
/// measured, not copies.
fn small_layout(block_tokens: usize) -> KvLayout {
    KvLayout {
        layers: 1,
        kv_heads: 1,
        head_dim: 16,
        dtype: DType::F32,
        block_tokens: block_tokens as u32,
        order: BlockOrder::LayerKvTokenHead,
    }
}

/// Measure everything and return the report object.
pub fn measure(args: &EvictionArgs) -> anyhow::Result<Value> {
    anyhow::ensure!(
        args.sessions > 0 && args.turns > 0 && args.block_tokens > 0,
        "--sessions, --turns and --block-tokens must be > 0"
    );
    let path = crate::model_file(&args.model)?;
    let gguf = GgufFile::open(&path).context("opening the model")?;
    let tokenizer = Tokenizer::from_gguf(&gguf).context("building the tokenizer")?;
    drop(gguf);
    let reqs = requests(args, &|text| tokenizer.encode(text, true));
    let layout = small_layout(args.block_tokens);
    let chain = KeyChain::new(b"bench-eviction", &ModelFingerprint([7; 32]), &layout);
    let (oracle_hit, total, distinct) = replay(&reqs, &chain, layout, EvictionPolicy::Lru, None)?;
    let mut rows = Vec::new();
    for frac in CAPACITY_FRACTIONS {
        let cap = ((distinct as f64 * frac) as usize).max(1);
        let mut row = serde_json::Map::new();
        row.insert("capacity_fraction".into(), json!(frac));
        row.insert("capacity_blocks".into(), json!(cap));
        for (name, policy) in [
            ("lru", EvictionPolicy::Lru),
            ("s3fifo", EvictionPolicy::S3fifo),
        ] {
            let (hit, _, _) = replay(&reqs, &chain, layout, policy, Some(cap))?;
            row.insert(
                format!("{name}_hit_ratio"),
                json!(hit as f64 / total as f64),
            );
        }
        rows.push(Value::Object(row));
    }
    Ok(json!({
        "requests": reqs.len(),
        "sessions": args.sessions,
        "turns": args.turns,
        "block_tokens": args.block_tokens,
        "prompt_tokens": total,
        "distinct_blocks": distinct,
        "oracle_hit_ratio": oracle_hit as f64 / total as f64,
        "capacities": rows,
    }))
}

fn print_table(report: &Value) {
    println!(
        "eviction bench: {} requests ({} sessions x {} turns), {} distinct blocks, oracle hit ratio {:.3}",
        report["requests"],
        report["sessions"],
        report["turns"],
        report["distinct_blocks"],
        report["oracle_hit_ratio"].as_f64().unwrap_or(0.0)
    );
    println!(
        "  {:>9} {:>8} {:>8} {:>8}",
        "capacity", "blocks", "lru", "s3fifo"
    );
    for r in report["capacities"].as_array().into_iter().flatten() {
        println!(
            "  {:>8.0}% {:>8} {:>8.3} {:>8.3}",
            r["capacity_fraction"].as_f64().unwrap_or(0.0) * 100.0,
            r["capacity_blocks"],
            r["lru_hit_ratio"].as_f64().unwrap_or(0.0),
            r["s3fifo_hit_ratio"].as_f64().unwrap_or(0.0)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    fn args() -> EvictionArgs {
        EvictionArgs {
            json: true,
            model: None,
            sessions: 3,
            turns: 3,
            system_tokens: 300,
            session_history_tokens: 200,
            answer_tokens: 20,
            block_tokens: 16,
            seed: 3,
        }
    }

    /// The oracle replay hits exactly what the trace's own oracle says, and a
    /// tier of a few blocks hits less under either policy.
    #[test]
    fn replay_matches_the_trace_oracle_and_small_tiers_hit_less() {
        let a = args();
        let reqs = requests(&a, &bytes);
        let layout = small_layout(16);
        let chain = KeyChain::new(b"t", &ModelFingerprint([1; 32]), &layout);
        let (hit, total, distinct) =
            replay(&reqs, &chain, layout, EvictionPolicy::Lru, None).unwrap();
        let oracle: usize = crate::agentic::trace::oracle_cached_tokens(&reqs, 16)
            .iter()
            .sum();
        assert_eq!(hit, oracle);
        assert_eq!(total, reqs.iter().map(|r| r.prompt.len()).sum::<usize>());
        for policy in [EvictionPolicy::Lru, EvictionPolicy::S3fifo] {
            let (small, _, _) = replay(&reqs, &chain, layout, policy, Some(distinct / 10)).unwrap();
            assert!(small < hit, "{policy:?}: {small} vs {hit}");
        }
    }
}
