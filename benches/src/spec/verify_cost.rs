//! What a verification row costs: the forward pass of one sequence with
//! 1 + k rows (the sampled token and k drafted ones, every row's logits, as
//! the scheduler asks for them) against the pass of 1 row, at the context
//! length of the tool-calling prompts, straight on the model (no scheduler).
//! At batch 1 the weights are read once per pass whatever k is, so an extra
//! row costs only its compute; this is what bounds how long a draft pays.
//! Also timed: a draft's lookup in the request's own context; and reported:
//! the cost model the engine's own probe (`spec::calibrate`) fits here.

use std::time::Instant;

use anyhow::Context;
use kvfabric_engine::kernels::Compute;
use kvfabric_engine::kv::KvPool;
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::spec::calibrate;
use kvfabric_engine::spec::length::PassCost;
use kvfabric_engine::spec::shared::SharedContinuations;
use kvfabric_engine::spec::SpecState;
use kvfabric_engine::EngineConfig;
use serde_json::{json, Value};

/// Draft lengths timed.
const KS: [usize; 12] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 15];
const BT: usize = 16;

/// Best-of-`reps` milliseconds of a pass of 1 + k rows after `prompt`, for
/// each k of [`KS`] (the engine's probe's timing, [`calibrate::pass_times`]): the report's `verify_cost` object, and the costs as the
/// engine's cost model.
pub fn measure(
    model: &LlamaModel,
    threads: usize,
    prompt: &[u32],
    reps: usize,
) -> anyhow::Result<(Value, PassCost)> {
    let c = &model.config;
    let cx = Compute::new(threads);
    let dtype = EngineConfig::default().kv_dtype.into();
    let layout = KvPool::layout_for(c.layers, c.kv_heads, c.head_dim, BT, dtype);
    let kmax = KS[KS.len() - 1];
    let (ctx, rest) = prompt.split_at(prompt.len() - 1);
    // The rows: the prompt's last token, then its own opening as the "draft".
    let rows: Vec<u32> = rest
        .iter()
        .chain(prompt.iter().cycle())
        .take(kmax + 1)
        .copied()
        .collect();
    let ms: Vec<f64> = calibrate::pass_times(model, &cx, layout, ctx, &rows, &KS, reps)
        .context("verify passes")?
        .into_iter()
        .map(|t| t * 1e3)
        .collect();
    let base = ms[0];
    let per_k: serde_json::Map<String, Value> = KS
        .iter()
        .zip(&ms)
        .map(|(k, t)| (k.to_string(), json!({"ms": t, "vs_one_row": t / base})))
        .collect();
    // What the engine's own probe (run before its first draft) finds here.
    let engine = calibrate::measure(model, &cx, layout).context("the engine's pass-cost probe")?;
    let times: Vec<(usize, f64)> = KS.iter().copied().zip(ms.iter().copied()).collect();
    let table = PassCost::from_times(&times).context("no single-row pass time")?;
    let report = json!({
        "engine_pass_cost": {"by_draft_len": engine.table()},
        "context_tokens": ctx.len(),
        "reps": reps,
        "by_draft_len": per_k,
        "draft_lookup_us": draft_lookup_us(prompt, 15),
    });
    Ok((report, table))
}

/// Microseconds per draft (index update and lookup) when the request's own
/// context grows by one token per step through `prompt`.
fn draft_lookup_us(prompt: &[u32], max: usize) -> f64 {
    let shared = SharedContinuations::new(0);
    let mut state = SpecState::new(b"probe");
    let mut out = Vec::new();
    let t = Instant::now();
    for end in 1..=prompt.len() {
        state.draft(&prompt[..end], &shared, max, &PassCost::default(), &mut out);
    }
    t.elapsed().as_secs_f64() * 1e6 / prompt.len().max(1) as f64
}
