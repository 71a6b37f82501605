//! Kernel timing probes (ignored tests): `cargo test --release -p kvfabric-engine
//! perf_ -- --ignored --nocapture --test-threads=1`. Min-of-many timings, robust
//! to a shared machine; one probe at a time (probes run side by side share the
//! cores and time each other).

use std::time::Instant;

use super::test_weights::{random_q4_1, random_q8_0};
use super::{Isa, PackedMatrix, ThreadPool};

/// The number in environment variable `name`, or `default`.
fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

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
    let threads = env_or("PERF_THREADS", 1);
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

/// One forward's matmuls with every layer's weights distinct (30 layers of
/// random Q4_1 plus the Q8_0 lm_head, ~100 MB), so the weights stream from
/// memory as in a real decode step instead of staying in L2 as in
/// `perf_matmul_shapes`. Best of `PERF_ROUNDS` (default 20) forwards, m = 1 and 8.
#[test]
#[ignore]
fn perf_matmul_stream() {
    let threads = env_or("PERF_THREADS", 2);
    let rounds = env_or("PERF_ROUNDS", 20);
    let pool = ThreadPool::new(threads);
    let isa = Isa::detect();
    let pack = |n: usize, k: usize, seed: u64, q8: bool| {
        let (info, bytes, _) = if q8 {
            random_q8_0(n, k, seed)
        } else {
            random_q4_1(n, k, seed)
        };
        PackedMatrix::pack(&[(&info, &bytes)]).expect("pack")
    };
    let layers: Vec<[PackedMatrix; 4]> = (0..30u64)
        .map(|l| {
            [
                pack(960, 576, 4 * l + 1, false),
                pack(576, 576, 4 * l + 2, false),
                pack(3072, 576, 4 * l + 3, false),
                pack(576, 1536, 4 * l + 4, false),
            ]
        })
        .collect();
    let lm_head = pack(49152, 576, 999, true);
    for m in [1usize, 8] {
        let x: Vec<f32> = (0..m * 1536)
            .map(|i| (i % 17) as f32 / 17.0 - 0.5)
            .collect();
        let mut out = vec![0f32; m * 49152];
        let (mut best_layers, mut best_head) = (f64::MAX, f64::MAX);
        for _ in 0..rounds {
            let t = Instant::now();
            for l in &layers {
                for w in l {
                    w.matmul(&pool, isa, &x[..m * w.k()], m, &mut out[..m * w.n()]);
                }
            }
            best_layers = best_layers.min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            lm_head.matmul(&pool, isa, &x[..m * 576], m, &mut out);
            best_head = best_head.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{isa:?} threads={threads} m={m}: layers {:.3} ms, lm_head {:.3} ms",
            best_layers * 1e3,
            best_head * 1e3
        );
    }
}
