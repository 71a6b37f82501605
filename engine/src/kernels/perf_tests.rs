//! Kernel timing probes (ignored tests): `cargo test --release -p kvfabric-engine
//! perf_ -- --ignored --nocapture`. Min-of-many timings, robust to a shared machine.

use std::time::Instant;

use super::matmul::tests::{random_q4_1, random_q8_0};
use super::{Isa, PackedMatrix, ThreadPool};

fn min_time(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

#[test]
#[ignore]
fn perf_matmul_shapes() {
    let threads: usize = std::env::var("PERF_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let pool = ThreadPool::new(threads);
    let isa = Isa::detect();
    let shapes: [(&str, usize, usize, bool); 5] = [
        ("qkv", 960, 576, false),
        ("attn_out", 576, 576, false),
        ("gate_up", 3072, 576, false),
        ("down", 576, 1536, false),
        ("lm_head", 49152, 576, true),
    ];
    let mut per_token = [0f64; 4];
    for (name, n, k, q8) in shapes {
        let (info, bytes, _) = if q8 {
            random_q8_0(n, k, 3)
        } else {
            random_q4_1(n, k, 3)
        };
        let w = PackedMatrix::pack(&[(&info, &bytes)]).expect("pack");
        let mult = if name == "lm_head" { 1.0 } else { 30.0 };
        let mut line = format!("{name:>9} {n:>6}x{k:<5}");
        for (i, m) in [1usize, 2, 4, 8].into_iter().enumerate() {
            let x: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 / 17.0 - 0.5).collect();
            let mut out = vec![0f32; m * n];
            let reps = if q8 { 40 } else { 400 };
            let t = min_time(reps, || w.matmul(&pool, isa, &x, m, &mut out));
            per_token[i] += t * mult;
            line += &format!("  m={m}: {:8.1} us", t * 1e6);
        }
        println!("{line}");
    }
    println!(
        "{isa:?} threads={threads}: one forward's matmuls (ms) m=1 {:.3}  m=2 {:.3}  m=4 {:.3}  m=8 {:.3}",
        per_token[0] * 1e3,
        per_token[1] * 1e3,
        per_token[2] * 1e3,
        per_token[3] * 1e3
    );
}

#[test]
#[ignore]
fn perf_pool_overhead() {
    let pool = ThreadPool::new(2);
    let t = min_time(20, || {
        for _ in 0..1000 {
            pool.run(9, &|i| {
                std::hint::black_box(i);
            });
        }
    });
    println!(
        "pool.run(9 empty tasks), 2 threads: {:.2} us per run",
        t * 1e3
    );
}

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

unsafe extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// CPU time of the calling thread (s): unlike wall time, not inflated by
/// other processes taking the core.
fn thread_cpu() -> f64 {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: valid out pointer; CLOCK_THREAD_CPUTIME_ID = 3 on Linux.
    unsafe { clock_gettime(3, &mut ts) };
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p) as usize]
}

/// Per-step decode timings of the reference model at batch 1 and 8: CPU time of
/// the calling thread and wall time (min / p10 / median ms). `PERF_THREADS`
/// (default 2) and `PERF_ROUNDS` (default 2) tune it.
#[test]
#[ignore]
#[allow(clippy::needless_range_loop)]
fn perf_decode_steps() {
    use crate::kernels::Compute;
    use crate::kv::{BlockId, KvPool};
    use crate::model::{reference_model_path, LlamaModel, SeqChunk};
    let path = reference_model_path();
    if !path.exists() {
        eprintln!("skipped: no model at {}", path.display());
        return;
    }
    let model = LlamaModel::load(&path, |_, _| {}).expect("load");
    let c = &model.config;
    let threads: usize = std::env::var("PERF_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let cx = Compute::new(threads);
    let bt = 64;
    let (prompt, steps) = (128usize, 128usize);
    let per = (prompt + steps).div_ceil(bt);
    let layout = KvPool::layout_for(c.layers, c.kv_heads, c.head_dim, bt);
    let mut kv = KvPool::with_bytes(layout, (8 * per * layout.block_bytes()) as u64).expect("kv");
    let rounds: usize = std::env::var("PERF_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    for _ in 0..rounds {
        for batch in [1usize, 8] {
            let tables: Vec<Vec<BlockId>> = (0..batch)
                .map(|i| ((i * per) as u32..((i + 1) * per) as u32).collect())
                .collect();
            let prompts: Vec<Vec<u32>> = (0..batch)
                .map(|i| {
                    (0..prompt as u32)
                        .map(|t| 100 + (t * 7919 + i as u32 * 31) % 40000)
                        .collect()
                })
                .collect();
            let chunks: Vec<SeqChunk> = (0..batch)
                .map(|i| SeqChunk {
                    tokens: &prompts[i],
                    start: 0,
                    blocks: &tables[i],
                    logits: false,
                })
                .collect();
            model.forward(&cx, &mut kv, &chunks).expect("prefill");
            let (mut times, mut cpus) = (Vec::new(), Vec::new());
            for s in 0..steps {
                let toks: Vec<[u32; 1]> = (0..batch).map(|i| [prompts[i][s]]).collect();
                let chunks: Vec<SeqChunk> = (0..batch)
                    .map(|i| SeqChunk {
                        tokens: &toks[i],
                        start: prompt + s,
                        blocks: &tables[i],
                        logits: true,
                    })
                    .collect();
                let t = Instant::now();
                let cpu = thread_cpu();
                model.forward(&cx, &mut kv, &chunks).expect("decode");
                times.push(t.elapsed().as_secs_f64() * 1e3);
                cpus.push((thread_cpu() - cpu) * 1e3);
            }
            let min = pct(&mut times, 0.0);
            println!(
                "threads={threads} batch={batch}: caller cpu ms min {:.3} med {:.3}; wall ms min {min:.3} p10 {:.3} med {:.3} => {:.1} tok/s (min)",
                pct(&mut cpus, 0.0),
                pct(&mut cpus, 0.5),
                pct(&mut times, 0.1),
                pct(&mut times, 0.5),
                batch as f64 * 1e3 / min
            );
        }
    }
}

/// One (query, head) attention over `ctx` keys, per ISA (us).
#[test]
#[ignore]
fn perf_attention() {
    use super::attention::{attend, AttnGeometry, BlockKv};
    let (bt, kvh, hd, ctx) = (64usize, 3usize, 64usize, 1024usize);
    let kv: Vec<Vec<f32>> = (0..2 * ctx / bt)
        .map(|b| {
            (0..bt * kvh * hd)
                .map(|i| ((i * 7 + b) % 13) as f32 / 13.0 - 0.5)
                .collect()
        })
        .collect();
    let blocks: Vec<BlockKv> = (0..ctx / bt)
        .map(|b| BlockKv {
            k: kv[2 * b].as_ptr(),
            v: kv[2 * b + 1].as_ptr(),
        })
        .collect();
    let g = AttnGeometry {
        block_tokens: bt,
        kv_heads: kvh,
        head_dim: hd,
        scale: 0.125,
    };
    let q: Vec<f32> = (0..hd).map(|i| i as f32 / 64.0 - 0.5).collect();
    let mut scores = Vec::new();
    let mut out = vec![0f32; hd];
    for isa in [Isa::Scalar, Isa::detect()] {
        let t = min_time(200, || unsafe {
            attend(isa, &q, &mut out, ctx, &blocks, &g, 1, &mut scores)
        });
        println!(
            "attend {isa:?} ctx={ctx}: {:.2} us ({:.2} ns/key)",
            t * 1e6,
            t * 1e9 / ctx as f64
        );
    }
}

/// Prefill-sized matmul throughput (GFLOP/s) on the model's largest shape, one
/// thread: the figure to compare with the core's FMA peak.
#[test]
#[ignore]
fn perf_prefill_matmul() {
    let pool = ThreadPool::new(1);
    let isa = Isa::detect();
    let (n, k) = (3072, 576);
    let (info, bytes, _) = random_q4_1(n, k, 3);
    let w = PackedMatrix::pack(&[(&info, &bytes)]).expect("pack");
    for m in [6usize, 64, 512] {
        let x: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 / 17.0 - 0.5).collect();
        let mut out = vec![0f32; m * n];
        let t = min_time(20, || w.matmul(&pool, isa, &x, m, &mut out));
        let gflops = 2.0 * (m * n * k) as f64 / t / 1e9;
        println!(
            "{isa:?} gate_up m={m}: {:.2} ms, {gflops:.1} GFLOP/s",
            t * 1e3
        );
    }
}
