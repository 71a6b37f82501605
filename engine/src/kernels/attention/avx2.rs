//! The AVX2 group attention kernel ([`super::avx512`] is its twin): several
//! queries of one sequence and KV head share every K/V row load, scores are
//! reduced 8 keys at a time with the halving tree transposed, and value
//! accumulation runs two queries at once over half rows. Every operation on
//! a query's values is the one `attend_ref` does, in the same order.
//!
//! Stored f16/bf16 rows are widened on load; where a row serves many queries
//! (a prefill group) it is widened once into a staging buffer first
//! ([`stage_row`]): a tile's K rows always, a chunk's V rows when more than
//! one pair of queries reads them.

use std::arch::x86_64::*;
use std::marker::PhantomData;

use super::elem::{stage_row, KvElem};
use super::geometry::{AttnGeometry, BlockKv};
use crate::kernels::{EXP_C, EXP_LO, LN2_HI, LN2_LO, LOG2E};

/// Keys per score tile of the AVX2 group kernel (one 8-lane vector of scores).
pub(super) const TILE: usize = 8;
/// Keys per value pass: their V rows stay in L1/L2 while every query reads them.
pub(super) const KCHUNK: usize = 128;
/// Stage slot of key `k` of a tile, so that `reduce8x8` yields keys in order.
pub(super) const SLOT_OF_KEY: [usize; TILE] = [0, 2, 4, 6, 1, 3, 5, 7];

/// Walks one KV head's rows (of stored elements `E`) in position order
/// without a division per row.
pub(super) struct RowWalk<'a, E> {
    blocks: &'a [BlockKv],
    g: &'a AttnGeometry,
    head_off: usize,
    blk: usize,
    off: usize,
    elem: PhantomData<E>,
}

impl<'a, E: KvElem> RowWalk<'a, E> {
    /// A walk over KV head `kv_head`'s rows from position 0.
    pub(super) fn new(blocks: &'a [BlockKv], g: &'a AttnGeometry, kv_head: usize) -> Self {
        RowWalk {
            blocks,
            g,
            head_off: kv_head * g.head_dim,
            blk: 0,
            off: 0,
            elem: PhantomData,
        }
    }

    /// K and V row pointers of the next position.
    #[inline(always)]
    pub(super) unsafe fn next(&mut self) -> (*const E, *const E) {
        let b = self.blocks[self.blk];
        let o = self.off * self.g.kv_heads * self.g.head_dim + self.head_off;
        self.off += 1;
        if self.off == self.g.block_tokens {
            self.off = 0;
            self.blk += 1;
        }
        ((b.k as *const E).add(o), (b.v as *const E).add(o))
    }
}

/// Requests K rows (into L1) and V rows (into L2) ahead of a score pass, for
/// groups of at most [`PREFETCH_MAX_QUERIES`] queries. A decode step's group
/// reads its KV once per step, from memory, with few FMAs per row: its
/// scores wait on loads. Prefetching [`PREFETCH_KEYS`] keys ahead cut
/// attention's share of a batch-8 decode step from ~19% to ~16.6% (AVX-512,
/// 4 alternated runs), and the value pass finds its V rows in L2. Prefill
/// groups re-read rows that earlier groups brought into cache, where the
/// requests only cost instructions (`attention_timing`: 8 rows, 5.0 -> 5.7 ms).
pub(super) struct RowPrefetch<'a, E> {
    walk: RowWalk<'a, E>,
    next: usize,
    end: usize,
}

/// Keys requested ahead of the one being scored.
const PREFETCH_KEYS: usize = 32;
/// Largest group that prefetches (a decode row's 3 query heads; split tasks).
const PREFETCH_MAX_QUERIES: usize = 4;

impl<'a, E: KvElem> RowPrefetch<'a, E> {
    /// For a group of `queries` queries over keys `0..keys`.
    pub(super) fn new(
        blocks: &'a [BlockKv],
        g: &'a AttnGeometry,
        kv_head: usize,
        queries: usize,
        keys: usize,
    ) -> Self {
        RowPrefetch {
            walk: RowWalk::new(blocks, g, kv_head),
            next: 0,
            end: if queries <= PREFETCH_MAX_QUERIES {
                keys
            } else {
                0
            },
        }
    }

    /// Request the rows of every key below `key + PREFETCH_KEYS` not yet requested.
    #[inline(always)]
    pub(super) unsafe fn ahead_of(&mut self, key: usize) {
        let stop = (key + PREFETCH_KEYS).min(self.end);
        while self.next < stop {
            let (k, v) = self.walk.next();
            for line in (0..self.walk.g.head_dim).step_by(64 / std::mem::size_of::<E>()) {
                _mm_prefetch::<_MM_HINT_T0>(k.add(line) as *const i8);
                _mm_prefetch::<_MM_HINT_T1>(v.add(line) as *const i8);
            }
            self.next += 1;
        }
    }
}

/// The halving-tree sums of 8 keys at once: `st` holds, per stage slot, the 8
/// lanes `l + (l+8)` of one key (tree level 1). Every addition below adds the
/// same two values as `dot_ref`'s tree (l+4, then l+2, then l+1), only for 8
/// keys side by side; lane `k` of the result is the key staged in `SLOT_OF_KEY[k]`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn reduce8x8(st: *const f32) -> __m256 {
    // Level 2: lanes 0..4 of slot s plus lanes 4..8 -> [slot x | slot y] 4 lanes each.
    let mut b = [_mm256_setzero_ps(); 4];
    for (p, bp) in b.iter_mut().enumerate() {
        let x = _mm256_loadu_ps(st.add(16 * p));
        let y = _mm256_loadu_ps(st.add(16 * p + 8));
        *bp = _mm256_add_ps(
            _mm256_permute2f128_ps(x, y, 0x20),
            _mm256_permute2f128_ps(x, y, 0x31),
        );
    }
    let [b01, b23, b45, b67] = b;
    // Level 3: lane l + lane l+2 -> per 128-bit half [x, x, y, y].
    let c0 = _mm256_add_ps(
        _mm256_shuffle_ps(b01, b23, 0b01_00_01_00),
        _mm256_shuffle_ps(b01, b23, 0b11_10_11_10),
    );
    let c1 = _mm256_add_ps(
        _mm256_shuffle_ps(b45, b67, 0b01_00_01_00),
        _mm256_shuffle_ps(b45, b67, 0b11_10_11_10),
    );
    // Level 4: lane 0 + lane 1 -> [s0 s2 s4 s6 | s1 s3 s5 s7].
    _mm256_add_ps(
        _mm256_shuffle_ps(c0, c1, 0b10_00_10_00),
        _mm256_shuffle_ps(c0, c1, 0b11_01_11_01),
    )
}

/// `exp_det` on 8 lanes, same operations.
#[target_feature(enable = "avx2,fma")]
unsafe fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(EXP_LO)),
        _mm256_set1_ps(88.0),
    );
    let n = _mm256_round_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(EXP_C[0]);
    for c in &EXP_C[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
    }
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0));
    let e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
        23,
    );
    _mm256_mul_ps(p, _mm256_castsi256_ps(e))
}

/// `o[t] = fma(p[j], v_j[8t..8t+8], o[t])` for `j` in `range`, in order, over
/// `W` 8-lane columns of the value rows at `vp[j - base]`; with `sum`, also
/// `sum += p[j]` in the same order.
#[inline(always)]
unsafe fn pv_run<E: KvElem, const W: usize>(
    o: &mut [__m256; W],
    p: *const f32,
    vp: &[*const E],
    base: usize,
    range: std::ops::Range<usize>,
    col: usize,
    sum: Option<&mut f32>,
) {
    let mut s = sum.as_ref().map_or(0.0, |s| **s);
    let with_sum = sum.is_some();
    for j in range {
        let pj = *p.add(j);
        let pb = _mm256_set1_ps(pj);
        let v = vp[j - base].add(col);
        for (t, ov) in o.iter_mut().enumerate() {
            *ov = _mm256_fmadd_ps(pb, E::load8(v.add(8 * t)), *ov);
        }
        if with_sum {
            s += pj;
        }
    }
    if let Some(sum) = sum {
        *sum = s;
    }
}

/// Group attention for `head_dim == 64` on AVX2 (see [`attend_group`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn attend_group_avx2<E: KvElem>(
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
    let stride = maxc.div_ceil(TILE) * TILE;
    // Scores, then (for stored halves) a staging area of one value chunk.
    let stage_len = if E::DTYPE == kvfabric_types::DType::F32 {
        0
    } else {
        KCHUNK * HD
    };
    if scratch.len() < n * stride + stage_len {
        scratch.resize(n * stride + stage_len, 0.0);
    }
    let sc = scratch.as_mut_ptr();
    let s = Scores { sc, stride };
    scores_avx2::<E>(queries, ctxs, blocks, g, kv_head, &s, maxc);
    softmax_avx2(ctxs, &s);

    // Values: per chunk of keys, queries in pairs over half rows (8 accumulators),
    // each query's FMA chain running over its keys in order; sums during column 0.
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
        let ch = (c0, c1);
        if E::DTYPE == kvfabric_types::DType::F32 || n <= 2 {
            value_chunk_avx2(outs, ctxs, &vp, ch, &s, &mut sums);
        } else {
            for (i, (f, p)) in vf.iter_mut().zip(&vp).take(c1 - c0).enumerate() {
                *f = stage_row(*p, stage, i, HD);
            }
            value_chunk_avx2(outs, ctxs, &vf, ch, &s, &mut sums);
        }
    }
    for (o, s) in outs.iter_mut().zip(&sums) {
        let inv = _mm256_set1_ps(1.0 / s);
        for t in 0..HD / 8 {
            let p = o.as_mut_ptr().add(8 * t);
            _mm256_storeu_ps(p, _mm256_mul_ps(_mm256_loadu_ps(p), inv));
        }
    }
}

const HD: usize = 64;

/// Each query's scores (then softmax numerators): query `i`'s at `sc + i * stride`.
pub(super) struct Scores {
    pub(super) sc: *mut f32,
    pub(super) stride: usize,
}

/// Scores, a tile of 8 keys at a time: the tile's K rows (widened once, for
/// stored halves) stay in L1 while every query still causal there dots them
/// with its q held in registers.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_avx2<E: KvElem>(
    queries: &[&[f32]],
    ctxs: &[usize],
    blocks: &[BlockKv],
    g: &AttnGeometry,
    kv_head: usize,
    s: &Scores,
    maxc: usize,
) {
    let scale = _mm256_set1_ps(g.scale);
    let mut stage = [_mm256_setzero_ps(); TILE];
    let st = stage.as_mut_ptr() as *mut f32;
    let mut kst = [0f32; TILE * HD];
    let mut kp = [std::ptr::null::<f32>(); TILE];
    let mut w = RowWalk::<E>::new(blocks, g, kv_head);
    let mut prefetch = RowPrefetch::<E>::new(blocks, g, kv_head, queries.len(), maxc);
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
            let mut qr = [_mm256_setzero_ps(); 8];
            for (c, qv) in qr.iter_mut().enumerate() {
                *qv = _mm256_loadu_ps(q.as_ptr().add(8 * c));
            }
            // Slots of keys past `nk` keep stale values: they only reach their own lanes.
            for (&k, &slot) in kp.iter().zip(&SLOT_OF_KEY).take(nk) {
                let z = _mm256_setzero_ps();
                let mut lo = _mm256_fmadd_ps(qr[0], _mm256_loadu_ps(k), z);
                let mut hi = _mm256_fmadd_ps(qr[1], _mm256_loadu_ps(k.add(8)), z);
                for c in 1..4 {
                    lo = _mm256_fmadd_ps(qr[2 * c], _mm256_loadu_ps(k.add(16 * c)), lo);
                    hi = _mm256_fmadd_ps(qr[2 * c + 1], _mm256_loadu_ps(k.add(16 * c + 8)), hi);
                }
                _mm256_storeu_ps(st.add(slot * TILE), _mm256_add_ps(lo, hi));
            }
            let sv = _mm256_mul_ps(reduce8x8(st), scale);
            _mm256_storeu_ps(s.sc.add(i * s.stride + j0), sv);
        }
    }
}

/// Softmax numerators per query: max over its own keys, then exp.
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_avx2(ctxs: &[usize], s: &Scores) {
    for (i, &ctx) in ctxs.iter().enumerate() {
        let sp = s.sc.add(i * s.stride);
        let full = ctx / TILE * TILE;
        let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
        for j in (0..full).step_by(TILE) {
            // A NaN score is skipped, as `f32::max` does.
            mv = _mm256_max_ps(_mm256_loadu_ps(sp.add(j)), mv);
        }
        let mut lanes = [0f32; TILE];
        _mm256_storeu_ps(lanes.as_mut_ptr(), mv);
        let mut max = lanes.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        for j in full..ctx {
            max = max.max(*sp.add(j));
        }
        let mx = _mm256_set1_ps(max);
        for j in (0..ctx).step_by(TILE) {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sp.add(j)), mx));
            _mm256_storeu_ps(sp.add(j), e);
        }
    }
}

/// The value rows `vp[j - c0]` of keys `c0..c1` into every query's output
/// accumulators and numerator sums: queries in pairs over half rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn value_chunk_avx2<V: KvElem>(
    outs: &mut [&mut [f32]],
    ctxs: &[usize],
    vp: &[*const V; KCHUNK],
    (c0, c1): (usize, usize),
    s: &Scores,
    sums: &mut [f32],
) {
    let (n, sc, stride) = (outs.len(), s.sc, s.stride);
    let mut i = 0;
    while i + 1 < n {
        let (ea, eb) = (ctxs[i].min(c1), ctxs[i + 1].min(c1));
        let mid = ea.min(eb).max(c0);
        let (pa, pb) = (
            sc.add(i * stride) as *const f32,
            sc.add((i + 1) * stride) as *const f32,
        );
        for col in [0, 32] {
            let oa = outs[i].as_mut_ptr().add(col);
            let ob = outs[i + 1].as_mut_ptr().add(col);
            let mut a = [_mm256_setzero_ps(); 4];
            let mut b = [_mm256_setzero_ps(); 4];
            for t in 0..4 {
                a[t] = _mm256_loadu_ps(oa.add(8 * t));
                b[t] = _mm256_loadu_ps(ob.add(8 * t));
            }
            let (mut sa, mut sb) = (sums[i], sums[i + 1]);
            for j in c0..mid {
                let v = vp[j - c0].add(col);
                let (xa, xb) = (*pa.add(j), *pb.add(j));
                let (ba, bb) = (_mm256_set1_ps(xa), _mm256_set1_ps(xb));
                for t in 0..4 {
                    let x = V::load8(v.add(8 * t));
                    a[t] = _mm256_fmadd_ps(ba, x, a[t]);
                    b[t] = _mm256_fmadd_ps(bb, x, b[t]);
                }
                sa += xa;
                sb += xb;
            }
            let first = col == 0;
            if ea > mid {
                pv_run(&mut a, pa, vp, c0, mid..ea, col, first.then_some(&mut sa));
            }
            if eb > mid {
                pv_run(&mut b, pb, vp, c0, mid..eb, col, first.then_some(&mut sb));
            }
            if first {
                sums[i] = sa;
                sums[i + 1] = sb;
            }
            for t in 0..4 {
                _mm256_storeu_ps(oa.add(8 * t), a[t]);
                _mm256_storeu_ps(ob.add(8 * t), b[t]);
            }
        }
        i += 2;
    }
    if i < n && ctxs[i] > c0 {
        let e = ctxs[i].min(c1);
        let o = outs[i].as_mut_ptr();
        let mut a = [_mm256_setzero_ps(); 8];
        for (t, av) in a.iter_mut().enumerate() {
            *av = _mm256_loadu_ps(o.add(8 * t));
        }
        let mut s = sums[i];
        pv_run(&mut a, sc.add(i * stride), vp, c0, c0..e, 0, Some(&mut s));
        sums[i] = s;
        for (t, av) in a.iter().enumerate() {
            _mm256_storeu_ps(o.add(8 * t), *av);
        }
    }
}
