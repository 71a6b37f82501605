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
//!
//! K and V are stored as f32, f16 or bf16 (the geometry's dtype): every
//! kernel is generic over the stored element ([`elem::KvElem`]) and widens
//! it to f32 on load, exactly, so the arithmetic (and every bit of the
//! result) is the f32 kernel's on the stored values.

#[cfg(target_arch = "x86_64")]
use super::exp16;
use super::{exp_det, Isa};
use elem::{Bf16, KvElem, F16};
pub use geometry::{AttnGeometry, BlockKv};
use kvfabric_types::DType;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod elem;
mod geometry;
#[cfg(target_arch = "x86_64")]
use avx2::attend_group_avx2;
#[cfg(target_arch = "x86_64")]
use avx512::attend_group_avx512;

/// Fixed-order dot product: 16 lanes, FMA over head_dim/16 steps, then a halving tree.
#[inline(always)]
fn dot_ref<E: KvElem>(a: &[f32], b: &[E]) -> f32 {
    let mut lanes = [0f32; 16];
    for (ca, cb) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
        for l in 0..16 {
            lanes[l] = ca[l].mul_add(cb[l].widen(), lanes[l]);
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
    match g.dtype {
        DType::F32 => attend_one::<f32>(isa, q, out, ctx, blocks, g, kv_head, scores),
        DType::F16 => attend_one::<F16>(isa, q, out, ctx, blocks, g, kv_head, scores),
        DType::BF16 => attend_one::<Bf16>(isa, q, out, ctx, blocks, g, kv_head, scores),
    }
}

/// [`attend`] for stored elements `E`.
#[allow(clippy::too_many_arguments)]
unsafe fn attend_one<E: KvElem>(
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
        Isa::Avx512 => attend_avx512::<E>(q, out, ctx, blocks, g, kv_head, scores),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if g.head_dim == 64 => {
            attend_group_avx2::<E>(&[q], &mut [out], &[ctx], blocks, g, kv_head, scores)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => attend_fma::<E>(q, out, ctx, blocks, g, kv_head, scores),
        _ => attend_ref::<E>(q, out, ctx, blocks, g, kv_head, scores),
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
    #[cfg(target_arch = "x86_64")]
    macro_rules! by_dtype {
        ($kernel:ident) => {
            match g.dtype {
                DType::F32 => $kernel::<f32>(queries, outs, ctxs, blocks, g, kv_head, scratch),
                DType::F16 => $kernel::<F16>(queries, outs, ctxs, blocks, g, kv_head, scratch),
                DType::BF16 => $kernel::<Bf16>(queries, outs, ctxs, blocks, g, kv_head, scratch),
            }
        };
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if g.head_dim == 64 => by_dtype!(attend_group_avx512),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if g.head_dim == 64 => by_dtype!(attend_group_avx2),
        _ => {
            for ((q, o), &ctx) in queries.iter().zip(outs.iter_mut()).zip(ctxs) {
                attend(isa, q, o, ctx, blocks, g, kv_head, scratch);
            }
        }
    }
}

#[inline(always)]
unsafe fn row_ptr<E: KvElem>(
    blocks: &[BlockKv],
    g: &AttnGeometry,
    kv_head: usize,
    j: usize,
    v: bool,
) -> *const E {
    let b = blocks[j / g.block_tokens];
    let off = ((j % g.block_tokens) * g.kv_heads + kv_head) * g.head_dim;
    if v {
        (b.v as *const E).add(off)
    } else {
        (b.k as *const E).add(off)
    }
}

#[inline(always)]
unsafe fn attend_ref<E: KvElem>(
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
        let k = std::slice::from_raw_parts(row_ptr::<E>(blocks, g, kv_head, j, false), hd);
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
        let v = std::slice::from_raw_parts(row_ptr::<E>(blocks, g, kv_head, j, true), hd);
        for (o, x) in out.iter_mut().zip(v) {
            *o = p.mul_add(x.widen(), *o);
        }
    }
    let inv = 1.0 / sum;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_fma<E: KvElem>(
    q: &[f32],
    out: &mut [f32],
    ctx: usize,
    blocks: &[BlockKv],
    g: &AttnGeometry,
    kv_head: usize,
    scores: &mut [f32],
) {
    attend_ref::<E>(q, out, ctx, blocks, g, kv_head, scores)
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
#[target_feature(enable = "avx512f,fma,f16c")]
unsafe fn attend_avx512<E: KvElem>(
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
        return attend_fma::<E>(q, out, ctx, blocks, g, kv_head, scores);
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
        let k = row_ptr::<E>(blocks, g, kv_head, j, false);
        let mut acc = _mm512_fmadd_ps(qv[0], E::load16(k), _mm512_setzero_ps());
        acc = _mm512_fmadd_ps(qv[1], E::load16(k.add(16)), acc);
        acc = _mm512_fmadd_ps(qv[2], E::load16(k.add(32)), acc);
        acc = _mm512_fmadd_ps(qv[3], E::load16(k.add(48)), acc);
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
        let v = row_ptr::<E>(blocks, g, kv_head, j, true);
        for (i, ov) in o.iter_mut().enumerate() {
            *ov = _mm512_fmadd_ps(p, E::load16(v.add(16 * i)), *ov);
        }
    }
    let inv = _mm512_set1_ps(1.0 / sum);
    for (i, ov) in o.iter().enumerate() {
        _mm512_storeu_ps(out.as_mut_ptr().add(16 * i), _mm512_mul_ps(*ov, inv));
    }
}

#[cfg(test)]
mod tests;
