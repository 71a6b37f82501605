//! Decode-step timing probes on the reference model (ignored tests):
//! `cargo test --release -p kvfabric-engine --test perf_decode -- --ignored --nocapture`.
//! `perf_decode_steps` times batch-1 and batch-8 decode steps over 128-token
//! prompts, the shape of `kvfabric bench engine`'s decode figures, so a
//! profiler (`perf record`) can look at decode alone, without the prefills the
//! bench also runs. `perf_verify_rows` times one sequence's pass of 1 + k
//! rows (a speculative step verifying k drafted tokens).

use kvfabric_testkit::engine::driver as common;

use std::time::Instant;

use kvfabric_engine::kernels::{Compute, Isa};
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

/// One sequence's pass of `m` rows (1 + k drafted tokens, all with logits)
/// after `PERF_CONTEXT` (default 64) tokens of context, for `m` in `PERF_ROWS` (default 1, 2, 3, 4, 5,
/// 8, 9), best of `PERF_ROUNDS` (default 10) rounds that each time every row
/// count once; in ms and in single-row passes (`spec::calibrate`'s probe,
/// every row count). `PERF_ISA=avx2`, `PERF_THREADS=n`: see below.
#[test]
#[ignore]
fn perf_verify_rows() {
    let env = |name: &str| std::env::var(name).ok();
    let rounds: usize = env("PERF_ROUNDS")
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let rows: Vec<usize> = env("PERF_ROWS")
        .map(|v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 3, 4, 5, 8, 9]);
    // PERF_ISA=avx2 and PERF_THREADS=n time the AVX2 kernels on n threads on
    // any machine (default: the best ISA, every core).
    let threads = env("PERF_THREADS")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let own = Compute::new(threads);
    let own = match env("PERF_ISA").as_deref() {
        Some("avx2") => Compute {
            isa: Isa::Avx2,
            ..own
        },
        _ => own,
    };
    let (model, cx) = (common::model(), &own);
    // PERF_CONTEXT: tokens before the rows (default 64).
    let context: usize = env("PERF_CONTEXT")
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let bt = 16;
    let most = rows.iter().copied().max().unwrap_or(1);
    let blocks = (context + most).div_ceil(bt);
    let mut kv = common::pool(bt, blocks, common::DType::F16);
    let table: Vec<BlockId> = (0..blocks as u32).collect();
    let tokens: Vec<u32> = (0..(context + most) as u32)
        .map(|i| (i * 7919 + 17) % 49_000)
        .collect();
    let chunk = |start: usize, end: usize, logits: bool| SeqChunk {
        tokens: &tokens[start..end],
        start,
        blocks: &table,
        logits,
    };
    model
        .forward(cx, &mut kv, &[chunk(0, context, false)])
        .expect("prefill");
    let mut best = vec![f64::MAX; rows.len()];
    for _ in 0..rounds {
        for (i, &m) in rows.iter().enumerate() {
            let t = Instant::now();
            model
                .forward_rows(
                    cx,
                    &mut kv,
                    &[chunk(context, context + m, true)],
                    &[m],
                    &mut |_| {},
                )
                .expect("verify pass");
            best[i] = best[i].min(t.elapsed().as_secs_f64());
        }
    }
    let one = best[rows.iter().position(|&m| m == 1).unwrap_or(0)];
    let line: Vec<String> = rows
        .iter()
        .zip(&best)
        .map(|(m, t)| format!("m={m}: {:.2} ms ({:.2}x)", t * 1e3, t / one))
        .collect();
    println!(
        "{:?}, {} threads: {}",
        cx.isa,
        cx.pool.threads(),
        line.join("  ")
    );
}
