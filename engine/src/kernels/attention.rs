//! Causal attention of one query row and one head over paged KV, batch-invariant.
//!
//! The same kernel serves prefill and decode: a query at position `p` reads
//! keys and values 0..=p by walking its block table in block order, computes
//! every score with one fixed dot-product tree, a softmax with a sequential
//! sum, and a sequential FMA sum of values. Nothing depends on which other
//! rows are in the batch, and there is no split over the context (no split-K).
//!
//! [`attend_group`] runs several such queries of one sequence and KV head
//! together (the query heads sharing the KV head, over consecutive rows, each
//! with its own causal length) so every K/V row is loaded once for all of
//! them; each query still gets exactly [`attend`]'s bits.

#[cfg(target_arch = "x86_64")]
use super::exp16;
use super::{exp_det, Isa};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
use avx2::attend_group_avx2;
#[cfg(target_arch = "x86_64")]
use avx512::attend_group_avx512;

/// Where one sequence's KV of one layer lives: per block, K and V base pointers,
/// each `[block_tokens][kv_heads][head_dim]` f32.
#[derive(Clone, Copy, Debug)]
pub struct BlockKv {
    pub k: *const f32,
    pub v: *const f32,
}

// SAFETY: read-only pointers into the KV pool, which outlives every kernel call
// and is not written while attention reads it.
unsafe impl Send for BlockKv {}
unsafe impl Sync for BlockKv {}

/// Geometry shared by all rows of a call.
#[derive(Clone, Copy, Debug)]
pub struct AttnGeometry {
    pub block_tokens: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

/// Fixed-order dot product: 16 lanes, FMA over head_dim/16 steps, then a halving tree.
#[inline(always)]
fn dot_ref(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    for (ca, cb) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
        for l in 0..16 {
            lanes[l] = ca[l].mul_add(cb[l], lanes[l]);
        }
    }
    let mut w = 8;
    while w > 0 {
        for l in 0..w {
            lanes[l] += lanes[l + w];
        }
        w /= 2;
    }
    lanes[0]
}

/// Attention of one (query row, head) into `out` (`head_dim` values).
///
/// # Safety
/// `blocks` must cover positions `0..ctx` and point to live KV of the geometry given.
#[allow(clippy::too_many_arguments)]
pub unsafe fn attend(
    isa: Isa,
    q: &[f32],
    out: &mut [f32],
    ctx: usize,
    blocks: &[BlockKv],
    g: &AttnGeometry,
    kv_head: usize,
    scores: &mut Vec<f32>,
) {
    scores.clear();
    scores.resize(ctx, 0.0);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => attend_avx512(q, out, ctx, blocks, g, kv_head, scores),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if g.head_dim == 64 => {
            attend_group_avx2(&[q], &mut [out], &[ctx], blocks, g, kv_head, scores)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => attend_fma(q, out, ctx, blocks, g, kv_head, scores),
        _ => attend_ref(q, out, ctx, blocks, g, kv_head, scores),
    }
}

/// Attention of several queries over the same KV head of one sequence, each
/// with its own causal length `ctxs[i]` (keys `0..ctxs[i]`), into `outs[i]`.
///
/// Each K and V row is loaded once for the whole group; every query's output
/// has the same bits as [`attend`] on that query alone (same dot tree, max,
/// exp, sequential sum and sequential value FMA), so grouping never changes
/// a result.
///
/// # Safety
/// `blocks` must cover positions `0..max(ctxs)` and point to live KV of the
/// geometry given; `queries`, `outs` and `ctxs` have the same length and every
/// query and output holds `head_dim` values.
#[allow(clippy::too_many_arguments)]
pub unsafe fn attend_group(
    isa: Isa,
    queries: &[&[f32]],
    outs: &mut [&mut [f32]],
    ctxs: &[usize],
    blocks: &[BlockKv],
    g: &AttnGeometry,
    kv_head: usize,
    scratch: &mut Vec<f32>,
) {
    assert!(queries.len() == outs.len() && queries.len() == ctxs.len());
    assert!(queries.iter().all(|q| q.len() >= g.head_dim));
    assert!(outs.iter().all(|o| o.len() >= g.head_dim));
    if queries.is_empty() {
        return;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if g.head_dim == 64 => {
            attend_group_avx512(queries, outs, ctxs, blocks, g, kv_head, scratch)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if g.head_dim == 64 => {
            attend_group_avx2(queries, outs, ctxs, blocks, g, kv_head, scratch)
        }
        _ => {
            for ((q, o), &ctx) in queries.iter().zip(outs.iter_mut()).zip(ctxs) {
                attend(isa, q, o, ctx, blocks, g, kv_head, scratch);
            }
        }
    }
}

#[inline(always)]
unsafe fn row_ptr(
    blocks: &[BlockKv],
    g: &AttnGeometry,
    kv_head: usize,
    j: usize,
    v: bool,
) -> *const f32 {
    let b = blocks[j / g.block_tokens];
    let off = ((j % g.block_tokens) * g.kv_heads + kv_head) * g.head_dim;
    if v {
        b.v.add(off)
    } else {
        b.k.add(off)
    }
}

#[inline(always)]
unsafe fn attend_ref(
    q: &[f32],
    out: &mut [f32],
    ctx: usize,
    blocks: &[BlockKv],
    g: &AttnGeometry,
    kv_head: usize,
    scores: &mut [f32],
) {
    let hd = g.head_dim;
    let mut max = f32::NEG_INFINITY;
    for (j, s) in scores.iter_mut().enumerate().take(ctx) {
        let k = std::slice::from_raw_parts(row_ptr(blocks, g, kv_head, j, false), hd);
        *s = dot_ref(q, k) * g.scale;
        max = max.max(*s);
    }
    for s in scores.iter_mut() {
        *s = exp_det(*s - max);
    }
    let mut sum = 0f32;
    for s in scores.iter() {
        sum += *s;
    }
    out.fill(0.0);
    for (j, p) in scores.iter().enumerate() {
        let v = std::slice::from_raw_parts(row_ptr(blocks, g, kv_head, j, true), hd);
        for (o, x) in out.iter_mut().zip(v) {
            *o = p.mul_add(*x, *o);
        }
    }
    let inv = 1.0 / sum;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_fma(
    q: &[f32],
    out: &mut [f32],
    ctx: usize,
    blocks: &[BlockKv],
    g: &AttnGeometry,
    kv_head: usize,
    scores: &mut [f32],
) {
    attend_ref(q, out, ctx, blocks, g, kv_head, scores)
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The halving-tree sum of 16 lanes, as in `dot_ref`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn reduce16(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    let s8 = _mm256_add_ps(lo, hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    _mm_cvtss_f32(s1)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn attend_avx512(
    q: &[f32],
    out: &mut [f32],
    ctx: usize,
    blocks: &[BlockKv],
    g: &AttnGeometry,
    kv_head: usize,
    scores: &mut [f32],
) {
    let hd = g.head_dim;
    if hd != 64 {
        return attend_fma(q, out, ctx, blocks, g, kv_head, scores);
    }
    let qv = [
        _mm512_loadu_ps(q.as_ptr()),
        _mm512_loadu_ps(q.as_ptr().add(16)),
        _mm512_loadu_ps(q.as_ptr().add(32)),
        _mm512_loadu_ps(q.as_ptr().add(48)),
    ];
    let mut max = f32::NEG_INFINITY;
    let sp = scores.as_mut_ptr();
    for j in 0..ctx {
        let k = row_ptr(blocks, g, kv_head, j, false);
        let mut acc = _mm512_fmadd_ps(qv[0], _mm512_loadu_ps(k), _mm512_setzero_ps());
        acc = _mm512_fmadd_ps(qv[1], _mm512_loadu_ps(k.add(16)), acc);
        acc = _mm512_fmadd_ps(qv[2], _mm512_loadu_ps(k.add(32)), acc);
        acc = _mm512_fmadd_ps(qv[3], _mm512_loadu_ps(k.add(48)), acc);
        let s = reduce16(acc) * g.scale;
        *sp.add(j) = s;
        max = max.max(s);
    }
    let mx = _mm512_set1_ps(max);
    let mut j = 0;
    while j + 16 <= ctx {
        let s = _mm512_loadu_ps(sp.add(j));
        _mm512_storeu_ps(sp.add(j), exp16(_mm512_sub_ps(s, mx)));
        j += 16;
    }
    if j < ctx {
        let mask: __mmask16 = ((1u32 << (ctx - j)) - 1) as u16;
        let s = _mm512_maskz_loadu_ps(mask, sp.add(j));
        _mm512_mask_storeu_ps(sp.add(j), mask, exp16(_mm512_sub_ps(s, mx)));
    }
    let mut sum = 0f32;
    for j in 0..ctx {
        sum += *sp.add(j);
    }
    let mut o = [_mm512_setzero_ps(); 4];
    for j in 0..ctx {
        let p = _mm512_set1_ps(*sp.add(j));
        let v = row_ptr(blocks, g, kv_head, j, true);
        for (i, ov) in o.iter_mut().enumerate() {
            *ov = _mm512_fmadd_ps(p, _mm512_loadu_ps(v.add(16 * i)), *ov);
        }
    }
    let inv = _mm512_set1_ps(1.0 / sum);
    for (i, ov) in o.iter().enumerate() {
        _mm512_storeu_ps(out.as_mut_ptr().add(16 * i), _mm512_mul_ps(*ov, inv));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_isa_gives_the_same_bits_and_softmax_is_right() {
        let (bt, kvh, hd) = (4usize, 2usize, 64usize);
        let nblocks = 5;
        let kv: Vec<Vec<f32>> = (0..2 * nblocks)
            .map(|b| {
                (0..bt * kvh * hd)
                    .map(|i| (((i * 7919 + b * 104729) % 1000) as f32 - 500.0) / 300.0)
                    .collect()
            })
            .collect();
        let blocks: Vec<BlockKv> = (0..nblocks)
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
        let q: Vec<f32> = (0..hd).map(|i| (i as f32 - 30.0) / 17.0).collect();
        let mut scores = Vec::new();
        for ctx in [1usize, 3, 16, 17, 20] {
            let mut want = vec![0f32; hd];
            unsafe { attend(Isa::Scalar, &q, &mut want, ctx, &blocks, &g, 1, &mut scores) };
            // f64 reference.
            let mut s64: Vec<f64> = (0..ctx)
                .map(|j| {
                    let k = unsafe {
                        std::slice::from_raw_parts(row_ptr(&blocks, &g, 1, j, false), hd)
                    };
                    q.iter()
                        .zip(k)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * 0.125
                })
                .collect();
            let mx = s64.iter().cloned().fold(f64::MIN, f64::max);
            s64.iter_mut().for_each(|s| *s = (*s - mx).exp());
            let tot: f64 = s64.iter().sum();
            for (d, w) in want.iter().enumerate() {
                let r: f64 = (0..ctx)
                    .map(|j| {
                        s64[j] / tot * unsafe { *row_ptr(&blocks, &g, 1, j, true).add(d) } as f64
                    })
                    .sum();
                assert!((r - *w as f64).abs() < 1e-5, "ctx {ctx} d {d}: {r} vs {w}");
            }
            for isa in [Isa::Avx2, Isa::Avx512] {
                if Isa::detect() == Isa::Scalar
                    || (isa == Isa::Avx512 && Isa::detect() != Isa::Avx512)
                {
                    continue;
                }
                let mut got = vec![0f32; hd];
                unsafe { attend(isa, &q, &mut got, ctx, &blocks, &g, 1, &mut scores) };
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{isa:?} ctx {ctx}"
                );
            }
        }
    }
    /// Random-ish KV of `nblocks` blocks of the given geometry, and its block table.
    fn kv_fixture(g: &AttnGeometry, nblocks: usize) -> (Vec<Vec<f32>>, Vec<BlockKv>) {
        let n = g.block_tokens * g.kv_heads * g.head_dim;
        let kv: Vec<Vec<f32>> = (0..2 * nblocks)
            .map(|b| {
                (0..n)
                    .map(|i| (((i * 7919 + b * 104729) % 2003) as f32 - 1001.0) / 250.0)
                    .collect()
            })
            .collect();
        let blocks = (0..nblocks)
            .map(|b| BlockKv {
                k: kv[2 * b].as_ptr(),
                v: kv[2 * b + 1].as_ptr(),
            })
            .collect();
        (kv, blocks)
    }

    #[test]
    fn group_gives_each_query_the_bits_of_the_reference() {
        let g = AttnGeometry {
            block_tokens: 16,
            kv_heads: 3,
            head_dim: 64,
            scale: 0.125,
        };
        let (_kv, blocks) = kv_fixture(&g, 300usize.div_ceil(16));
        // A prefill group as the engine runs it: 32 rows x 3 query heads.
        let prefill_group: Vec<usize> = (0..96).map(|i| 205 + i / 3).collect();
        let ctx_sets: [&[usize]; 8] = [
            &prefill_group,
            &[1, 15, 16, 17, 100, 300],
            // Twenty queries with mixed context lengths.
            &[
                300, 1, 17, 64, 65, 100, 129, 2, 16, 15, 299, 7, 8, 9, 250, 31, 33, 200, 5, 128,
            ],
            &[300, 17, 1, 100, 16, 15, 299],
            &[7],
            &[64, 64, 64, 65, 65, 65, 66, 66, 66, 67, 67, 67],
            &[129, 128, 127, 300, 2],
            &[1, 1, 1],
        ];
        let mut scratch = Vec::new();
        for (si, ctxs) in ctx_sets.iter().enumerate() {
            let qs: Vec<Vec<f32>> = (0..ctxs.len())
                .map(|i| {
                    (0..64)
                        .map(|d| (((d * 31 + i * 17 + si) % 61) as f32 - 30.0) / 9.0)
                        .collect()
                })
                .collect();
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
                    let mut got = vec![vec![f32::NAN; 64]; ctxs.len()];
                    {
                        let qr: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
                        let mut or: Vec<&mut [f32]> =
                            got.iter_mut().map(|o| o.as_mut_slice()).collect();
                        unsafe {
                            attend_group(isa, &qr, &mut or, ctxs, &blocks, &g, kvh, &mut scratch)
                        };
                    }
                    for (i, (w, o)) in want.iter().zip(&got).enumerate() {
                        assert_eq!(
                            w.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            o.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            "{isa:?} set {si} kv head {kvh} query {i} ctx {}",
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
                    assert_eq!(one, want[0], "{isa:?} single");
                }
            }
        }
    }

    /// Timing of 64 new rows x 9 heads over a 2048-token context in 64-token blocks
    /// (as the engine pools them), one thread:
    /// `cargo test --release -p kvfabric-engine attention_timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn attention_timing() {
        let g = AttnGeometry {
            block_tokens: 64,
            kv_heads: 3,
            head_dim: 64,
            scale: 0.125,
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
                    scratch.clear();
                    scratch.resize(ctx, 0.0);
                    match isa {
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx512 => {
                            attend_avx512(q, o, ctx, &blocks, &g, kvh, &mut scratch[..ctx])
                        }
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx2 => attend_fma(q, o, ctx, &blocks, &g, kvh, &mut scratch[..ctx]),
                        _ => attend_ref(q, o, ctx, &blocks, &g, kvh, &mut scratch[..ctx]),
                    }
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
}
