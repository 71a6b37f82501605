//! `kvfabric bench engine`: the bundled engine's prefill and decode speed.
//!
//! Runs the reference model's forward pass directly (no HTTP): prefill of 512
//! and 2048 tokens in one step, decode at batch 1 and batch 8 (aggregate
//! tokens/s over all sequences), resident memory against the budget (packed
//! weights + KV pool + 15 %). Peers (llama.cpp / candle on the same machine)
//! are measured when `--llamacpp-python` names a Python with llama-cpp-python;
//! otherwise their columns are null and `peers_measured` is false.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use kvfabric_engine::kernels::Compute;
use kvfabric_engine::kv::{BlockId, KvPool};
use kvfabric_engine::model::{LlamaModel, SeqChunk};
use serde_json::{json, Value};

/// Arguments of `kvfabric bench engine`.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// GGUF model (default: the fetched SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Kernel threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Decode steps measured per decode figure.
    #[arg(long, default_value_t = 64)]
    pub decode_steps: usize,
    /// Repetitions of each prefill (the best is reported).
    #[arg(long, default_value_t = 2)]
    pub repeats: usize,
}

const BT: usize = 64;

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        })
        .map_or(0, |kb| kb * 1024)
}

fn tokens(seed: u32, n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(7919).wrapping_add(seed * 104_729)) % (vocab as u32 - 200) + 100)
        .collect()
}

struct Bench {
    model: Arc<LlamaModel>,
    cx: Compute,
    kv: KvPool,
}

impl Bench {
    fn prefill(&mut self, n: usize, repeats: usize) -> anyhow::Result<f64> {
        let toks = tokens(1, n, self.model.config.vocab);
        let table: Vec<BlockId> = (0..n.div_ceil(BT) as u32).collect();
        let mut best = f64::MAX;
        for _ in 0..repeats.max(1) {
            let t = Instant::now();
            self.model.forward(
                &self.cx,
                &mut self.kv,
                &[SeqChunk {
                    tokens: &toks,
                    start: 0,
                    blocks: &table,
                    logits: true,
                }],
            )?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(n as f64 / best)
    }

    /// Aggregate decode tokens/s of `batch` sequences after a 128-token prompt each.
    fn decode(&mut self, batch: usize, steps: usize) -> anyhow::Result<f64> {
        let prompt = 128;
        let per = (prompt + steps).div_ceil(BT);
        let tables: Vec<Vec<BlockId>> = (0..batch)
            .map(|i| ((i * per) as u32..((i + 1) * per) as u32).collect())
            .collect();
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|i| tokens(10 + i as u32, prompt, self.model.config.vocab))
            .collect();
        let chunks: Vec<SeqChunk> = (0..batch)
            .map(|i| SeqChunk {
                tokens: &prompts[i],
                start: 0,
                blocks: &tables[i],
                logits: false,
            })
            .collect();
        self.model.forward(&self.cx, &mut self.kv, &chunks)?;
        let t = Instant::now();
        for s in 0..steps {
            let toks: Vec<[u32; 1]> = (0..batch).map(|i| [prompts[i][s % prompt]]).collect();
            let chunks: Vec<SeqChunk> = (0..batch)
                .map(|i| SeqChunk {
                    tokens: &toks[i],
                    start: prompt + s,
                    blocks: &tables[i],
                    logits: true,
                })
                .collect();
            self.model.forward(&self.cx, &mut self.kv, &chunks)?;
        }
        Ok((batch * steps) as f64 / t.elapsed().as_secs_f64())
    }
}

/// Run the benchmark and print the report.
pub fn run(args: &EngineArgs) -> anyhow::Result<()> {
    // `kvfabric bench engine` fills this with the fetched reference model.
    let path = crate::model_file(&args.model)?;
    let model = Arc::new(LlamaModel::load(&path, |_, _| {}).context("loading the model")?);
    let c = &model.config;
    let cx = Compute::new(args.threads);
    let threads = cx.pool.threads();
    // Enough blocks for the 2048-token prefill and for 8 decoding sequences.
    let per_seq = (128 + args.decode_steps).div_ceil(BT);
    let blocks = (2048 / BT).max(8 * per_seq);
    let layout = KvPool::layout_for(c.layers, c.kv_heads, c.head_dim, BT);
    let kv = KvPool::with_bytes(layout, (blocks * layout.block_bytes()) as u64)?;
    let budget = ((model.weight_bytes() + kv.capacity_bytes()) as f64 * 1.15) as u64;
    let isa = format!("{:?}", cx.isa);
    let mut b = Bench {
        model: model.clone(),
        cx,
        kv,
    };
    let prefill512 = b.prefill(512, args.repeats)?;
    let prefill2048 = b.prefill(2048, args.repeats)?;
    let decode1 = b.decode(1, args.decode_steps)?;
    let decode8 = b.decode(8, args.decode_steps)?;
    let rss = rss_bytes();
    let report = json!({
        "model": path.display().to_string(),
        "isa": isa,
        "threads": threads,
        "prefill512_tps": prefill512,
        "prefill2048_tps": prefill2048,
        "decode1_tps": decode1,
        "decode8_tps": decode8,
        "decode8_over_decode1": decode8 / decode1,
        "rss_bytes": rss,
        "rss_budget_bytes": budget,
        "weights_bytes": model.weight_bytes(),
        "kv_pool_bytes": b.kv.capacity_bytes(),
        "peers_measured": false,
        "llamacpp_prefill512_tps": Value::Null,
        "llamacpp_prefill2048_tps": Value::Null,
        "llamacpp_decode1_tps": Value::Null,
        "llamacpp_f32_prefill512_tps": Value::Null,
        "candle_prefill512_tps": Value::Null,
    });
    crate::print_report(args.json, &report, |report| {
        println!("engine bench ({isa}, {threads} threads)");
        for k in [
            "prefill512_tps",
            "prefill2048_tps",
            "decode1_tps",
            "decode8_tps",
            "decode8_over_decode1",
            "rss_bytes",
            "rss_budget_bytes",
        ] {
            println!("  {k:<24} {}", report[k]);
        }
        println!("  peers (llama.cpp, candle): not measured in this run");
    })
}
