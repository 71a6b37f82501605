//! What a verified row costs on this machine: the [`PassCost`] the draft
//! length is chosen by, measured once per scheduler when it starts (so the
//! probe counts to start-up, not to a request).
//!
//! A pass of one sequence with 1 + k rows after a short context, for each
//! k of [`PROBED`], best of [`REPS`] rounds (the rounds go through every k
//! in turn, so a slow spell of the machine touches all k alike), straight
//! on the model into a KV pool of its own (the engine's blocks are not
//! touched); the k's between are interpolated ([`PassCost::from_times`]).
//! At batch 1 the weights are read once per pass whatever the row count, so
//! an extra row costs only its compute, and how much that is differs by ISA,
//! core and row count: on an AVX-512 Zen 4, 0.27 of a single-row pass for
//! the first row, 0.25-0.37 for each of the next six and 0.7 for the ninth
//! (a second pass); about 0.16 on a Zen 5; over 0.5 on an AVX2 Zen 3. A
//! fixed model fitted on the Zen 5 drafted 15% too much on the Zen 3 (free
//! chat ran at 0.85 of no speculation, `kvfabric bench spec`), and a line
//! through 1, 2 and 9 rows overcharged the rows between by 60% on the Zen
//! 4. The probe costs about 42 single-row passes per round and a prefill of
//! [`CONTEXT`] tokens (0.6 s on the Zen 4); where it fails the default model
//! stands and the failure is logged.

use std::time::Instant;

use super::length::{PassCost, TABLE_K};
use crate::kernels::Compute;
use crate::kv::{BlockId, KvPool};
use crate::model::{LlamaModel, SeqChunk};
use crate::EngineError;

/// Tokens of context before the probed rows.
const CONTEXT: usize = 64;
/// Draft lengths timed (the others are interpolated): every k up to the
/// AVX-512 kernels' first pass of 8 rows and just past it, then sparser.
const PROBED: [usize; 13] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, TABLE_K];
/// Rounds over [`PROBED`] (the best time of each k is kept).
const REPS: usize = 3;

/// Measure this machine's pass cost on `model` with the engine's KV layout.
pub fn measure(
    model: &LlamaModel,
    cx: &Compute,
    layout: kvfabric_types::KvLayout,
) -> Result<PassCost, EngineError> {
    // Any tokens do: the cost does not depend on their values.
    let vocab = model.config.vocab.max(2) as u32;
    let tokens: Vec<u32> = (0..(CONTEXT + TABLE_K + 1) as u32)
        .map(|i| (i * 7919 + 17) % vocab)
        .collect();
    let (context, rows) = tokens.split_at(CONTEXT);
    let best = pass_times(model, cx, layout, context, rows, &PROBED, REPS)?;
    let times: Vec<(usize, f64)> = PROBED.iter().copied().zip(best).collect();
    PassCost::from_times(&times).ok_or(EngineError::CostProbe { times })
}

/// Seconds of a pass of one sequence with 1 + k rows (`rows[..=k]`, every
/// row's logits) after `context`, for each k of `ks` (each at most
/// `rows.len() - 1`), best of `rounds` rounds that each go through every k
/// in turn (so a slow spell of the machine touches all k alike). Straight
/// on the model, into a KV pool of its own in `layout`.
pub fn pass_times(
    model: &LlamaModel,
    cx: &Compute,
    layout: kvfabric_types::KvLayout,
    context: &[u32],
    rows: &[u32],
    ks: &[usize],
    rounds: usize,
) -> Result<Vec<f64>, EngineError> {
    let bt = layout.block_tokens as usize;
    let blocks = (context.len() + rows.len()).div_ceil(bt);
    let mut kv = KvPool::with_bytes(layout, (blocks * layout.block_bytes()) as u64)?;
    let table: Vec<BlockId> = (0..blocks as u32).collect();
    let prefill = SeqChunk {
        tokens: context,
        start: 0,
        blocks: &table,
        logits: false,
    };
    model.forward(cx, &mut kv, &[prefill])?;
    let mut best = vec![f64::MAX; ks.len()];
    for _ in 0..rounds.max(1) {
        for (i, &k) in ks.iter().enumerate() {
            let chunk = [SeqChunk {
                tokens: &rows[..k + 1],
                start: context.len(),
                blocks: &table,
                logits: true,
            }];
            let t = Instant::now();
            model.forward_rows(cx, &mut kv, &chunk, &[k + 1], &mut |_| {})?;
            best[i] = best[i].min(t.elapsed().as_secs_f64());
        }
    }
    Ok(best)
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
                by_draft_len = ?cost.table(),
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
