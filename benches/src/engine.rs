//! `kvfabric bench engine`: the bundled engine's prefill and decode speed,
//! against its peers measured in the same run.
//!
//! Runs the reference model's forward pass directly (no HTTP): prefill of 512
//! and 2048 tokens in one step, decode at batch 1 and batch 8 (aggregate
//! tokens/s over all sequences), resident memory against the budget (packed
//! weights + KV pool + 15 %). Then, on the same tokens and thread count, the
//! peers ([`peers`]): llama.cpp on the same GGUF (`llamacpp_*`) and on its F32
//! conversion (`llamacpp_f32_*`), both through PyPI llama-cpp-python in a venv
//! built once under `~/.cache/kvfabric/`, and candle-transformers on
//! f32-dequantized weights (`candle_*`, cargo feature `candle-peer`). A peer
//! that cannot run is null with its reason in `<peer>_status`; kvfabric's own
//! figures never depend on the peers. `--no-peers` skips them. The
//! KV pool holds `--kv-dtype` (f16 by default, as llama.cpp's default cache);
//! decode8 is measured again with f32 KV in the same run (`f32kv_decode8_tps`,
//! `decode8_over_f32kv`) unless the main figures are f32 already. The
//! tokenizer's throughput on one and two concurrent 32k-token prompts is
//! measured after kvfabric's RSS is taken, before the peers ([`tokenize`]);
//! `--only-tokenize` reports just that.

#[cfg(feature = "candle-peer")]
mod candle_peer;
pub(crate) mod peers;
pub mod tokenize;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use kvfabric_engine::kernels::Compute;
use kvfabric_engine::kv::{BlockId, KvPool};
use kvfabric_engine::model::{LlamaModel, SeqChunk};
use serde_json::{json, Map, Value};

use peers::{PeerLimits, PeerOutcome, PeerWorkload, Rates};

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
    /// Repetitions of each figure, every engine alike (the best is reported:
    /// the machine is shared, and a burst of other work hits one repetition).
    #[arg(long, default_value_t = 2)]
    pub repeats: usize,
    /// Skip the peers (llama.cpp, candle): kvfabric's figures only.
    #[arg(long)]
    pub no_peers: bool,
    /// Measure only tokenization (seconds: no weights, forward passes or peers).
    #[arg(long)]
    pub only_tokenize: bool,
    /// The llama.cpp venv, built here once when absent
    /// (default: ~/.cache/kvfabric/llamacpp-venv).
    #[arg(long)]
    pub llamacpp_venv: Option<PathBuf>,
    /// Limit on building the llama.cpp venv (download + compile), seconds.
    #[arg(long, default_value_t = 3600)]
    pub peer_build_timeout_s: u64,
    /// Limit on one peer run or the F32 conversion, seconds.
    #[arg(long, default_value_t = 900)]
    pub peer_timeout_s: u64,
    /// Element type of the KV pool: f16, bf16 or f32 (decode8 is also
    /// measured with f32 KV when this is not f32).
    #[arg(long, default_value = "f16")]
    pub kv_dtype: kvfabric_store::DType,
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

/// The tokens every engine in the run is timed on (kvfabric and peers).
fn workload(vocab: usize, threads: usize, args: &EngineArgs) -> PeerWorkload {
    PeerWorkload {
        threads,
        repeats: args.repeats.max(1),
        decode_steps: args.decode_steps,
        prefill512: tokens(1, 512, vocab),
        prefill2048: tokens(1, 2048, vocab),
        decode_prompts: (0..8)
            .map(|i| tokens(10 + i, DECODE_PROMPT, vocab))
            .collect(),
    }
}

/// Prompt length of every decoding sequence.
const DECODE_PROMPT: usize = 128;

struct Bench {
    model: Arc<LlamaModel>,
    cx: Compute,
    kv: KvPool,
}

impl Bench {
    fn prefill(&mut self, toks: &[u32], repeats: usize) -> anyhow::Result<f64> {
        let n = toks.len();
        let table: Vec<BlockId> = (0..n.div_ceil(BT) as u32).collect();
        let mut best = f64::MAX;
        for _ in 0..repeats.max(1) {
            let t = Instant::now();
            self.model.forward(
                &self.cx,
                &mut self.kv,
                &[SeqChunk {
                    tokens: toks,
                    start: 0,
                    blocks: &table,
                    logits: true,
                }],
            )?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(n as f64 / best)
    }

    /// Aggregate decode tokens/s of `prompts.len()` sequences after their
    /// prompts, each step feeding sequence i the token `prompts[i][s % len]`;
    /// the best of `repeats` runs (prompts recomputed before each).
    fn decode(
        &mut self,
        prompts: &[Vec<u32>],
        steps: usize,
        repeats: usize,
    ) -> anyhow::Result<f64> {
        let batch = prompts.len();
        let prompt = DECODE_PROMPT;
        let per = (prompt + steps).div_ceil(BT);
        let tables: Vec<Vec<BlockId>> = (0..batch)
            .map(|i| ((i * per) as u32..((i + 1) * per) as u32).collect())
            .collect();
        let chunks: Vec<SeqChunk> = (0..batch)
            .map(|i| SeqChunk {
                tokens: &prompts[i],
                start: 0,
                blocks: &tables[i],
                logits: false,
            })
            .collect();
        let mut best = f64::MAX;
        for _ in 0..repeats.max(1) {
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
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok((batch * steps) as f64 / best)
    }
}

/// The 1-minute load average (the machine is shared: context for the figures).
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The peers' outcomes, in report order: (key prefix, outcome).
fn measure_peers(
    args: &EngineArgs,
    model: &std::path::Path,
    work: &PeerWorkload,
) -> Vec<(&'static str, PeerOutcome)> {
    if args.no_peers {
        let skipped = || PeerOutcome::Unavailable("skipped (--no-peers)".into());
        return vec![
            ("llamacpp", skipped()),
            ("llamacpp_f32", skipped()),
            ("candle", skipped()),
        ];
    }
    let limits = PeerLimits {
        build: Duration::from_secs(args.peer_build_timeout_s),
        run: Duration::from_secs(args.peer_timeout_s),
    };
    let venv = args
        .llamacpp_venv
        .clone()
        .unwrap_or_else(peers::default_venv);
    let (native, f32) = peers::llamacpp(&venv, model, work, limits);
    vec![
        ("llamacpp", native),
        ("llamacpp_f32", f32),
        ("candle", candle(model, work)),
    ]
}

#[cfg(feature = "candle-peer")]
fn candle(model: &std::path::Path, work: &PeerWorkload) -> PeerOutcome {
    tracing::info!(
        threads = work.threads,
        "measuring candle on {}",
        model.display()
    );
    match candle_peer::measure(model, work) {
        Ok((rates, details)) => PeerOutcome::Measured { rates, details },
        Err(e) => PeerOutcome::Unavailable(format!("{e:#}")),
    }
}

#[cfg(not(feature = "candle-peer"))]
fn candle(_model: &std::path::Path, _work: &PeerWorkload) -> PeerOutcome {
    PeerOutcome::Unavailable(CANDLE_NOT_BUILT.into())
}

/// Why `candle_*` is null in a build without the `candle-peer` feature.
pub const CANDLE_NOT_BUILT: &str = "build with --features candle-peer";

/// Run the benchmark and return the report (one JSON object).
pub fn measure(args: &EngineArgs) -> anyhow::Result<Value> {
    // `kvfabric bench engine` fills this with the fetched reference model.
    let path = crate::model_file(&args.model)?;
    let load_before = load_average();
    if args.only_tokenize {
        let mut report = tokenize::measure(&path)?;
        report.insert("model".into(), json!(path.display().to_string()));
        report.insert("load_avg_1m_before".into(), json!(load_before));
        report.insert("load_avg_1m_after".into(), json!(load_average()));
        return Ok(Value::Object(report));
    }
    // The engine is freed (weights, KV pool, kernel threads) before the peers run.
    let (ours, work, mut report) = measure_ours(args, &path)?;
    // After the engine's RSS: the 32k-token prompts' heap would count in it.
    let tokenization = tokenize::measure(&path)?;
    let outcomes = measure_peers(args, &path, &work);
    report.extend(tokenization);
    report.insert("load_avg_1m_before".into(), json!(load_before));
    report.insert("load_avg_1m_after".into(), json!(load_average()));
    put_peers(&mut report, &ours, &outcomes);
    Ok(Value::Object(report))
}

/// kvfabric's rates, the workload the peers get too, and the report's
/// entries on kvfabric (rates, RSS, the f32-KV decode8).
fn measure_ours(
    args: &EngineArgs,
    path: &std::path::Path,
) -> anyhow::Result<(Rates, PeerWorkload, Map<String, Value>)> {
    let model = Arc::new(LlamaModel::load(path, |_, _| {}).context("loading the model")?);
    let c = &model.config;
    let cx = Compute::new(args.threads);
    let threads = cx.pool.threads();
    let work = workload(c.vocab, threads, args);
    // Enough blocks for the 2048-token prefill and for 8 decoding sequences.
    let per_seq = (DECODE_PROMPT + args.decode_steps).div_ceil(BT);
    let blocks = (2048 / BT).max(8 * per_seq);
    let pool = |dtype| {
        let layout = KvPool::layout_for(c.layers, c.kv_heads, c.head_dim, BT, dtype);
        KvPool::with_bytes(layout, (blocks * layout.block_bytes()) as u64)
    };
    let kv = pool(args.kv_dtype)?;
    let budget = ((model.weight_bytes() + kv.capacity_bytes()) as f64 * 1.15) as u64;
    let isa = format!("{:?}", cx.isa);
    let mut b = Bench {
        model: model.clone(),
        cx,
        kv,
    };
    let ours = Rates {
        prefill512: b.prefill(&work.prefill512, work.repeats)?,
        prefill2048: b.prefill(&work.prefill2048, work.repeats)?,
        decode1: b.decode(&work.decode_prompts[..1], work.decode_steps, work.repeats)?,
        decode8: b.decode(&work.decode_prompts, work.decode_steps, work.repeats)?,
    };
    // RSS is kvfabric's alone: taken before any peer runs (candle runs in-process).
    let rss = rss_bytes();
    let weights_bytes = model.weight_bytes();
    let kv_pool_bytes = b.kv.capacity_bytes();
    // The same decode8 with f32 KV: what the KV dtype does to the step.
    let f32kv_decode8 = if args.kv_dtype == kvfabric_store::DType::F32 {
        None
    } else {
        b.kv = pool(kvfabric_store::DType::F32)?;
        Some(b.decode(&work.decode_prompts, work.decode_steps, work.repeats)?)
    };
    let mut report = Map::new();
    let mut put = |k: &str, v: Value| {
        report.insert(k.to_string(), v);
    };
    put("model", json!(path.display().to_string()));
    put("isa", json!(isa));
    put("threads", json!(threads));
    put("kv_dtype", json!(args.kv_dtype.name()));
    for (k, v) in Rates::keys("", Some(&ours)) {
        put(&k, v);
    }
    put("decode8_over_decode1", json!(ours.decode8 / ours.decode1));
    put("f32kv_decode8_tps", json!(f32kv_decode8));
    put(
        "decode8_over_f32kv",
        json!(f32kv_decode8.map(|f| ours.decode8 / f)),
    );
    put("rss_bytes", json!(rss));
    put("rss_budget_bytes", json!(budget));
    put("weights_bytes", json!(weights_bytes));
    put("kv_pool_bytes", json!(kv_pool_bytes));
    Ok((ours, work, report))
}

/// Each peer's rates and status, and kvfabric over the best measured peer
/// in each column (> 1: kvfabric ahead).
fn put_peers(
    report: &mut Map<String, Value>,
    ours: &Rates,
    outcomes: &[(&'static str, PeerOutcome)],
) {
    let mut put = |k: &str, v: Value| {
        report.insert(k.to_string(), v);
    };
    let all_measured = outcomes
        .iter()
        .all(|(_, o)| matches!(o, PeerOutcome::Measured { .. }));
    put("peers_measured", json!(all_measured));
    let mut best_peer: Option<Rates> = None;
    for (prefix, outcome) in outcomes {
        let (rates, status, details) = match outcome {
            PeerOutcome::Measured { rates, details } => {
                (Some(rates), json!("measured"), details.clone())
            }
            PeerOutcome::Unavailable(why) => (None, json!(why), Value::Null),
        };
        for (k, v) in Rates::keys(prefix, rates) {
            put(&k, v);
        }
        put(&format!("{prefix}_status"), status);
        put(&format!("{prefix}_details"), details);
        if let Some(r) = rates {
            let best = best_peer.get_or_insert(*r);
            best.prefill512 = best.prefill512.max(r.prefill512);
            best.prefill2048 = best.prefill2048.max(r.prefill2048);
            best.decode1 = best.decode1.max(r.decode1);
            best.decode8 = best.decode8.max(r.decode8);
        }
    }
    if !cfg!(feature = "candle-peer") {
        put("candle_peer", json!(CANDLE_NOT_BUILT));
    }
    // kvfabric / the best measured peer in each column (> 1: kvfabric ahead).
    let ratio = |ours: f64, peer: Option<f64>| peer.map_or(Value::Null, |p| json!(ours / p));
    put(
        "prefill512_over_best_peer",
        ratio(ours.prefill512, best_peer.map(|r| r.prefill512)),
    );
    put(
        "prefill2048_over_best_peer",
        ratio(ours.prefill2048, best_peer.map(|r| r.prefill2048)),
    );
    put(
        "decode1_over_best_peer",
        ratio(ours.decode1, best_peer.map(|r| r.decode1)),
    );
    put(
        "decode8_over_best_peer",
        ratio(ours.decode8, best_peer.map(|r| r.decode8)),
    );
}

/// Run the benchmark and print the report.
pub fn run(args: &EngineArgs) -> anyhow::Result<()> {
    let report = measure(args)?;
    if args.only_tokenize {
        return crate::print_report(args.json, &report, tokenize::print);
    }
    crate::print_report(args.json, &report, |report| {
        println!(
            "engine bench ({}, {} threads, {} KV)",
            report["isa"].as_str().unwrap_or("?"),
            report["threads"],
            report["kv_dtype"].as_str().unwrap_or("?")
        );
        println!(
            "  {:<16} {:>14} {:>14} {:>14} {:>14}",
            "tok/s", "kvfabric", "llama.cpp", "llama.cpp f32", "candle f32"
        );
        for figure in ["prefill512", "prefill2048", "decode1", "decode8"] {
            let cell = |prefix: &str| {
                let key = if prefix.is_empty() {
                    format!("{figure}_tps")
                } else {
                    format!("{prefix}_{figure}_tps")
                };
                report[&key]
                    .as_f64()
                    .map_or_else(|| "-".to_string(), |x| format!("{x:.1}"))
            };
            println!(
                "  {figure:<16} {:>14} {:>14} {:>14} {:>14}",
                cell(""),
                cell("llamacpp"),
                cell("llamacpp_f32"),
                cell("candle")
            );
        }
        for k in [
            "decode8_over_decode1",
            "f32kv_decode8_tps",
            "decode8_over_f32kv",
            "rss_bytes",
            "rss_budget_bytes",
        ] {
            println!("  {k:<24} {}", report[k]);
        }
        tokenize::print(report);
        for peer in ["llamacpp", "llamacpp_f32", "candle"] {
            let status = &report[format!("{peer}_status")];
            if status != "measured" {
                println!("  {peer}: {}", status.as_str().unwrap_or("?"));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(model: PathBuf) -> EngineArgs {
        EngineArgs {
            json: true,
            model: Some(model),
            threads: 1,
            decode_steps: 2,
            repeats: 1,
            no_peers: false,
            only_tokenize: false,
            llamacpp_venv: None,
            peer_build_timeout_s: 120,
            peer_timeout_s: 60,
            kv_dtype: kvfabric_store::DType::F16,
        }
    }

    /// The reference model, or None (the test then has nothing to run on).
    fn reference_model() -> Option<PathBuf> {
        let p = kvfabric_engine::model::reference_model_path();
        if p.exists() {
            Some(p)
        } else {
            eprintln!("skipping: no reference model at {}", p.display());
            None
        }
    }

    fn assert_kvfabric_figures(report: &Value) {
        for k in [
            "prefill512_tps",
            "prefill2048_tps",
            "decode1_tps",
            "decode8_tps",
            "rss_bytes",
            "rss_budget_bytes",
            "threads",
        ] {
            let x = report[k].as_f64().unwrap_or(0.0);
            assert!(x > 0.0, "{k} = {}", report[k]);
        }
    }

    #[test]
    fn no_peers_reports_kvfabric_and_null_peer_columns() {
        let Some(model) = reference_model() else {
            return;
        };
        let mut a = args(model);
        a.no_peers = true;
        let report = measure(&a).unwrap();
        assert_kvfabric_figures(&report);
        assert_eq!(report["kv_dtype"], json!("f16"));
        assert!(report["f32kv_decode8_tps"].as_f64().unwrap_or(0.0) > 0.0);
        assert!(report["decode8_over_f32kv"].as_f64().unwrap_or(0.0) > 0.0);
        assert_eq!(report["peers_measured"], json!(false));
        for peer in ["llamacpp", "llamacpp_f32", "candle"] {
            for figure in ["prefill512", "prefill2048", "decode1", "decode8"] {
                assert!(report[format!("{peer}_{figure}_tps")].is_null());
            }
            assert_eq!(
                report[format!("{peer}_status")],
                json!("skipped (--no-peers)")
            );
        }
        assert!(report["prefill512_over_best_peer"].is_null());
    }

    #[test]
    fn a_venv_that_cannot_be_built_leaves_kvfabric_figures_intact() {
        let Some(model) = reference_model() else {
            return;
        };
        // A venv path under a regular file can never be created (no network used).
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut a = args(model);
        a.llamacpp_venv = Some(file.path().join("venv"));
        let report = measure(&a).unwrap();
        assert_kvfabric_figures(&report);
        assert_eq!(report["peers_measured"], json!(false));
        for peer in ["llamacpp", "llamacpp_f32"] {
            assert!(report[format!("{peer}_prefill512_tps")].is_null());
            let why = report[format!("{peer}_status")].as_str().unwrap_or("");
            assert!(why.contains("venv"), "{peer}: {why}");
        }
        if cfg!(feature = "candle-peer") {
            // candle needs no venv: it is measured regardless.
            assert_eq!(report["candle_status"], json!("measured"));
            assert!(report["candle_decode8_tps"].as_f64().unwrap_or(0.0) > 0.0);
            assert!(report["prefill512_over_best_peer"].as_f64().is_some());
        } else {
            assert_eq!(report["candle_status"], json!(CANDLE_NOT_BUILT));
            assert_eq!(report["candle_peer"], json!(CANDLE_NOT_BUILT));
            assert!(report["prefill512_over_best_peer"].is_null());
        }
    }

    #[test]
    fn peers_get_the_tokens_kvfabric_is_timed_on() {
        let a = args(PathBuf::from("unused.gguf"));
        let w = workload(49152, 2, &a);
        assert_eq!(w.prefill512.len(), 512);
        assert_eq!(w.prefill2048.len(), 2048);
        // The 512 prompt is the 2048 prompt's prefix (same generator, seed 1).
        assert_eq!(w.prefill512[..], w.prefill2048[..512]);
        assert_eq!(w.decode_prompts.len(), 8);
        assert!(w.decode_prompts.iter().all(|p| p.len() == DECODE_PROMPT));
        assert_ne!(w.decode_prompts[0], w.decode_prompts[1]);
        assert!(w
            .prefill2048
            .iter()
            .all(|&t| (100..49152 - 100).contains(&t)));
    }
}
