//! The costs `bench sim` runs on, measured on this machine unless given:
//! one engine (the agentic bench's settings, no prefix cache) answers a
//! short and a long prompt of the agentic workload with one token, and the
//! short one with `--answer-tokens` (at least [`DECODE_CALIBRATION_TOKENS`]);
//! prefill is fitted as fixed + per token
//! through the two one-token times, decode is the difference of the short
//! prompt's two times over the extra tokens. End-to-end times: in-process
//! an engine's token events can all arrive at the end, so a measured TTFT
//! may include the decode (a first version read decode as 0 from it). The
//! short prompt for decode: on the long one the prefill's run-to-run spread
//! was larger than the whole decode, and decode was read as 0 again. The
//! floor on answer tokens: with the agentic bench's 16, the decode (~75 ms,
//! speculation on) was within the short prefill's own spread (~1 s +- 5%),
//! and still read as 0 in some runs.
//! The best of `repeats` of each is kept (the machine is shared). Link
//! throughput is `--link-gbit` times `--link-efficiency` (the fraction of
//! the line rate a cross-host load reached in `bench reuse --hosts 2`).

use std::sync::Arc;

use anyhow::Context;
use kvfabric_engine::kv::KvPool;
use kvfabric_engine::model::LlamaModel;

use super::model::Costs;
use crate::agentic::driver::generate;
use crate::agentic::engines::{engine_config, start_engine, stop_engine};

/// Bytes of one block of KV as the engine stores and ships it.
pub fn block_bytes(model: &LlamaModel, threads: usize) -> u64 {
    let cfg = engine_config(threads, 64, true);
    let c = &model.config;
    KvPool::layout_for(
        c.layers,
        c.kv_heads,
        c.head_dim,
        cfg.block_tokens,
        cfg.kv_dtype.into(),
    )
    .block_bytes() as u64
}

/// Fewest answer tokens the decode cost is measured over.
pub const DECODE_CALIBRATION_TOKENS: usize = 96;

/// (prefill fixed ms, prefill ms per token, decode ms per token), measured
/// on prompts of `short` and `long` tokens taken from `tokens`.
pub async fn measure_engine(
    model: &Arc<LlamaModel>,
    threads: usize,
    tokens: &[u32],
    (short, long): (usize, usize),
    answer_tokens: usize,
    repeats: usize,
) -> anyhow::Result<(f64, f64, f64)> {
    anyhow::ensure!(
        short < long && long <= tokens.len(),
        "calibration prompts need {long} tokens, the workload has {}",
        tokens.len()
    );
    anyhow::ensure!(answer_tokens > 1, "--answer-tokens must be > 1");
    let answer_tokens = answer_tokens.max(DECODE_CALIBRATION_TOKENS);
    let cfg = engine_config(threads, 512, false);
    let engine = start_engine(model, &cfg, None).context("calibration engine")?;
    // In-process, an engine's token events may all arrive at the end, so
    // end-to-end times are fitted: one token (prefill), then `answer_tokens`.
    let mut best = [f64::MAX; 3];
    for _ in 0..repeats.max(1) {
        let runs = [(short, 1), (long, 1), (short, answer_tokens)];
        for (slot, (len, n)) in runs.into_iter().enumerate() {
            let c = generate(&engine.handle, tokens[..len].to_vec(), n, false).await?;
            best[slot] = best[slot].min(c.e2e.as_secs_f64() * 1e3);
        }
    }
    let [t_short, t_long, t_short_n] = best;
    tracing::info!(
        short,
        long,
        answer_tokens,
        t_short_ms = t_short,
        t_long_ms = t_long,
        t_short_answer_ms = t_short_n,
        "engine calibration timed"
    );
    let decode = ((t_short_n - t_short) / (answer_tokens - 1) as f64).max(0.0);
    stop_engine(engine).await?;
    let per_token = ((t_long - t_short) / (long - short) as f64).max(0.0);
    let fixed = (t_short - per_token * short as f64).max(0.0);
    Ok((fixed, per_token, decode))
}

/// Costs from measured engine figures and the link.
pub fn costs(
    engine: (f64, f64, f64),
    link_gbit: f64,
    link_efficiency: f64,
    block_bytes: u64,
) -> Costs {
    Costs {
        prefill_fixed_ms: engine.0,
        prefill_ms_per_token: engine.1,
        decode_ms_per_token: engine.2,
        link_bytes_per_s: link_gbit * 1e9 / 8.0 * link_efficiency,
        block_bytes,
    }
}
