//! The AVX-512 twin of the group attention kernel in [`super::avx2`]: the
//! same operations on every query's values, in the same order, with wider
//! instructions. A K row's 64 products take 4 FMAs of 16 lanes (lane `l`
//! holds `dot_ref`'s lane `l`, so the first tree level is the low half plus
//! the high half, as the AVX2 kernel's two 8-lane accumulators give it),
//! softmax numerators run 16 scores at a time, and value accumulation runs
//! four queries at once over whole 64-value rows. Stored f16/bf16 rows are
//! widened as in the AVX2 kernel (a tile's K rows once; a chunk's V rows
//! once when more than one set of four queries reads them).

// Register tiles are indexed [query][vector] explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use kvfabric_types::DType;

use super::avx2::{reduce8x8, RowPrefetch, RowWalk, KCHUNK, SLOT_OF_KEY, TILE};
use super::elem::{stage_row, KvElem};
use super::geometry::{AttnGeometry, BlockKv};
use crate::kernels::exp16;

const HD: usize = 64;
/// Queries whose value rows accumulate together (4 x 4 accumulators).
const PV_QUERIES: usize = 4;

/// Group attention for `head_dim == 64` on AVX-512 (see [`super::attend_group`]).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn attend_group_avx512<E: KvElem>(
    queries: &[&[f32]],
    outs: &mut [&mut [f32]],
    ctxs: &[usize],
    blocks: &[BlockKv],
    g: &AttnGeometry,
    kv_head: usize,
    scratch: &mut Vec<f32>,
) {
    let n = queries.len();
    let maxc = ctxs.iter().copied().max().unwrap_or(0);
    // Rows of 16-score vectors (the softmax pass reads whole vectors).
    let stride = maxc.div_ceil(16) * 16;
    // Scores, then (for stored halves) a staging area of one value chunk.
    let stage_len = if E::DTYPE == DType::F32 {
        0
    } else {
        KCHUNK * HD
    };
    if scratch.len() < n * stride + stage_len {
        scratch.resize(n * stride + stage_len, 0.0);
    }
    let sc = scratch.as_mut_ptr();
    let scale = _mm256_set1_ps(g.scale);

    // Scores, a tile of 8 keys at a time (their K rows stay in L1 for every query).
    let mut stage = [_mm256_setzero_ps(); TILE];
    let st = stage.as_mut_ptr() as *mut f32;
    let mut kst = [0f32; TILE * HD];
    let mut kp = [std::ptr::null::<f32>(); TILE];
    let mut w = RowWalk::<E>::new(blocks, g, kv_head);
    let mut prefetch = RowPrefetch::<E>::new(blocks, g, kv_head, n, maxc);
    for j0 in (0..maxc).step_by(TILE) {
        let nk = (maxc - j0).min(TILE);
        prefetch.ahead_of(j0);
        for (t, p) in kp.iter_mut().take(nk).enumerate() {
            *p = stage_row(w.next().0, kst.as_mut_ptr(), t, HD);
        }
        for (i, q) in queries.iter().enumerate() {
            if ctxs[i] <= j0 {
                continue;
            }
            let qp = q.as_ptr();
            let qr = [0, 1, 2, 3].map(|c| _mm512_loadu_ps(qp.add(16 * c)));
            // Slots of keys past `nk` keep stale values: they only reach their own lanes.
            for (&k, &slot) in kp.iter().zip(&SLOT_OF_KEY).take(nk) {
                let mut acc = _mm512_fmadd_ps(qr[0], _mm512_loadu_ps(k), _mm512_setzero_ps());
                for (c, qv) in qr.iter().enumerate().skip(1) {
                    acc = _mm512_fmadd_ps(*qv, _mm512_loadu_ps(k.add(16 * c)), acc);
                }
                let lo = _mm512_castps512_ps256(acc);
                let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
                _mm256_storeu_ps(st.add(slot * TILE), _mm256_add_ps(lo, hi));
            }
            let s = _mm256_mul_ps(reduce8x8(st), scale);
            _mm256_storeu_ps(sc.add(i * stride + j0), s);
        }
    }

    // Softmax numerators per query: max over its own keys, then exp.
    for (i, &ctx) in ctxs.iter().enumerate() {
        let sp = sc.add(i * stride);
        let full = ctx / 16 * 16;
        let mut mv = _mm512_set1_ps(f32::NEG_INFINITY);
        for j in (0..full).step_by(16) {
            // A NaN score is skipped, as `f32::max` does.
            mv = _mm512_max_ps(_mm512_loadu_ps(sp.add(j)), mv);
        }
        let mut lanes = [0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), mv);
        let mut max = lanes.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        for j in full..ctx {
            max = max.max(*sp.add(j));
        }
        let mx = _mm512_set1_ps(max);
        for j in (0..ctx).step_by(16) {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sp.add(j)), mx));
            _mm512_storeu_ps(sp.add(j), e);
        }
    }

    // Values: per chunk of keys, queries in fours; each query's FMA chain and
    // numerator sum run over its own keys in order.
    let mut sums = vec![0f32; n];
    for o in outs.iter_mut() {
        o[..HD].fill(0.0);
    }
    let stage = sc.add(n * stride);
    let mut vp = [std::ptr::null::<E>(); KCHUNK];
    let mut vf = [std::ptr::null::<f32>(); KCHUNK];
    let mut w = RowWalk::<E>::new(blocks, g, kv_head);
    for c0 in (0..maxc).step_by(KCHUNK) {
        let c1 = (c0 + KCHUNK).min(maxc);
        for p in vp.iter_mut().take(c1 - c0) {
            *p = w.next().1;
        }
        if E::DTYPE == DType::F32 || n <= PV_QUERIES {
            ValueChunk::new(&vp, c0, c1, sc, stride).run(outs, &mut sums, ctxs);
        } else {
            for (i, (f, p)) in vf.iter_mut().zip(&vp).take(c1 - c0).enumerate() {
                *f = stage_row(*p, stage, i, HD);
            }
            ValueChunk::new(&vf, c0, c1, sc, stride).run(outs, &mut sums, ctxs);
        }
    }
    for (o, s) in outs.iter_mut().zip(&sums) {
        let inv = _mm512_set1_ps(1.0 / s);
        for t in 0..HD / 16 {
            let p = o.as_mut_ptr().add(16 * t);
            _mm512_storeu_ps(p, _mm512_mul_ps(_mm512_loadu_ps(p), inv));
        }
    }
}

/// Value rows `c0..c1` (pointers `vp[j - c0]`) and the softmax numerators.
struct ValueChunk<'a, V> {
    vp: &'a [*const V; KCHUNK],
    c0: usize,
    c1: usize,
    scores: *const f32,
    stride: usize,
}

impl<'a, V: KvElem> ValueChunk<'a, V> {
    fn new(
        vp: &'a [*const V; KCHUNK],
        c0: usize,
        c1: usize,
        scores: *const f32,
        stride: usize,
    ) -> Self {
        ValueChunk {
            vp,
            c0,
            c1,
            scores,
            stride,
        }
    }

    /// Every query of the group, in fours.
    #[target_feature(enable = "avx512f,fma,f16c")]
    unsafe fn run(&self, outs: &mut [&mut [f32]], sums: &mut [f32], ctxs: &[usize]) {
        let n = outs.len();
        let mut i = 0;
        while i < n {
            let q = (n - i).min(PV_QUERIES);
            let (o, s, c) = (&mut outs[i..i + q], &mut sums[i..i + q], &ctxs[i..i + q]);
            match q {
                4 => self.accumulate::<4>(i, o, s, c),
                3 => self.accumulate::<3>(i, o, s, c),
                2 => self.accumulate::<2>(i, o, s, c),
                _ => self.accumulate::<1>(i, o, s, c),
            }
            i += q;
        }
    }

    /// `o += p[j] * v_j` and `sum += p[j]` for `Q` queries (the first is query
    /// `first` of the group), each over its keys `j < ctx` of this chunk in order.
    #[target_feature(enable = "avx512f,fma,f16c")]
    unsafe fn accumulate<const Q: usize>(
        &self,
        first: usize,
        outs: &mut [&mut [f32]],
        sums: &mut [f32],
        ctxs: &[usize],
    ) {
        let ends: [usize; Q] = std::array::from_fn(|q| ctxs[q].min(self.c1));
        let mid = ends.iter().copied().min().unwrap_or(self.c0).max(self.c0);
        let p: [*const f32; Q] =
            std::array::from_fn(|q| self.scores.add((first + q) * self.stride));
        let mut acc = [[_mm512_setzero_ps(); 4]; Q];
        for q in 0..Q {
            for t in 0..4 {
                acc[q][t] = _mm512_loadu_ps(outs[q].as_ptr().add(16 * t));
            }
        }
        let mut s: [f32; Q] = std::array::from_fn(|q| sums[q]);
        for j in self.c0..mid {
            let v = self.vp[j - self.c0];
            let vv = [0, 1, 2, 3].map(|t| V::load16(v.add(16 * t)));
            for q in 0..Q {
                let x = *p[q].add(j);
                let b = _mm512_set1_ps(x);
                for t in 0..4 {
                    acc[q][t] = _mm512_fmadd_ps(b, vv[t], acc[q][t]);
                }
                s[q] += x;
            }
        }
        for q in 0..Q {
            for j in mid..ends[q] {
                let v = self.vp[j - self.c0];
                let x = *p[q].add(j);
                let b = _mm512_set1_ps(x);
                for t in 0..4 {
                    acc[q][t] = _mm512_fmadd_ps(b, V::load16(v.add(16 * t)), acc[q][t]);
                }
                s[q] += x;
            }
            for t in 0..4 {
                _mm512_storeu_ps(outs[q].as_mut_ptr().add(16 * t), acc[q][t]);
            }
            sums[q] = s[q];
        }
    }
}
