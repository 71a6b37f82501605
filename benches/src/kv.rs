//! `kvfabric bench kv`: how compact KV blocks are, and what compressing them
//! costs, on real blocks.
//!
//! The engine prefills the first turn of `--sessions` agentic-trace sessions
//! (the `bench agentic` workload: shared system prompt with tool
//! definitions, then each session's own history) and every full block it
//! computes is captured as the fabric connector would receive it
//! ([`capture`]). The engine runs once per KV dtype (`kv_dtype` f16, bf16,
//! f32), so every dtype's blocks are the engine's own: K and V rounded once
//! by the forward pass, and each later layer computed from the rounded
//! cache (`"source": "engine kv_dtype=<dtype>"` in the report).
//!
//! Per dtype it reports bytes per token, the order-0 entropy of every byte
//! plane (and of whole 16-bit elements) with the ratio it bounds, and for
//! kvfabric's codec, zstd-1 and lz4 on the raw bytes and zstd-1 and lz4 on
//! byte planes ([`peers`]): the compression ratio over all blocks, and
//! single-core encode and decode GB/s (of decoded bytes), best of
//! `--rounds`, each against a memcpy of the same blocks measured in the same
//! round. Every decode is checked bit-exact against the block. It also
//! times the disk tier's sampled pre-check (`estimate`: GB/s and its
//! estimated length over the codec's).
//! Targets (f16): codec ratio >= 1.15, decode >= 0.5 x memcpy.

pub mod capture;
pub mod peers;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use kvfabric_engine::gguf::GgufFile;
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::tokenizer::Tokenizer;
use kvfabric_engine::KvDtype;
use kvfabric_store::keys::KvLayout;
use serde_json::{json, Value};

use crate::agentic::trace::{Workload, WorkloadShape};
use peers::{Lz4, Method, Planes, Zstd1};

/// Arguments of `kvfabric bench kv`.
#[derive(clap::Args, Debug, Clone)]
pub struct KvArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// GGUF model (default: the fetched SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Agentic sessions whose first turn is prefilled.
    #[arg(long, default_value_t = 2)]
    pub sessions: usize,
    /// Tokens of the shared system prompt.
    #[arg(long, default_value_t = 1000)]
    pub system_tokens: usize,
    /// Tokens of each session's own history.
    #[arg(long, default_value_t = 1500)]
    pub session_history_tokens: usize,
    /// Most distinct blocks measured.
    #[arg(long, default_value_t = 48)]
    pub blocks: usize,
    /// Timed rounds (the best of each figure is reported).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Kernel threads of the engine (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// The engine's KV pool, MiB.
    #[arg(long, default_value_t = 512)]
    pub kv_pool_mib: u64,
    /// Seed of the workload text.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write each dtype's blocks, back to back, to DIR/<dtype>.bin.
    #[arg(long)]
    pub dump_dir: Option<PathBuf>,
}

/// Run the bench and print its report.
pub fn run(args: &KvArgs) -> anyhow::Result<()> {
    crate::print_report(args.json, &measure(args)?, print_table)
}

fn print_table(report: &Value) {
    println!(
        "kv bench: {} blocks of {} tokens",
        report["blocks"], report["block_tokens"]
    );
    let Some(dtypes) = report["dtypes"].as_object() else {
        return;
    };
    for (name, d) in dtypes {
        println!(
            "{name}: {} B/token, order-0 plane entropy bound {:.3}, disk blocks x{:.3}, memcpy {:.2} GB/s",
            d["bytes_per_token"],
            d["entropy_bound_ratio"].as_f64().unwrap_or(0.0),
            d["disk_blocks_ratio"].as_f64().unwrap_or(0.0),
            d["memcpy_gbps"].as_f64().unwrap_or(0.0)
        );
        println!(
            "  pre-check estimate {:.2} GB/s ({:.3}x memcpy), estimated/encoded {:.3}",
            d["estimate"]["gbps"].as_f64().unwrap_or(0.0),
            d["estimate"]["vs_memcpy"].as_f64().unwrap_or(0.0),
            d["estimate"]["estimated_over_encoded"]
                .as_f64()
                .unwrap_or(0.0)
        );
        if let Some(methods) = d["methods"].as_object() {
            for (m, r) in methods {
                println!(
                    "  {m:<13} ratio {:.3}  enc {:.2} GB/s ({:.2}x)  dec {:.2} GB/s ({:.2}x)  exact {}",
                    r["ratio"].as_f64().unwrap_or(0.0),
                    r["encode_gbps"].as_f64().unwrap_or(0.0),
                    r["encode_vs_memcpy"].as_f64().unwrap_or(0.0),
                    r["decode_gbps"].as_f64().unwrap_or(0.0),
                    r["decode_vs_memcpy"].as_f64().unwrap_or(0.0),
                    r["bit_exact"]
                );
            }
        }
    }
}

/// Run the bench and return the report (what `--json` prints).
pub fn measure(args: &KvArgs) -> anyhow::Result<Value> {
    let path = crate::model_file(&args.model)?;
    anyhow::ensure!(args.blocks > 0, "--blocks must be > 0");
    let model = Arc::new(LlamaModel::load(&path, |_, _| {}).context("loading the model")?);
    let gguf = GgufFile::open(&path).context("opening the model")?;
    let tokenizer = Tokenizer::from_gguf(&gguf).context("building the tokenizer")?;
    drop(gguf);
    let workload = Workload::generate(
        &|text| tokenizer.encode(text, true),
        args.seed,
        &WorkloadShape {
            sessions: args.sessions.max(1),
            turns: 1,
            system_tokens: args.system_tokens,
            history_tokens: args.session_history_tokens,
        },
    );
    let mut sets: Vec<(&'static str, KvLayout, Vec<Vec<u8>>)> = Vec::new();
    for dtype in [KvDtype::F16, KvDtype::Bf16, KvDtype::F32] {
        let (a, model, workload) = (args.clone(), model.clone(), workload.clone());
        let captured = crate::on_own_runtime(move |rt| {
            rt.block_on(capture::capture_blocks(
                &model,
                &workload,
                dtype,
                a.threads,
                a.kv_pool_mib,
                a.blocks,
            ))
        })?;
        let layout = captured
            .layout
            .context("the engine reported no KV layout")?;
        let want = kvfabric_store::keys::DType::from(dtype);
        anyhow::ensure!(
            layout.dtype == want,
            "the engine's pool holds {:?}, asked for {want:?}",
            layout.dtype
        );
        sets.push((want.name(), layout, captured.blocks));
    }
    let mut dtypes = serde_json::Map::new();
    for (name, layout, blocks) in &sets {
        if let Some(dir) = &args.dump_dir {
            std::fs::create_dir_all(dir)?;
            std::fs::write(dir.join(format!("{name}.bin")), blocks.concat())?;
        }
        let width = layout.dtype.size();
        let segment = (layout.half_layer_bytes() / width) as u32;
        let row = (layout.kv_heads * layout.head_dim) as usize;
        let mut report = measure_set(blocks, width, segment, row, args.rounds.max(1))?;
        report["source"] = json!(format!("engine kv_dtype={name}"));
        report["bytes_per_token"] = json!(blocks[0].len() / layout.block_tokens as usize);
        report["block_bytes"] = json!(blocks[0].len());
        dtypes.insert(name.to_string(), report);
    }
    let first = &sets[0];
    Ok(json!({
        "blocks": first.2.len(),
        "block_tokens": first.1.block_tokens,
        "layout": format!("{:?}", first.1),
        "rounds": args.rounds.max(1),
        "dtypes": dtypes,
        "targets": { "f16_codec_ratio_min": 1.15, "f16_decode_vs_memcpy_min": 0.5 },
    }))
}

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-12) / 1e9
}

/// Entropy figures of one dtype's blocks.
fn entropy_report(blocks: &[Vec<u8>], width: usize) -> Value {
    let planes: Vec<f64> = (0..width)
        .map(|p| peers::plane_entropy(blocks, width, p))
        .collect();
    let sum: f64 = planes.iter().sum();
    let mut v = json!({
        // Bits per byte of each plane, least significant byte first.
        "plane_entropy_bits": planes,
        // The best ratio an order-0 coder of each plane could reach.
        "entropy_bound_ratio": 8.0 * width as f64 / sum.max(1e-9),
    });
    if width == 2 {
        let e = peers::element_entropy_16(blocks);
        v["element_entropy_bits"] = json!(e);
        v["element_entropy_bound_ratio"] = json!(16.0 / e.max(1e-9));
    }
    v
}

/// Every method on `blocks`, `rounds` times, memcpy first in each round.
fn measure_set(
    blocks: &[Vec<u8>],
    width: usize,
    segment: u32,
    row: usize,
    rounds: usize,
) -> anyhow::Result<Value> {
    let methods: Vec<Box<dyn Method>> = vec![
        Box::new(peers::KvCodec { segment }),
        Box::new(peers::KvCodecFast { segment, row }),
        Box::new(Zstd1),
        Box::new(Lz4),
        Box::new(Planes(Zstd1, "zstd1_planes")),
        Box::new(Planes(Lz4, "lz4_planes")),
    ];
    let total: usize = blocks.iter().map(Vec::len).sum();
    let len = blocks[0].len();
    let mut out = vec![0u8; len];
    let mut memcpy = Duration::MAX;
    let mut best = vec![(Duration::MAX, Duration::MAX); methods.len()];
    let mut encoded: Vec<Vec<Vec<u8>>> = vec![vec![Vec::new(); blocks.len()]; methods.len()];
    for _ in 0..rounds {
        let t = Instant::now();
        for b in blocks {
            out.copy_from_slice(b);
            std::hint::black_box(&mut out);
        }
        memcpy = memcpy.min(t.elapsed());
        for (i, m) in methods.iter().enumerate() {
            let t = Instant::now();
            for (b, e) in blocks.iter().zip(encoded[i].iter_mut()) {
                m.encode(b, width, e)?;
            }
            let enc = t.elapsed();
            let t = Instant::now();
            for e in &encoded[i] {
                m.decode(e, width, &mut out)?;
                std::hint::black_box(&mut out);
            }
            let dec = t.elapsed();
            best[i] = (best[i].0.min(enc), best[i].1.min(dec));
        }
    }
    let memcpy_gbps = gbps(total, memcpy);
    let estimate = estimate_report(blocks, width, segment, rounds, &encoded[0], memcpy_gbps);
    let mut report = serde_json::Map::new();
    for (i, m) in methods.iter().enumerate() {
        let mut exact = true;
        for (b, e) in blocks.iter().zip(&encoded[i]) {
            out.fill(0);
            m.decode(e, width, &mut out)?;
            exact &= out == *b;
        }
        let enc_bytes: usize = encoded[i].iter().map(Vec::len).sum();
        let (enc, dec) = (gbps(total, best[i].0), gbps(total, best[i].1));
        report.insert(
            m.name().into(),
            json!({
                "ratio": total as f64 / enc_bytes.max(1) as f64,
                "encode_gbps": enc,
                "decode_gbps": dec,
                "encode_vs_memcpy": enc / memcpy_gbps,
                "decode_vs_memcpy": dec / memcpy_gbps,
                "bit_exact": exact,
            }),
        );
    }
    let mut v = entropy_report(blocks, width);
    // The disk tier stores a block encoded when that spares a 4 KiB unit:
    // blocks it holds in the same bytes, against raw.
    let units = |n: usize| n.div_ceil(4096);
    let raw_units: usize = blocks.iter().map(|b| units(b.len())).sum();
    let disk_units: usize = blocks
        .iter()
        .zip(&encoded[0])
        .map(|(b, e)| units(b.len()).min(units(e.len())))
        .sum();
    v["disk_blocks_ratio"] = json!(raw_units as f64 / disk_units.max(1) as f64);
    v["memcpy_gbps"] = json!(memcpy_gbps);
    v["methods"] = Value::Object(report);
    v["estimate"] = estimate;
    Ok(v)
}

/// The disk tier's pre-check (`kvfabric_codec::estimate_encoded_len`) on
/// the same blocks: its speed against memcpy and the encoder, and its
/// estimated total length against the codec's (`kvcodec`, `encoded`).
fn estimate_report(
    blocks: &[Vec<u8>],
    width: usize,
    segment: u32,
    rounds: usize,
    encoded: &[Vec<u8>],
    memcpy_gbps: f64,
) -> Value {
    let total: usize = blocks.iter().map(Vec::len).sum();
    let mut best = Duration::MAX;
    let mut est = 0usize;
    for _ in 0..rounds {
        let t = Instant::now();
        est = blocks
            .iter()
            .map(|b| kvfabric_codec::estimate_encoded_len(b, width, segment))
            .sum();
        best = best.min(t.elapsed());
    }
    let enc: usize = encoded.iter().map(Vec::len).sum();
    let g = gbps(total, best);
    json!({
        "gbps": g,
        "vs_memcpy": g / memcpy_gbps,
        "estimated_over_encoded": est as f64 / enc.max(1) as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvfabric_engine::kernels::convert::f32_to_f16;

    #[test]
    fn a_missing_model_is_refused() {
        let args = KvArgs {
            json: true,
            model: None,
            sessions: 1,
            system_tokens: 100,
            session_history_tokens: 0,
            blocks: 4,
            rounds: 1,
            threads: 1,
            kv_pool_mib: 64,
            seed: 1,
            dump_dir: None,
        };
        let err = measure(&args).expect_err("no model");
        assert!(err.to_string().contains("--model"), "{err}");
        let args = KvArgs {
            model: Some("/nonexistent/m.gguf".into()),
            ..args
        };
        let err = measure(&args).expect_err("missing");
        assert!(err.to_string().contains("kvfabric model fetch"), "{err}");
    }

    #[test]
    fn every_method_round_trips_and_reports_ratios() {
        // Two f16-like blocks (a repeating ramp): every method must decode
        // bit-exact, and the report carries each figure.
        let blocks: Vec<Vec<u8>> = (0..2u16)
            .map(|b| {
                (0..8192u16)
                    .flat_map(|i| f32_to_f16((i % 97 + b) as f32 * 0.01).to_le_bytes())
                    .collect()
            })
            .collect();
        let r = measure_set(&blocks, 2, 4096, 64, 1).expect("measure");
        for m in [
            "kvcodec",
            "kvcodec_fast",
            "zstd1",
            "lz4",
            "zstd1_planes",
            "lz4_planes",
        ] {
            assert_eq!(r["methods"][m]["bit_exact"], true, "{m}");
            assert!(
                r["methods"][m]["ratio"].as_f64().unwrap_or(0.0) > 1.0,
                "{m}"
            );
        }
        assert!(r["entropy_bound_ratio"].as_f64().unwrap_or(0.0) > 1.0);
        assert!(r["disk_blocks_ratio"].as_f64().unwrap_or(0.0) >= 1.0);
        assert!(r["estimate"]["gbps"].as_f64().unwrap_or(0.0) > 0.0);
        let e = r["estimate"]["estimated_over_encoded"]
            .as_f64()
            .unwrap_or(0.0);
        assert!(e > 0.5 && e < 2.0, "{e}");
    }
}
