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

/// The row counts in environment variable `name` (comma-separated), or `default`.
fn env_rows(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

/// Best of `reps` runs of `a` and of `b`, run alternately (a shared machine
/// slows both alike).
fn min_times(reps: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
    let (mut ta, mut tb) = (f64::MAX, f64::MAX);
    for _ in 0..reps {
        ta = ta.min(min_time(1, &mut a));
        tb = tb.min(min_time(1, &mut b));
    }
    (ta, tb)
}

/// One forward's matmuls of the reference model (SmolLM2-135M: 30 layers of
/// Q4_1 qkv 960x576, attn_out 576x576, gate_up 3072x576, down 576x1536, and
/// the Q8_0 lm_head 49152x576) at `m` rows (`PERF_ROWS`, default 1, 2, 3, 4,
/// 5, 8, 9): the small-batch kernels (`matmul`: the fused rows) against the
/// scratch path (`matmul_scratch`), interleaved, hot in cache (each shape
/// timed alone, best of `PERF_REPS`, default 60, scaled down for lm_head).
/// Ratios are to one row through `matmul` (the fused single-row kernel,
/// decode): what verifying m - 1 drafted tokens costs in single-row passes.
/// `PERF_THREADS` (default 1) threads; `PERF_ISA=avx2` times the AVX2
/// kernels on an AVX-512 machine.
#[test]
#[ignore]
fn perf_matmul_rows() {
    let threads = env_or("PERF_THREADS", 1);
    let reps = env_or("PERF_REPS", 60);
    let pool = ThreadPool::new(threads);
    let isa = match std::env::var("PERF_ISA").as_deref() {
        Ok("avx2") => Isa::Avx2,
        _ => Isa::detect(),
    };
    let shapes: [(&str, usize, usize, bool, f64); 5] = [
        ("qkv", 960, 576, false, 30.0),
        ("attn_out", 576, 576, false, 30.0),
        ("gate_up", 3072, 576, false, 30.0),
        ("down", 576, 1536, false, 30.0),
        ("lm_head", 49152, 576, true, 1.0),
    ];
    let rows = env_rows("PERF_ROWS", &[1, 2, 3, 4, 5, 8, 9]);
    // Per row count: one forward's matmul time, fused and scratch.
    let mut forward = vec![(0f64, 0f64); rows.len()];
    for (name, n, k, q8, mult) in shapes {
        let (info, bytes, _) = if q8 {
            random_q8_0(n, k, 3)
        } else {
            random_q4_1(n, k, 3)
        };
        let w = PackedMatrix::pack(&[(&info, &bytes)]).expect("pack");
        let reps = if q8 { reps.div_ceil(10) } else { reps };
        let mut line = format!("{name:>9} {n:>5}x{k:<5} us fused/scratch:");
        for (i, &m) in rows.iter().enumerate() {
            let x: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 / 17.0 - 0.5).collect();
            let (mut o1, mut o2) = (vec![0f32; m * n], vec![0f32; m * n]);
            let (tf, ts) = min_times(
                reps,
                || w.matmul(&pool, isa, &x, m, &mut o1),
                || w.matmul_scratch(&pool, isa, &x, m, &mut o2),
            );
            assert_eq!(o1, o2, "{name} m={m}");
            forward[i].0 += tf * mult;
            forward[i].1 += ts * mult;
            line += &format!("  m={m}: {:.0}/{:.0}", tf * 1e6, ts * 1e6);
        }
        println!("{line}");
    }
    let one = forward[rows.iter().position(|&m| m == 1).unwrap_or(0)].0;
    println!("{isa:?} threads={threads}: one forward's matmuls, ms (x one row through matmul)");
    for (m, (tf, ts)) in rows.iter().zip(&forward) {
        println!(
            "  m={m:>2}: fused {:7.3} ({:.2}x)  scratch {:7.3} ({:.2}x)  fused/scratch {:.3}",
            tf * 1e3,
            tf / one,
            ts * 1e3,
            ts / one,
            tf / ts
        );
    }
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

#[cfg(target_arch = "x86_64")]
mod amx {
    //! The pieces of [`super::perf_amx_tile_costs`]: asking Linux for the
    //! tile state, the buffers, the weight conversion and the timed loops.

    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::time::Instant;

    /// Whether this CPU has AMX-BF16 and Linux granted this process the
    /// tile state.
    pub(super) fn granted() -> bool {
        // CPUID.(EAX=7,ECX=0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE; then ask Linux
        // for the tile state (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)).
        let edx = __cpuid_count(7, 0).edx;
        if edx & (1 << 22) != 0 && edx & (1 << 24) != 0 {
            let ret: isize;
            // SAFETY: a plain syscall with integer arguments.
            unsafe {
                asm!("syscall", inlateout("rax") 158isize => ret, in("rdi") 0x1023usize,
                 in("rsi") 18usize, lateout("rcx") _, lateout("r11") _, options(nostack));
            }
            ret == 0
        } else {
            false
        }
    }

    #[repr(C, align(64))]
    pub(super) struct Cfg([u8; 64]);
    #[repr(align(64))]
    pub(super) struct Buf(pub(super) [u8; 1 << 16]);

    /// Q4_1 nibbles of 48 columns x 32 k to VNNI bf16, with the operations a
    /// kernel would use (the lookup table's values do not change the timing).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn convert(src: *const u8, dst: *mut u8) {
        let table = _mm512_set1_epi32(0x3f80_0000);
        for p in 0..48 {
            let b = _mm512_cvtepu8_epi32(_mm_loadu_si128(src.add(p * 64) as *const __m128i));
            let idx = _mm512_or_si512(b, _mm512_slli_epi32(b, 12));
            _mm512_store_si512(
                dst.add(p * 64) as *mut _,
                _mm512_permutexvar_epi16(idx, table),
            );
        }
    }

    /// Time each variant of one k-block with `rows` activation rows.
    pub(super) fn time_variants(rows: u8, src: &Buf, wts: &mut Buf, prod: &mut Buf, act: &Buf) {
        let mut cfg = Cfg([0; 64]);
        cfg.0[0] = 1;
        for t in 0..8 {
            cfg.0[16 + 2 * t] = 64;
            cfg.0[48 + t] = if (3..6).contains(&t) { 16 } else { rows };
        }
        let n = 50_000usize;
        let names = [
            "tile loads + 9 products",
            "+ converting the next weights",
            "+ storing the sums",
            "+ converting, storing, folding a stored block",
        ];
        // SAFETY: AMX granted above; the configuration is a valid palette 1.
        unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr()) };
        for (variant, name) in names.iter().enumerate() {
            let t = Instant::now();
            for it in 0..n {
                let kb = it % 8;
                // SAFETY: AMX granted above; every pointer stays inside its buffer.
                unsafe {
                    let w = wts.0.as_mut_ptr().add(kb * 3072);
                    let a = act.0.as_ptr().add(kb * 64);
                    asm!(
                        "tileloadd tmm3, [{w} + {ws}*1]", "tileloadd tmm4, [{w1} + {ws}*1]",
                        "tileloadd tmm5, [{w2} + {ws}*1]",
                        "tilezero tmm0", "tilezero tmm1", "tilezero tmm2",
                        "tileloadd tmm6, [{a} + {s}*1]",
                        "tdpbf16ps tmm0, tmm6, tmm3", "tdpbf16ps tmm1, tmm6, tmm4", "tdpbf16ps tmm2, tmm6, tmm5",
                        "tileloadd tmm7, [{a} + {s}*1]",
                        "tdpbf16ps tmm0, tmm7, tmm3", "tdpbf16ps tmm1, tmm7, tmm4", "tdpbf16ps tmm2, tmm7, tmm5",
                        "tileloadd tmm6, [{a} + {s}*1]",
                        "tdpbf16ps tmm0, tmm6, tmm3", "tdpbf16ps tmm1, tmm6, tmm4", "tdpbf16ps tmm2, tmm6, tmm5",
                        w = in(reg) w, w1 = in(reg) w.add(1024), w2 = in(reg) w.add(2048),
                        ws = in(reg) 64usize, a = in(reg) a, s = in(reg) 2048usize,
                    );
                    if variant == 1 || variant == 3 {
                        convert(
                            src.0.as_ptr().add(kb * 3072),
                            wts.0.as_mut_ptr().add(((kb + 2) % 8) * 3072),
                        );
                    }
                    let p = prod.0.as_mut_ptr().add((it % 4) * 4096);
                    if variant >= 2 {
                        asm!(
                            "tilestored [{p} + {ps}*1], tmm0", "tilestored [{p1} + {ps}*1], tmm1",
                            "tilestored [{p2} + {ps}*1], tmm2",
                            p = in(reg) p, p1 = in(reg) p.add(64), p2 = in(reg) p.add(128), ps = in(reg) 192usize,
                        );
                    }
                    if variant == 3 {
                        // Fold the block stored two k-blocks ago into running sums.
                        let q = prod.0.as_ptr().add(((it + 2) % 4) * 4096) as *const f32;
                        let sums = prod.0.as_mut_ptr().add(1 << 15) as *mut f32;
                        for r in 0..rows as usize {
                            for g in 0..3 {
                                let (o, i) = (sums.add(r * 48 + g * 16), q.add(r * 48 + g * 16));
                                _mm512_storeu_ps(
                                    o,
                                    _mm512_add_ps(_mm512_loadu_ps(o), _mm512_load_ps(i)),
                                );
                            }
                        }
                    }
                }
            }
            let ns = t.elapsed().as_secs_f64() / n as f64 * 1e9;
            println!("rows {rows}: {name}: {ns:.1} ns per k-block of 48 columns");
        }
        // SAFETY: releases the tile state this thread configured.
        unsafe { asm!("tilerelease") };
    }
}

/// Why the matmuls do not use AMX tiles (see docs/BENCHMARKS.md, "AMX tiles
/// measured for the matmuls"):
/// what one k-block of a weight-only-quantized AMX-BF16 matmul costs on this
/// CPU, piece by piece. Three 16-column groups (tmm0-2 sums, tmm3-5 weights)
/// and the f32 activations as three exact bf16 planes (tmm6/7, alternating),
/// so 9 tile products per 48 x 32 weights. Skipped without AMX.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn perf_amx_tile_costs() {
    use amx::{convert, Buf};
    if !amx::granted() || !is_x86_feature_detected!("avx512bw") {
        println!("no AMX-BF16 here: skipped");
        return;
    }
    let src = Box::new(Buf([0x13; 1 << 16]));
    let mut wts = Box::new(Buf([0x3f; 1 << 16]));
    let mut prod = Box::new(Buf([0; 1 << 16]));
    let act = Box::new(Buf([0x3f; 1 << 16]));

    for rows in [1u8, 8] {
        amx::time_variants(rows, &src, &mut wts, &mut prod, &act);
    }
    let t = Instant::now();
    for it in 0..50_000usize {
        // SAFETY: avx512bw checked above; pointers inside the buffers.
        unsafe {
            convert(
                src.0.as_ptr().add((it % 8) * 3072),
                wts.0.as_mut_ptr().add((it % 8) * 3072),
            )
        };
    }
    println!(
        "converting 48 x 32 weights alone: {:.1} ns",
        t.elapsed().as_secs_f64() / 50_000.0 * 1e9
    );
    // The FMA kernels on the same amount of weights, one thread, hot in L2.
    let (n, k) = (3072, 576);
    let (info, bytes, _) = random_q4_1(n, k, 3);
    let w = PackedMatrix::pack(&[(&info, &bytes)]).expect("pack");
    let pool = ThreadPool::new(1);
    for m in [1usize, 8] {
        let x: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 / 17.0 - 0.5).collect();
        let mut out = vec![0f32; m * n];
        let t = min_time(200, || w.matmul(&pool, Isa::detect(), &x, m, &mut out));
        let blocks = (n / 48 * (k / 32)) as f64;
        println!(
            "FMA kernels, {m} rows: {:.1} ns per k-block of 48 columns",
            t / blocks * 1e9
        );
    }
}
