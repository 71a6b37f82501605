//! What a verified row costs on this machine: the [`PassCost`] the draft
//! length is chosen by, measured once per scheduler when it starts (so the
//! probe counts to start-up, not to a request).
//!
//! A pass of one sequence with 1, 2 and 1 + [`PROBE_K`] rows after a short
//! context, best of [`REPS`] each, straight on the model into a KV pool of
//! its own (the engine's blocks are not touched). At batch 1 the weights are
//! read once per pass whatever the row count, so an extra row costs only its
//! compute, and how much that is differs by ISA and core: about 0.16 of a
//! single-row pass on an AVX-512 Zen 5, over 0.5 on an AVX2 Zen 3. A fixed
//! model fitted on the first drafted 15% too much on the second (free chat
//! ran at 0.85 of no speculation, `kvfabric bench spec`). The probe costs
//! 2 x [`REPS`] + 1 passes and a prefill of [`CONTEXT`] tokens; where it
//! fails the default model stands and the failure is logged.

use std::time::Instant;

use super::length::PassCost;
use crate::kernels::Compute;
use crate::kv::{BlockId, KvPool};
use crate::model::{LlamaModel, SeqChunk};
use crate::EngineError;

/// Tokens of context before the probed rows.
const CONTEXT: usize = 64;
/// Drafted rows of the long probe.
const PROBE_K: usize = 8;
/// Passes timed per row count (the best is kept).
const REPS: usize = 2;

/// Measure this machine's pass cost on `model` with the engine's KV layout.
pub fn measure(
    model: &LlamaModel,
    cx: &Compute,
    layout: kvfabric_types::KvLayout,
) -> Result<PassCost, EngineError> {
    let bt = layout.block_tokens as usize;
    let blocks = (CONTEXT + PROBE_K + 1).div_ceil(bt);
    let mut kv = KvPool::with_bytes(layout, (blocks * layout.block_bytes()) as u64)?;
    let table: Vec<BlockId> = (0..blocks as u32).collect();
    // Any tokens do: the cost does not depend on their values.
    let vocab = model.config.vocab.max(2) as u32;
    let tokens: Vec<u32> = (0..(CONTEXT + PROBE_K + 1) as u32)
        .map(|i| (i * 7919 + 17) % vocab)
        .collect();
    let prefill = SeqChunk {
        tokens: &tokens[..CONTEXT],
        start: 0,
        blocks: &table,
        logits: false,
    };
    model.forward(cx, &mut kv, &[prefill])?;
    let mut time = |k: usize| -> Result<f64, EngineError> {
        let chunk = [SeqChunk {
            tokens: &tokens[CONTEXT..CONTEXT + k + 1],
            start: CONTEXT,
            blocks: &table,
            logits: true,
        }];
        let mut best = f64::MAX;
        for _ in 0..REPS {
            let t = Instant::now();
            model.forward_rows(cx, &mut kv, &chunk, &[k + 1], &mut |_| {})?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    };
    let (t0, t1, tk) = (time(0)?, time(1)?, time(PROBE_K)?);
    Ok(PassCost::fit(t0, t1, PROBE_K, tk))
}

/// [`measure`], falling back to [`PassCost::default`] (logged) when the
/// probe cannot run.
pub fn measure_or_default(
    model: &LlamaModel,
    cx: &Compute,
    layout: kvfabric_types::KvLayout,
) -> PassCost {
    let started = Instant::now();
    match measure(model, cx, layout) {
        Ok(cost) => {
            tracing::info!(
                base = cost.base,
                row = cost.row,
                ms = started.elapsed().as_millis() as u64,
                "speculative decoding: verify pass cost measured"
            );
            cost
        }
        Err(e) => {
            let cost = PassCost::default();
            tracing::warn!(error = %e, ?cost, "speculative decoding: pass cost probe failed, default cost model used");
            cost
        }
    }
}
