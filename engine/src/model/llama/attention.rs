//! Causal GQA attention over the paged KV pool: how a batch splits into
//! pool tasks ([`AttnPlan`], the same for every layer), the attention of
//! every row over its sequence's blocks, and the next layer's KV requested
//! into L2 while the matmuls before it run ([`kv_lines`]).

use std::cell::RefCell;

use super::pass::SeqChunk;
use super::rows::SendPtr;
use crate::kernels::attention::{attend_group, AttnGeometry, BlockKv};
use crate::kernels::{Compute, SideLines};
use crate::kv::pool::KvPool;
use crate::model::weights::LlamaModel;

/// Consecutive rows of one sequence whose attention runs as one group (with
/// the query heads sharing a KV head), so each K/V row is read once for all.
/// `attention_timing` (64 rows over 2048 tokens, one thread): 8 rows 5.4 ms,
/// 16 rows 4.9, 32 rows 4.6. A group's scores are 96 x context floats
/// (768 KiB at 2048 tokens, in a per-thread scratch).
const ATTN_ROWS: usize = 32;

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl LlamaModel {
    /// Causal GQA attention of every row over its sequence's blocks at
    /// layer `l`, into `att` (`[t][heads * head_dim]`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(
        &self,
        cx: &Compute,
        kv: &KvPool,
        l: usize,
        chunks: &[SeqChunk],
        rows: &[(usize, usize)],
        plan: &AttnPlan,
        qkv: &[f32],
        att: &mut [f32],
    ) {
        let c = &self.config;
        let (hd, nkv) = (c.head_dim, c.kv_heads);
        let (qn, group) = (c.heads * hd, c.heads / nkv);
        let qkv_n = qn + 2 * nkv * hd;
        let geom = AttnGeometry {
            block_tokens: kv.layout().block_tokens as usize,
            kv_heads: nkv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            dtype: kv.layout().dtype,
        };
        let tables: Vec<Vec<BlockKv>> = chunks
            .iter()
            .map(|ch| {
                ch.blocks
                    .iter()
                    .map(|&b| BlockKv {
                        k: kv.half_ptr(b, l, false),
                        v: kv.half_ptr(b, l, true),
                    })
                    .collect()
            })
            .collect();
        let (split, heads_per_task) = (plan.split, plan.heads_per_task);
        let att_ptr = SendPtr(att.as_mut_ptr());
        cx.pool.run(plan.tasks.len() * split, &|i| {
            let (ci, ra, rb, kh0, kh1) = plan.tasks[i / split];
            let att_ptr = &att_ptr;
            for kh in kh0..kh1 {
                let h0 = kh * group + (i % split) * heads_per_task;
                let n = (rb - ra) * heads_per_task;
                let (mut qs, mut outs, mut ctxs) = (
                    Vec::with_capacity(n),
                    Vec::with_capacity(n),
                    Vec::with_capacity(n),
                );
                for (r, &(_, pos)) in rows.iter().enumerate().take(rb).skip(ra) {
                    for head in h0..h0 + heads_per_task {
                        let at = r * qkv_n + head * hd;
                        qs.push(&qkv[at..at + hd]);
                        // SAFETY: each task writes its own (row, head) slices.
                        outs.push(unsafe {
                            std::slice::from_raw_parts_mut(att_ptr.0.add(r * qn + head * hd), hd)
                        });
                        ctxs.push(pos + 1);
                    }
                }
                // SAFETY: the tables point into the pool, which is not written while
                // attention runs, and cover every row's positions.
                SCORES.with(|s| unsafe {
                    attend_group(
                        cx.isa,
                        &qs,
                        &mut outs,
                        &ctxs,
                        &tables[ci],
                        &geom,
                        kh,
                        &mut s.borrow_mut(),
                    )
                });
            }
        });
    }
}

/// How a batch's attention splits into pool tasks (the same for every layer).
pub(super) struct AttnPlan {
    /// (chunk, first row, end row, first KV head, end KV head), longest
    /// contexts first so the pool's dynamic split ends balanced.
    tasks: Vec<(usize, usize, usize, usize, usize)>,
    /// Each task runs as `split` pool jobs of `heads_per_task` query heads per KV head.
    split: usize,
    heads_per_task: usize,
    /// Chunks in the order attention takes them (for the KV prefetch).
    pub(super) order: Vec<usize>,
}

impl AttnPlan {
    /// With plenty of row ranges (decode batches, long prefills) a task
    /// walks every KV head of its rows: a token's K (and V) rows of all
    /// heads are one contiguous span, so one core streams it in order
    /// instead of two cores taking every other head's third of it. With too
    /// few tasks for the threads, each takes one query head instead.
    pub(super) fn new(
        cx: &Compute,
        chunks: &[SeqChunk],
        rows: &[(usize, usize)],
        group: usize,
        nkv: usize,
    ) -> AttnPlan {
        let ranges: usize = chunks
            .iter()
            .map(|ch| ch.tokens.len().div_ceil(ATTN_ROWS))
            .sum();
        let heads_together = if ranges >= 2 * cx.pool.threads() {
            nkv
        } else {
            1
        };
        let mut tasks = Vec::new();
        let mut r0 = 0;
        for (ci, ch) in chunks.iter().enumerate() {
            let n = ch.tokens.len();
            for a in (0..n).step_by(ATTN_ROWS) {
                for kh in (0..nkv).step_by(heads_together) {
                    let (ra, rb) = (r0 + a, r0 + (a + ATTN_ROWS).min(n));
                    tasks.push((ci, ra, rb, kh, (kh + heads_together).min(nkv)));
                }
            }
            r0 += n;
        }
        tasks.sort_by_key(|&(ci, a, _, kh, _)| (std::cmp::Reverse(rows[a].1), ci, kh));
        let split = if tasks.len() < 2 * cx.pool.threads() {
            group
        } else {
            1
        };
        let mut order: Vec<usize> = Vec::with_capacity(chunks.len());
        for &(ci, ..) in &tasks {
            if !order.contains(&ci) {
                order.push(ci);
            }
        }
        AttnPlan {
            tasks,
            split,
            heads_per_task: group / split,
            order,
        }
    }
}

/// KV bytes per kernel thread requested ahead of a layer's attention: what
/// stays in a core's L2 (1-4 MiB on current x86) until attention reads it.
const KV_AHEAD_PER_THREAD: usize = 1 << 20;

/// The K and V of `layer` that attention will read for `chunks`, taken in
/// `order`: one span per block half, for the blocks covering each chunk's
/// positions (at most `KV_AHEAD_PER_THREAD * threads` bytes in all, the
/// first blocks of each chunk: attention reads those first). Attention over
/// f32 KV is memory-bound and the matmuls before it compute-bound, so
/// requesting these during the matmuls overlaps the two (see
/// [`crate::kernels::prefetch`]).
pub(super) fn kv_lines(
    kv: &KvPool,
    chunks: &[SeqChunk],
    order: &[usize],
    layer: usize,
    threads: usize,
) -> SideLines {
    let lay = kv.layout();
    let bt = lay.block_tokens as usize;
    let span = bt * (lay.kv_heads * lay.head_dim) as usize * lay.dtype.size();
    let per_chunk = KV_AHEAD_PER_THREAD * threads / order.len().max(1);
    let max_blocks = (per_chunk / (2 * span)).max(1);
    let mut side = SideLines::with_span_bytes(span);
    for &ci in order {
        let ch = &chunks[ci];
        let end = ch.start + ch.tokens.len();
        for &b in ch.blocks.iter().take(end.div_ceil(bt).min(max_blocks)) {
            side.push(kv.half_ptr(b, layer, false));
            side.push(kv.half_ptr(b, layer, true));
        }
    }
    side
}
