//! Tests of the attention kernels: every ISA and every stored dtype against
//! the scalar reference, and the reference against f64.

use super::*;
use crate::kernels::convert::round_row;

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// K and V buffers (per block, K then V) holding `f(i, buffer)` rounded to
/// `g.dtype`, and their block table. The buffers are f32-aligned.
fn stored(
    g: &AttnGeometry,
    nblocks: usize,
    f: impl Fn(usize, usize) -> f32,
) -> (Vec<Vec<f32>>, Vec<BlockKv>) {
    let n = g.block_tokens * g.kv_heads * g.head_dim;
    let kv: Vec<Vec<f32>> = (0..2 * nblocks)
        .map(|b| {
            let vals: Vec<f32> = (0..n).map(|i| f(i, b)).collect();
            let mut buf = vec![0f32; (n * g.dtype.size()).div_ceil(4)];
            unsafe { round_row(Isa::Scalar, g.dtype, &vals, buf.as_mut_ptr() as *mut u8) };
            buf
        })
        .collect();
    let blocks = (0..nblocks)
        .map(|b| BlockKv {
            k: kv[2 * b].as_ptr() as *const u8,
            v: kv[2 * b + 1].as_ptr() as *const u8,
        })
        .collect();
    (kv, blocks)
}

/// Value `d` of K (or V) row `j` of KV head `kvh`, widened.
fn value(blocks: &[BlockKv], g: &AttnGeometry, kvh: usize, j: usize, v: bool, d: usize) -> f32 {
    unsafe {
        match g.dtype {
            DType::F32 => *row_ptr::<f32>(blocks, g, kvh, j, v).add(d),
            DType::F16 => (*row_ptr::<F16>(blocks, g, kvh, j, v).add(d)).widen(),
            DType::BF16 => (*row_ptr::<Bf16>(blocks, g, kvh, j, v).add(d)).widen(),
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn every_isa_gives_the_same_bits_and_softmax_is_right() {
    let (bt, kvh, hd) = (4usize, 2usize, 64usize);
    let nblocks = 5;
    for dtype in DTYPES {
        let g = AttnGeometry {
            block_tokens: bt,
            kv_heads: kvh,
            head_dim: hd,
            scale: 0.125,
            dtype,
        };
        let (_kv, blocks) = stored(&g, nblocks, |i, b| {
            (((i * 7919 + b * 104729) % 1000) as f32 - 500.0) / 300.0
        });
        let q: Vec<f32> = (0..hd).map(|i| (i as f32 - 30.0) / 17.0).collect();
        let mut scores = Vec::new();
        for ctx in [1usize, 3, 16, 17, 20] {
            let mut want = vec![0f32; hd];
            unsafe { attend(Isa::Scalar, &q, &mut want, ctx, &blocks, &g, 1, &mut scores) };
            // f64 reference on the stored (widened) values.
            let mut s64: Vec<f64> = (0..ctx)
                .map(|j| {
                    (0..hd)
                        .map(|d| q[d] as f64 * value(&blocks, &g, 1, j, false, d) as f64)
                        .sum::<f64>()
                        * 0.125
                })
                .collect();
            let mx = s64.iter().cloned().fold(f64::MIN, f64::max);
            s64.iter_mut().for_each(|s| *s = (*s - mx).exp());
            let tot: f64 = s64.iter().sum();
            for (d, w) in want.iter().enumerate() {
                let r: f64 = (0..ctx)
                    .map(|j| s64[j] / tot * value(&blocks, &g, 1, j, true, d) as f64)
                    .sum();
                assert!(
                    (r - *w as f64).abs() < 1e-5,
                    "{dtype} ctx {ctx} d {d}: {r} vs {w}"
                );
            }
            for isa in Isa::all_detected() {
                let mut got = vec![0f32; hd];
                unsafe { attend(isa, &q, &mut got, ctx, &blocks, &g, 1, &mut scores) };
                assert_eq!(bits(&got), bits(&want), "{dtype} {isa:?} ctx {ctx}");
            }
        }
    }
}

/// Random-ish KV of `nblocks` blocks of the given geometry, and its block table.
fn kv_fixture(g: &AttnGeometry, nblocks: usize) -> (Vec<Vec<f32>>, Vec<BlockKv>) {
    stored(g, nblocks, |i, b| {
        (((i * 7919 + b * 104729) % 2003) as f32 - 1001.0) / 250.0
    })
}

/// Query sets as the engine groups them, and odd ones.
fn ctx_sets() -> Vec<Vec<usize>> {
    vec![
        // A prefill group as the engine runs it: 32 rows x 3 query heads.
        (0..96).map(|i| 205 + i / 3).collect(),
        vec![1, 15, 16, 17, 100, 300],
        // Twenty queries with mixed context lengths.
        vec![
            300, 1, 17, 64, 65, 100, 129, 2, 16, 15, 299, 7, 8, 9, 250, 31, 33, 200, 5, 128,
        ],
        vec![300, 17, 1, 100, 16, 15, 299],
        vec![7],
        vec![64, 64, 64, 65, 65, 65, 66, 66, 66, 67, 67, 67],
        vec![129, 128, 127, 300, 2],
        vec![1, 1, 1],
    ]
}

fn queries(n: usize, si: usize) -> Vec<Vec<f32>> {
    (0..n)
        .map(|i| {
            (0..64)
                .map(|d| (((d * 31 + i * 17 + si) % 61) as f32 - 30.0) / 9.0)
                .collect()
        })
        .collect()
}

/// `attend_group` of `qs` on `isa`, one output per query.
fn group(
    isa: Isa,
    qs: &[Vec<f32>],
    ctxs: &[usize],
    blocks: &[BlockKv],
    g: &AttnGeometry,
    kvh: usize,
) -> Vec<Vec<f32>> {
    let mut got = vec![vec![f32::NAN; 64]; ctxs.len()];
    let qr: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
    let mut or: Vec<&mut [f32]> = got.iter_mut().map(|o| o.as_mut_slice()).collect();
    let mut scratch = Vec::new();
    unsafe { attend_group(isa, &qr, &mut or, ctxs, blocks, g, kvh, &mut scratch) };
    got
}

#[test]
fn group_gives_each_query_the_bits_of_the_reference() {
    for dtype in DTYPES {
        let g = AttnGeometry {
            block_tokens: 16,
            kv_heads: 3,
            head_dim: 64,
            scale: 0.125,
            dtype,
        };
        let (_kv, blocks) = kv_fixture(&g, 300usize.div_ceil(16));
        let mut scratch = Vec::new();
        for (si, ctxs) in ctx_sets().iter().enumerate() {
            let qs = queries(ctxs.len(), si);
            for kvh in 0..3 {
                let want: Vec<Vec<f32>> = qs
                    .iter()
                    .zip(ctxs.iter())
                    .map(|(q, &c)| {
                        let mut o = vec![0f32; 64];
                        unsafe {
                            attend(Isa::Scalar, q, &mut o, c, &blocks, &g, kvh, &mut scratch)
                        };
                        o
                    })
                    .collect();
                for isa in Isa::all_detected() {
                    let got = group(isa, &qs, ctxs, &blocks, &g, kvh);
                    for (i, (w, o)) in want.iter().zip(&got).enumerate() {
                        assert_eq!(
                            bits(w),
                            bits(o),
                            "{dtype} {isa:?} set {si} kv head {kvh} query {i} ctx {}",
                            ctxs[i]
                        );
                    }
                    // The single-query entry point agrees too.
                    let mut one = vec![0f32; 64];
                    unsafe {
                        attend(
                            isa,
                            &qs[0],
                            &mut one,
                            ctxs[0],
                            &blocks,
                            &g,
                            kvh,
                            &mut scratch,
                        )
                    };
                    assert_eq!(bits(&one), bits(&want[0]), "{dtype} {isa:?} single");
                }
            }
        }
    }
}

/// Widening is exact: a half store gives the bits an f32 store of the same
/// (rounded) values gives, on every ISA; and it is not the f32 result of the
/// unrounded values (the rounding happened once, at the store).
#[test]
fn half_kv_is_f32_attention_on_the_rounded_values() {
    let raw = |i: usize, b: usize| (((i * 7919 + b * 104729) % 2003) as f32 - 1001.0) / 250.0;
    for dtype in [DType::F16, DType::BF16] {
        let geom = |dtype| AttnGeometry {
            block_tokens: 16,
            kv_heads: 3,
            head_dim: 64,
            scale: 0.125,
            dtype,
        };
        let (gh, gf) = (geom(dtype), geom(DType::F32));
        let (_h, half) = stored(&gh, 19, raw);
        let widen = |v: f32| {
            let mut b = [0f32; 1];
            unsafe { round_row(Isa::Scalar, dtype, &[v], b.as_mut_ptr() as *mut u8) };
            let h = (b[0].to_bits() & 0xffff) as u16;
            match dtype {
                DType::F16 => crate::kernels::convert::f16_to_f32(h),
                _ => crate::kernels::convert::bf16_to_f32(h),
            }
        };
        let (_w, wide) = stored(&gf, 19, |i, b| widen(raw(i, b)));
        let (_r, unrounded) = stored(&gf, 19, raw);
        let ctxs: Vec<usize> = (0..12).map(|i| 290 + i / 3).collect();
        let qs = queries(ctxs.len(), 5);
        for isa in Isa::all_detected() {
            let h = group(isa, &qs, &ctxs, &half, &gh, 1);
            let w = group(isa, &qs, &ctxs, &wide, &gf, 1);
            let r = group(isa, &qs, &ctxs, &unrounded, &gf, 1);
            for i in 0..ctxs.len() {
                assert_eq!(bits(&h[i]), bits(&w[i]), "{dtype} {isa:?} query {i}");
            }
            assert_ne!(bits(&h[0]), bits(&r[0]), "{dtype}: the store rounds");
        }
    }
}

/// The stored dtype of `attention_timing` (`KVFABRIC_TEST_KV_DTYPE`, default f32).
fn timing_dtype() -> DType {
    std::env::var("KVFABRIC_TEST_KV_DTYPE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DType::F32)
}

/// Timing of 64 new rows x 9 heads over a 2048-token context in 64-token blocks
/// (as the engine pools them), one thread:
/// `cargo test --release -p kvfabric-engine attention_timing -- --ignored --nocapture`
/// (stored dtype: `KVFABRIC_TEST_KV_DTYPE`, default f32).
#[test]
#[ignore]
fn attention_timing() {
    let g = AttnGeometry {
        block_tokens: 64,
        kv_heads: 3,
        head_dim: 64,
        scale: 0.125,
        dtype: timing_dtype(),
    };
    let (rows, start) = (64usize, 2048usize);
    let (_kv, blocks) = kv_fixture(&g, (start + rows).div_ceil(64));
    let qs: Vec<Vec<f32>> = (0..rows * 9)
        .map(|i| {
            (0..64)
                .map(|d| ((d * 13 + i * 7) % 29) as f32 / 29.0 - 0.5)
                .collect()
        })
        .collect();
    let mut out = vec![vec![0f32; 64]; rows * 9];
    let mut scratch = Vec::new();
    let isa = Isa::detect();
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    for round in 0..3 {
        let t = std::time::Instant::now();
        for (i, (q, o)) in qs.iter().zip(out.iter_mut()).enumerate() {
            let ctx = start + i / 9 + 1;
            let kvh = (i % 9) / 3;
            unsafe {
                attend(isa, q, o, ctx, &blocks, &g, kvh, &mut scratch);
            }
        }
        let per_query = t.elapsed();
        let mut line = format!("round {round} {isa:?}: per query {:.1} ms", ms(per_query));
        for gr in [1usize, 2, 4, 8] {
            let t = std::time::Instant::now();
            for r0 in (0..rows).step_by(gr) {
                for kvh in 0..3 {
                    let mut qr = Vec::new();
                    let mut ctxs = Vec::new();
                    let mut idx = Vec::new();
                    for r in r0..r0 + gr {
                        for h in 3 * kvh..3 * kvh + 3 {
                            qr.push(qs[r * 9 + h].as_slice());
                            ctxs.push(start + r + 1);
                            idx.push(r * 9 + h);
                        }
                    }
                    let mut or: Vec<&mut [f32]> = out
                        .iter_mut()
                        .enumerate()
                        .filter(|(i, _)| idx.contains(i))
                        .map(|(_, o)| o.as_mut_slice())
                        .collect();
                    unsafe {
                        attend_group(isa, &qr, &mut or, &ctxs, &blocks, &g, kvh, &mut scratch)
                    };
                }
            }
            line += &format!(", {gr} rows x 3 heads {:.1} ms", ms(t.elapsed()));
        }
        println!("{line}");
    }
}
