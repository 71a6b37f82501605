//! Decode-step timing probe on the reference model (ignored test):
//! `cargo test --release -p kvfabric-engine --test perf_decode -- --ignored --nocapture`.
//! Times batch-1 and batch-8 decode steps over 128-token prompts, the shape of
//! `kvfabric bench engine`'s decode figures, so a profiler (`perf record`) can
//! look at decode alone, without the prefills the bench also runs.

use kvfabric_testkit::engine::driver as common;

use std::time::Instant;

use kvfabric_engine::kv::BlockId;
use kvfabric_engine::model::SeqChunk;

const PROMPT: usize = 128;
const STEPS: usize = 64;

/// Best-of-`rounds` seconds per decode step at `batch`.
fn step_seconds(batch: usize, rounds: usize) -> f64 {
    let (model, cx) = (common::model(), common::compute());
    let bt = 16;
    let per = (PROMPT + STEPS).div_ceil(bt);
    let mut kv = common::pool(bt, batch * per, common::DType::F16);
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|i| {
            (0..PROMPT)
                .map(|j| ((i * 7919 + j * 104_729) % 49_000) as u32)
                .collect()
        })
        .collect();
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
    model.forward(cx, &mut kv, &chunks).expect("prefill");
    // Each round rewrites the same positions' KV with the same values.
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let t = Instant::now();
        for s in 0..STEPS {
            let toks: Vec<[u32; 1]> = prompts.iter().map(|p| [p[s % PROMPT]]).collect();
            let chunks: Vec<SeqChunk> = (0..batch)
                .map(|i| SeqChunk {
                    tokens: &toks[i],
                    start: PROMPT + s,
                    blocks: &tables[i],
                    logits: true,
                })
                .collect();
            model.forward(cx, &mut kv, &chunks).expect("decode");
        }
        best = best.min(t.elapsed().as_secs_f64() / STEPS as f64);
    }
    best
}

#[test]
#[ignore]
fn perf_decode_steps() {
    let env = |name: &str| -> Option<usize> { std::env::var(name).ok()?.parse().ok() };
    let rounds = env("PERF_ROUNDS").unwrap_or(5);
    // PERF_ONLY=8 (or 1) times one batch size alone, for a profiler.
    let only = env("PERF_ONLY");
    if let Some(batch) = only {
        let t = step_seconds(batch, rounds);
        println!("decode step: batch {batch} {:.3} ms", t * 1e3);
        return;
    }
    let one = step_seconds(1, rounds);
    let eight = step_seconds(8, rounds);
    println!(
        "decode step: batch 1 {:.3} ms ({:.0} tok/s), batch 8 {:.3} ms ({:.0} tok/s), ratio {:.2}",
        one * 1e3,
        1.0 / one,
        eight * 1e3,
        8.0 / eight,
        one * 8.0 / eight
    );
}
