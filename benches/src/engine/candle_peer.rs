//! The candle peer of `kvfabric bench engine` (cargo feature `candle-peer`):
//! candle-transformers' `quantized_llama` on the same GGUF file with every
//! weight dequantized to f32 at load (candle's own Q4_1/Q8_0 dequantizer),
//! so each matmul is candle's f32 gemm — the configuration that gives correct
//! text for this model (candle's native Q4_1 CPU matmul is scalar and was
//! wrong here). It runs in-process, after kvfabric's figures and RSS are
//! taken, inside a rayon pool of the bench's thread count.

use std::io::Cursor;
use std::path::Path;
use std::time::Instant;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use serde_json::{json, Value};

use super::peers::{PeerWorkload, Rates};

/// Load, time the four figures on `work`'s tokens, return rates + details.
pub fn measure(model: &Path, work: &PeerWorkload) -> anyhow::Result<(Rates, Value)> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(work.threads.max(1))
        .build()?;
    pool.install(|| {
        let started = Instant::now();
        let mut weights = load_f32(model)?;
        let load_s = started.elapsed().as_secs_f64();
        let rates = Rates {
            prefill512: prefill(&mut weights, &work.prefill512, work.repeats)?,
            prefill2048: prefill(&mut weights, &work.prefill2048, work.repeats)?,
            decode1: decode(
                &mut weights,
                &work.decode_prompts[..1],
                work.decode_steps,
                work.repeats,
            )?,
            decode8: decode(
                &mut weights,
                &work.decode_prompts,
                work.decode_steps,
                work.repeats,
            )?,
        };
        let details = json!({
            "engine": "candle-transformers 0.11 quantized_llama, weights dequantized to f32 at load (f32 gemm)",
            "threads": work.threads,
            "load_s": load_s,
        });
        Ok((rates, details))
    })
}

/// The model with every tensor dequantized to f32: the GGUF is rewritten in
/// memory with F32 tensors (same metadata), so `quantized_llama` turns each
/// weight into a plain f32 tensor and uses candle's f32 matmul.
fn load_f32(model: &Path) -> anyhow::Result<ModelWeights> {
    let dev = Device::Cpu;
    let mut file = std::fs::File::open(model)?;
    let content = gguf_file::Content::read(&mut file)?;
    let mut buf = Cursor::new(Vec::new());
    {
        let mut tensors = Vec::with_capacity(content.tensor_infos.len());
        for name in content.tensor_infos.keys() {
            let packed = content.tensor(&mut file, name, &dev)?;
            let f32 = packed.dequantize(&dev)?;
            tensors.push((name.clone(), QTensor::quantize(&f32, GgmlDType::F32)?));
        }
        let metadata: Vec<(&str, &gguf_file::Value)> = content
            .metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v))
            .collect();
        let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        gguf_file::write(&mut buf, &metadata, &refs)?;
    }
    buf.set_position(0);
    let f32_content = gguf_file::Content::read(&mut buf)?;
    Ok(ModelWeights::from_gguf(f32_content, &mut buf, &dev)?)
}

fn batch(rows: &[&[u32]]) -> anyhow::Result<Tensor> {
    let width = rows.first().map_or(0, |r| r.len());
    let flat: Vec<u32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Ok(Tensor::from_vec(flat, (rows.len(), width), &Device::Cpu)?)
}

/// Best-of-`repeats` tokens/s of one prefill (position 0 resets the cache).
fn prefill(weights: &mut ModelWeights, tokens: &[u32], repeats: usize) -> anyhow::Result<f64> {
    let x = batch(&[tokens])?;
    let mut best = f64::MAX;
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        // candle's CPU ops are eager: the logits exist when forward returns.
        weights.forward(&x, 0)?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(tokens.len() as f64 / best)
}

/// Aggregate decode tokens/s of `prompts.len()` sequences after their
/// prompts, feeding each sequence its own prompt tokens as kvfabric does;
/// best of `repeats`.
fn decode(
    weights: &mut ModelWeights,
    prompts: &[Vec<u32>],
    steps: usize,
    repeats: usize,
) -> anyhow::Result<f64> {
    let rows: Vec<&[u32]> = prompts.iter().map(|p| p.as_slice()).collect();
    let prompt_len = rows.first().map_or(0, |r| r.len());
    anyhow::ensure!(prompt_len > 0, "empty decode prompt");
    let prompt = batch(&rows)?;
    let mut best = f64::MAX;
    for _ in 0..repeats.max(1) {
        // Position 0 resets the cache: the prompts are recomputed each time.
        weights.forward(&prompt, 0)?;
        let t = Instant::now();
        for s in 0..steps {
            let step: Vec<[u32; 1]> = prompts.iter().map(|p| [p[s % prompt_len]]).collect();
            let step_rows: Vec<&[u32]> = step.iter().map(|r| r.as_slice()).collect();
            weights.forward(&batch(&step_rows)?, prompt_len + s)?;
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok((prompts.len() * steps) as f64 / best)
}
