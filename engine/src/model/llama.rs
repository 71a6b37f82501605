//! The Llama forward pass over a flattened variable-length batch.
//!
//! All scheduled tokens of all sequences form one `[T][hidden]` activation
//! matrix (no padding); each token knows its sequence, position and its
//! sequence's block table. Per layer: RMSNorm, fused q|k|v matmul, rotary
//! embedding (GGUF llama layout: adjacent pairs), K/V written into the paged
//! pool, causal GQA attention walking the block table, output projection,
//! RMSNorm, fused gate|up, SwiGLU, down projection. Every step treats rows
//! independently with batch-invariant kernels, so a token's hidden states,
//! KV and logits do not depend on what else is in the batch.

use std::cell::RefCell;

use super::{LayerWeights, LlamaModel};
use crate::kernels::attention::{attend_group, AttnGeometry, BlockKv};
use crate::kernels::{rms_norm, swiglu, Compute, SideLines, NORM_ROWS};
use crate::kv::pool::{BlockId, KvPool};
use crate::EngineError;

/// The part of one sequence computed in a forward pass.
#[derive(Clone, Copy, Debug)]
pub struct SeqChunk<'a> {
    /// Tokens to compute, at positions `start..start + tokens.len()`.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; KV of positions `0..start` is already in the pool.
    pub start: usize,
    /// The sequence's block table, covering at least `start + tokens.len()` positions.
    pub blocks: &'a [BlockId],
    /// Return the logits of the last token of this chunk.
    pub logits: bool,
}

/// Logits per chunk (`Some` where asked for).
pub type ForwardOutput = Vec<Option<Vec<f32>>>;

/// Logits of the last rows of each chunk, oldest row first (speculative
/// verification reads one row per drafted token).
pub type RowLogits = Vec<Vec<Vec<f32>>>;

/// Rows per FFN slice.
const FFN_ROWS: usize = 256;

/// Consecutive rows of one sequence whose attention runs as one group (with
/// the query heads sharing a KV head), so each K/V row is read once for all.
/// `attention_timing` (64 rows over 2048 tokens, one thread): 8 rows 5.4 ms,
/// 16 rows 4.9, 32 rows 4.6. A group's scores are 96 x context floats
/// (768 KiB at 2048 tokens, in a per-thread scratch).
const ATTN_ROWS: usize = 32;

struct SendPtr(*mut f32);
// SAFETY: tasks write disjoint rows/heads through it.
unsafe impl Sync for SendPtr {}

/// The body of [`for_rows`]: first row index, then those rows of each buffer.
type RowFn<'a> = dyn Fn(usize, &mut [f32], &mut [f32]) + Sync + 'a;

/// `f(r0, a_rows, b_rows)` for groups of `per_task` rows of `a` (rows of `wa`
/// floats) and `b` (rows of `wb`), groups spread over the pool. Row-wise
/// steps (norms, SwiGLU) of a batch-8 decode step took ~8% of it on the
/// calling thread alone, one row per call. Norms take [`NORM_ROWS`] rows per
/// task ([`rms_norm`] interleaves them), so a decode batch of up to 8 rows is
/// one task, run on the calling thread.
fn for_rows(
    cx: &Compute,
    per_task: usize,
    (a, wa): (&mut [f32], usize),
    (b, wb): (&mut [f32], usize),
    f: &RowFn<'_>,
) {
    let rows = a.len() / wa;
    assert!(
        a.len() == rows * wa && b.len() == rows * wb && per_task > 0,
        "for_rows shapes"
    );
    let (pa, pb) = (SendPtr(a.as_mut_ptr()), SendPtr(b.as_mut_ptr()));
    cx.pool.run(rows.div_ceil(per_task), &|task| {
        let (pa, pb) = (&pa, &pb);
        let r0 = task * per_task;
        let n = per_task.min(rows - r0);
        // SAFETY: rows r0..r0+n of each buffer are in bounds (checked above)
        // and only this task touches them.
        let (ra, rb) = unsafe {
            (
                std::slice::from_raw_parts_mut(pa.0.add(r0 * wa), n * wa),
                std::slice::from_raw_parts_mut(pb.0.add(r0 * wb), n * wb),
            )
        };
        f(r0, ra, rb)
    });
}

/// Forward passes of at least this many rows (prefill chunks) hand their
/// freed activation buffers back to the OS afterwards: glibc keeps freed heap
/// memory for reuse, and after a 2048-token prefill (~27 MB of buffers)
/// `bench engine` measured 1.6 MB more resident without this. Decode steps
/// (a few rows) skip it.
const RETURN_SCRATCH_ROWS: usize = 256;

/// Give free heap pages back to the OS (glibc `malloc_trim`; a no-op elsewhere).
fn return_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: malloc_trim only releases memory malloc holds as free.
        unsafe { malloc_trim(0) };
    }
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl LlamaModel {
    /// Run one forward pass; writes the chunks' K/V into `kv`.
    pub fn forward(
        &self,
        cx: &Compute,
        kv: &mut KvPool,
        chunks: &[SeqChunk],
    ) -> Result<ForwardOutput, EngineError> {
        self.forward_gated(cx, kv, chunks, &mut |_| {})
    }

    /// [`Self::forward`], calling `before_attention(l)` once per layer after
    /// the batch's K/V of layer `l` are written and before attention reads
    /// the pool at layer `l`: the scheduler waits there for blocks that are
    /// still arriving layer by layer, so computing overlaps their transfer.
    pub fn forward_gated(
        &self,
        cx: &Compute,
        kv: &mut KvPool,
        chunks: &[SeqChunk],
        before_attention: &mut dyn FnMut(usize),
    ) -> Result<ForwardOutput, EngineError> {
        let tails: Vec<usize> = chunks.iter().map(|ch| usize::from(ch.logits)).collect();
        let out = self.forward_rows(cx, kv, chunks, &tails, before_attention)?;
        Ok(out.into_iter().map(|mut rows| rows.pop()).collect())
    }

    /// [`Self::forward_gated`] returning the logits of the last `tails[i]`
    /// rows of chunk `i` (its `logits` flag is ignored). Rows are
    /// independent, so each row's logits are those of computing it alone.
    pub fn forward_rows(
        &self,
        cx: &Compute,
        kv: &mut KvPool,
        chunks: &[SeqChunk],
        tails: &[usize],
        before_attention: &mut dyn FnMut(usize),
    ) -> Result<RowLogits, EngineError> {
        let out = self.forward_pass(cx, kv, chunks, tails, before_attention);
        let rows: usize = chunks.iter().map(|ch| ch.tokens.len()).sum();
        if rows >= RETURN_SCRATCH_ROWS {
            return_free_heap();
        }
        out
    }

    /// Check the batch, then per layer: [`Self::qkv_projection`],
    /// [`Self::rope`], [`Self::store_kv`], the gate, [`Self::attention`],
    /// [`Self::attn_output`], [`Self::mlp`]; then [`Self::logits`].
    fn forward_pass(
        &self,
        cx: &Compute,
        kv: &mut KvPool,
        chunks: &[SeqChunk],
        tails: &[usize],
        before_attention: &mut dyn FnMut(usize),
    ) -> Result<RowLogits, EngineError> {
        let rows = self.batch_rows(kv, chunks)?;
        let mut out: RowLogits = vec![Vec::new(); chunks.len()];
        if rows.is_empty() {
            return Ok(out);
        }
        let c = &self.config;
        let plan = AttnPlan::new(cx, chunks, &rows, c.heads / c.kv_heads, c.kv_heads);
        let mut a = self.embed(chunks, rows.len());
        for (l, lw) in self.layers.iter().enumerate() {
            self.qkv_projection(cx, lw, &mut a);
            self.rope(&rows, &mut a.qkv);
            self.store_kv(cx, kv, l, chunks, &rows, &a.qkv);
            before_attention(l);
            self.attention(cx, kv, l, chunks, &rows, &plan, &a.qkv, &mut a.att);
            // The next layer's KV, requested into L2 while this layer's remaining
            // matmuls compute, in parts by their work (attn_out, gate_up, down).
            let t = rows.len();
            let next_kv = if l + 1 < c.layers && lw.gate_up.takes_side_lines(cx.isa, t) {
                kv_lines(kv, chunks, &plan.order, l + 1, cx.pool.threads())
            } else {
                SideLines::none()
            }
            .split(&[1, 5, 3]);
            self.attn_output(cx, lw, &mut a, &next_kv[0]);
            self.mlp(cx, lw, &mut a, &next_kv[1], &next_kv[2]);
        }
        self.logits(cx, chunks, tails, &a.x, &mut out);
        Ok(out)
    }

    /// Check that `kv` and `chunks` fit the model; (chunk index, position) of every row.
    fn batch_rows(
        &self,
        kv: &KvPool,
        chunks: &[SeqChunk],
    ) -> Result<Vec<(usize, usize)>, EngineError> {
        let c = &self.config;
        let bt = kv.layout().block_tokens as usize;
        if kv.layout().layers as usize != c.layers
            || kv.layout().kv_heads as usize != c.kv_heads
            || kv.layout().head_dim as usize != c.head_dim
        {
            return Err(EngineError::InvalidRequest(
                "KV pool layout does not match the model".into(),
            ));
        }
        let mut rows = Vec::new();
        for (ci, ch) in chunks.iter().enumerate() {
            let end = ch.start + ch.tokens.len();
            if end > c.context_length {
                return Err(EngineError::InvalidRequest(format!(
                    "sequence of {end} tokens exceeds the context length {}",
                    c.context_length
                )));
            }
            if ch.blocks.len() * bt < end || ch.blocks.iter().any(|&b| b as usize >= kv.blocks()) {
                return Err(EngineError::InvalidRequest(
                    "block table does not cover the chunk".into(),
                ));
            }
            for (i, &tok) in ch.tokens.iter().enumerate() {
                if tok as usize >= c.vocab {
                    return Err(EngineError::InvalidRequest(format!(
                        "token id {tok} out of vocabulary"
                    )));
                }
                rows.push((ci, ch.start + i));
            }
        }
        Ok(rows)
    }

    /// The pass's buffers for `t` rows, the residual stream holding the
    /// chunks' token embeddings.
    fn embed(&self, chunks: &[SeqChunk], t: usize) -> Activations {
        let c = &self.config;
        let h = c.hidden;
        let (qn, kvn) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let mut x = vec![0f32; t * h];
        let mut r = 0;
        for ch in chunks {
            for &tok in ch.tokens {
                self.token_embd
                    .row(tok as usize, &mut x[r * h..(r + 1) * h]);
                r += 1;
            }
        }
        Activations {
            t,
            x,
            hn: vec![0f32; t * h],
            qkv: vec![0f32; t * (qn + 2 * kvn)],
            att: vec![0f32; t * qn],
            tmp: vec![0f32; t * h],
            gu: vec![0f32; t.min(FFN_ROWS) * 2 * c.ffn],
            act: vec![0f32; t.min(FFN_ROWS) * c.ffn],
        }
    }

    /// Attention RMSNorm of the residual stream, then the fused q|k|v matmul.
    fn qkv_projection(&self, cx: &Compute, lw: &LayerWeights, a: &mut Activations) {
        let (h, eps) = (self.config.hidden, self.config.rms_eps);
        for_rows(cx, NORM_ROWS, (&mut a.x, h), (&mut a.hn, h), &|_, x, hn| {
            rms_norm(cx.isa, x, &lw.attn_norm, eps, hn)
        });
        lw.qkv.matmul(&cx.pool, cx.isa, &a.hn, a.t, &mut a.qkv);
    }

    /// Rotary embedding of every row's q and k heads at its position (GGUF
    /// llama layout: adjacent pairs).
    fn rope(&self, rows: &[(usize, usize)], qkv: &mut [f32]) {
        let c = &self.config;
        let hd = c.head_dim;
        let qk = (c.heads + c.kv_heads) * hd;
        let qkv_n = qk + c.kv_heads * hd;
        for (row, &(_, pos)) in qkv.chunks_exact_mut(qkv_n).zip(rows) {
            let rope = &self.rope[pos * hd / 2..(pos + 1) * hd / 2];
            for head in row[..qk].chunks_exact_mut(hd) {
                for (pair, &(cos, sin)) in head.chunks_exact_mut(2).zip(rope) {
                    let (a, b) = (pair[0], pair[1]);
                    pair[0] = a * cos - b * sin;
                    pair[1] = a * sin + b * cos;
                }
            }
        }
    }

    /// Write every row's K and V of layer `l` into its sequence's block
    /// (rounded once to the pool's dtype).
    fn store_kv(
        &self,
        cx: &Compute,
        kv: &mut KvPool,
        l: usize,
        chunks: &[SeqChunk],
        rows: &[(usize, usize)],
        qkv: &[f32],
    ) {
        let c = &self.config;
        let (qn, kvn) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let bt = kv.layout().block_tokens as usize;
        for (row, &(ci, pos)) in qkv.chunks_exact(qn + 2 * kvn).zip(rows) {
            let block = chunks[ci].blocks[pos / bt];
            kv.write_token(
                cx.isa,
                block,
                l,
                pos % bt,
                &row[qn..qn + kvn],
                &row[qn + kvn..],
            );
        }
    }

    /// Causal GQA attention of every row over its sequence's blocks at
    /// layer `l`, into `att` (`[t][heads * head_dim]`).
    #[allow(clippy::too_many_arguments)]
    fn attention(
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

    /// Output projection of the attention, added to the residual stream,
    /// then the FFN RMSNorm (into `hn`).
    fn attn_output(&self, cx: &Compute, lw: &LayerWeights, a: &mut Activations, ahead: &SideLines) {
        let (h, eps) = (self.config.hidden, self.config.rms_eps);
        lw.attn_out
            .matmul_prefetching(&cx.pool, cx.isa, &a.att, a.t, &mut a.tmp, ahead);
        let tmp = &a.tmp;
        for_rows(
            cx,
            NORM_ROWS,
            (&mut a.x, h),
            (&mut a.hn, h),
            &|r0, x, hn| {
                for (a, b) in x.iter_mut().zip(&tmp[r0 * h..]) {
                    *a += *b;
                }
                rms_norm(cx.isa, x, &lw.ffn_norm, eps, hn)
            },
        );
    }

    /// The FFN (fused gate|up, SwiGLU, down) of the normed rows, added to
    /// the residual stream. It runs in row slices to bound the activation
    /// memory (rows are independent).
    fn mlp(
        &self,
        cx: &Compute,
        lw: &LayerWeights,
        a: &mut Activations,
        gate_up_ahead: &SideLines,
        down_ahead: &SideLines,
    ) {
        let (h, ffn, t) = (self.config.hidden, self.config.ffn, a.t);
        for r0 in (0..t).step_by(FFN_ROWS) {
            let rows = (t - r0).min(FFN_ROWS);
            let gu = &mut a.gu[..rows * 2 * ffn];
            let act = &mut a.act[..rows * ffn];
            lw.gate_up.matmul_prefetching(
                &cx.pool,
                cx.isa,
                &a.hn[r0 * h..(r0 + rows) * h],
                rows,
                gu,
                gate_up_ahead,
            );
            for_rows(cx, 1, (gu, 2 * ffn), (act, ffn), &|_, g, a| {
                swiglu(cx.isa, g, a)
            });
            lw.down.matmul_prefetching(
                &cx.pool,
                cx.isa,
                act,
                rows,
                &mut a.tmp[r0 * h..(r0 + rows) * h],
                down_ahead,
            );
        }
        for (a, b) in a.x.iter_mut().zip(&a.tmp) {
            *a += *b;
        }
    }

    /// Logits of the last `tails[i]` rows of each chunk `i`, into `out`.
    fn logits(
        &self,
        cx: &Compute,
        chunks: &[SeqChunk],
        tails: &[usize],
        x: &[f32],
        out: &mut RowLogits,
    ) {
        let c = &self.config;
        let h = c.hidden;
        let mut want = Vec::new();
        let mut end = 0;
        for (ci, ch) in chunks.iter().enumerate() {
            end += ch.tokens.len();
            let tail = tails.get(ci).copied().unwrap_or(0).min(ch.tokens.len());
            want.extend((end - tail..end).map(|r| (ci, r)));
        }
        if want.is_empty() {
            return;
        }
        let m = want.len();
        let mut normed = vec![0f32; m * h];
        for (i, &(_, r)) in want.iter().enumerate() {
            rms_norm(
                cx.isa,
                &x[r * h..(r + 1) * h],
                &self.output_norm,
                c.rms_eps,
                &mut normed[i * h..(i + 1) * h],
            );
        }
        let mut logits = vec![0f32; m * c.vocab];
        self.output.as_ref().unwrap_or(&self.token_embd).matmul(
            &cx.pool,
            cx.isa,
            &normed,
            m,
            &mut logits,
        );
        for (i, &(ci, _)) in want.iter().enumerate() {
            out[ci].push(logits[i * c.vocab..(i + 1) * c.vocab].to_vec());
        }
    }
}

/// The buffers of one forward pass over `t` rows.
struct Activations {
    t: usize,
    /// The residual stream, `[t][hidden]`.
    x: Vec<f32>,
    /// Normed rows (the input of the q|k|v and gate|up matmuls).
    hn: Vec<f32>,
    /// `[t][q | k | v]`.
    qkv: Vec<f32>,
    /// Attention output, `[t][heads * head_dim]`.
    att: Vec<f32>,
    /// The output of the attention and down projections, `[t][hidden]`.
    tmp: Vec<f32>,
    /// gate|up and SwiGLU output of one FFN slice of at most [`FFN_ROWS`] rows.
    gu: Vec<f32>,
    act: Vec<f32>,
}

/// How a batch's attention splits into pool tasks (the same for every layer).
struct AttnPlan {
    /// (chunk, first row, end row, first KV head, end KV head), longest
    /// contexts first so the pool's dynamic split ends balanced.
    tasks: Vec<(usize, usize, usize, usize, usize)>,
    /// Each task runs as `split` pool jobs of `heads_per_task` query heads per KV head.
    split: usize,
    heads_per_task: usize,
    /// Chunks in the order attention takes them (for the KV prefetch).
    order: Vec<usize>,
}

impl AttnPlan {
    /// With plenty of row ranges (decode batches, long prefills) a task
    /// walks every KV head of its rows: a token's K (and V) rows of all
    /// heads are one contiguous span, so one core streams it in order
    /// instead of two cores taking every other head's third of it. With too
    /// few tasks for the threads, each takes one query head instead.
    fn new(
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
fn kv_lines(
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
