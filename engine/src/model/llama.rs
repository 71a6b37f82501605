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

use super::LlamaModel;
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
        let out = self.forward_pass(cx, kv, chunks, before_attention);
        let rows: usize = chunks.iter().map(|ch| ch.tokens.len()).sum();
        if rows >= RETURN_SCRATCH_ROWS {
            return_free_heap();
        }
        out
    }

    fn forward_pass(
        &self,
        cx: &Compute,
        kv: &mut KvPool,
        chunks: &[SeqChunk],
        before_attention: &mut dyn FnMut(usize),
    ) -> Result<ForwardOutput, EngineError> {
        let c = &self.config;
        let (h, hd, nh, nkv) = (c.hidden, c.head_dim, c.heads, c.kv_heads);
        let bt = kv.layout().block_tokens as usize;
        if kv.layout().layers as usize != c.layers
            || kv.layout().kv_heads as usize != nkv
            || kv.layout().head_dim as usize != hd
        {
            return Err(EngineError::InvalidRequest(
                "KV pool layout does not match the model".into(),
            ));
        }
        // Row metadata: (chunk index, position).
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
        let t = rows.len();
        let mut out: ForwardOutput = vec![None; chunks.len()];
        if t == 0 {
            return Ok(out);
        }
        let qn = nh * hd;
        let kvn = nkv * hd;
        let qkv_n = qn + 2 * kvn;
        let mut x = vec![0f32; t * h];
        let mut r = 0;
        for ch in chunks {
            for &tok in ch.tokens {
                self.token_embd
                    .row(tok as usize, &mut x[r * h..(r + 1) * h]);
                r += 1;
            }
        }
        let mut hn = vec![0f32; t * h];
        let mut qkv = vec![0f32; t * qkv_n];
        let mut att = vec![0f32; t * qn];
        let mut tmp = vec![0f32; t * h];
        let mut gu = vec![0f32; t.min(FFN_ROWS) * 2 * c.ffn];
        let mut act = vec![0f32; t.min(FFN_ROWS) * c.ffn];
        let geom = AttnGeometry {
            block_tokens: bt,
            kv_heads: nkv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let group = nh / nkv;
        // Attention tasks: (chunk, first row, end row, first KV head, end KV head), longest
        // contexts first so the pool's dynamic split ends balanced. With plenty of row
        // ranges (decode batches, long prefills) a task walks every KV head of its rows:
        // a token's K (and V) rows of all heads are one contiguous span, so one core
        // streams it in order instead of two cores taking every other head's third of
        // it. With too few tasks for the threads, each takes one query head instead.
        let ranges: usize = chunks
            .iter()
            .map(|ch| ch.tokens.len().div_ceil(ATTN_ROWS))
            .sum();
        let heads_together = if ranges >= 2 * cx.pool.threads() {
            nkv
        } else {
            1
        };
        let mut attn_tasks = Vec::new();
        let mut r0 = 0;
        for (ci, ch) in chunks.iter().enumerate() {
            let n = ch.tokens.len();
            for a in (0..n).step_by(ATTN_ROWS) {
                for kh in (0..nkv).step_by(heads_together) {
                    let (ra, rb) = (r0 + a, r0 + (a + ATTN_ROWS).min(n));
                    attn_tasks.push((ci, ra, rb, kh, (kh + heads_together).min(nkv)));
                }
            }
            r0 += n;
        }
        attn_tasks.sort_by_key(|&(ci, a, _, kh, _)| (std::cmp::Reverse(rows[a].1), ci, kh));
        let split = if attn_tasks.len() < 2 * cx.pool.threads() {
            group
        } else {
            1
        };
        let heads_per_task = group / split;
        // Chunks in the order attention takes them (for the KV prefetch).
        let mut attn_order: Vec<usize> = Vec::with_capacity(chunks.len());
        for &(ci, ..) in &attn_tasks {
            if !attn_order.contains(&ci) {
                attn_order.push(ci);
            }
        }
        for (l, lw) in self.layers.iter().enumerate() {
            for_rows(cx, NORM_ROWS, (&mut x, h), (&mut hn, h), &|_, x, hn| {
                rms_norm(cx.isa, x, &lw.attn_norm, c.rms_eps, hn)
            });
            lw.qkv.matmul(&cx.pool, cx.isa, &hn, t, &mut qkv);
            for (r, &(ci, pos)) in rows.iter().enumerate() {
                let row = &mut qkv[r * qkv_n..(r + 1) * qkv_n];
                let rope = &self.rope[pos * hd / 2..(pos + 1) * hd / 2];
                for head in row[..qn + kvn].chunks_exact_mut(hd) {
                    for (pair, &(cos, sin)) in head.chunks_exact_mut(2).zip(rope) {
                        let (a, b) = (pair[0], pair[1]);
                        pair[0] = a * cos - b * sin;
                        pair[1] = a * sin + b * cos;
                    }
                }
                let block = chunks[ci].blocks[pos / bt];
                kv.write_token(block, l, pos % bt, &row[qn..qn + kvn], &row[qn + kvn..]);
            }
            before_attention(l);
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
            let att_ptr = SendPtr(att.as_mut_ptr());
            let qkv_ref = &qkv;
            cx.pool.run(attn_tasks.len() * split, &|i| {
                let (ci, ra, rb, kh0, kh1) = attn_tasks[i / split];
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
                            qs.push(&qkv_ref[at..at + hd]);
                            // SAFETY: each task writes its own (row, head) slices.
                            outs.push(unsafe {
                                std::slice::from_raw_parts_mut(
                                    att_ptr.0.add(r * qn + head * hd),
                                    hd,
                                )
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
            // The next layer's KV, requested into L2 while this layer's remaining
            // matmuls compute, in parts by their work (attn_out, gate_up, down).
            let next_kv = if l + 1 < c.layers && lw.gate_up.takes_side_lines(cx.isa, t) {
                kv_lines(kv, chunks, &attn_order, l + 1, cx.pool.threads())
            } else {
                SideLines::none()
            }
            .split(&[1, 5, 3]);
            lw.attn_out
                .matmul_prefetching(&cx.pool, cx.isa, &att, t, &mut tmp, &next_kv[0]);
            let tmp_ref = &tmp;
            for_rows(cx, NORM_ROWS, (&mut x, h), (&mut hn, h), &|r0, x, hn| {
                for (a, b) in x.iter_mut().zip(&tmp_ref[r0 * h..]) {
                    *a += *b;
                }
                rms_norm(cx.isa, x, &lw.ffn_norm, c.rms_eps, hn)
            });
            // The FFN runs in row slices to bound the activation memory (rows are independent).
            for r0 in (0..t).step_by(FFN_ROWS) {
                let rows = (t - r0).min(FFN_ROWS);
                let gu = &mut gu[..rows * 2 * c.ffn];
                let act = &mut act[..rows * c.ffn];
                lw.gate_up.matmul_prefetching(
                    &cx.pool,
                    cx.isa,
                    &hn[r0 * h..(r0 + rows) * h],
                    rows,
                    gu,
                    &next_kv[1],
                );
                for_rows(cx, 1, (gu, 2 * c.ffn), (act, c.ffn), &|_, g, a| {
                    swiglu(cx.isa, g, a)
                });
                lw.down.matmul_prefetching(
                    &cx.pool,
                    cx.isa,
                    act,
                    rows,
                    &mut tmp[r0 * h..(r0 + rows) * h],
                    &next_kv[2],
                );
            }
            for (a, b) in x.iter_mut().zip(&tmp) {
                *a += *b;
            }
        }
        // Logits for the last row of each chunk that asked for them.
        let mut want = Vec::new();
        let mut end = 0;
        for (ci, ch) in chunks.iter().enumerate() {
            end += ch.tokens.len();
            if ch.logits && !ch.tokens.is_empty() {
                want.push((ci, end - 1));
            }
        }
        if want.is_empty() {
            return Ok(out);
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
            out[ci] = Some(logits[i * c.vocab..(i + 1) * c.vocab].to_vec());
        }
        Ok(out)
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
    let span = bt * (lay.kv_heads * lay.head_dim) as usize * std::mem::size_of::<f32>();
    let per_chunk = KV_AHEAD_PER_THREAD * threads / order.len().max(1);
    let max_blocks = (per_chunk / (2 * span)).max(1);
    let mut side = SideLines::with_span_bytes(span);
    for &ci in order {
        let ch = &chunks[ci];
        let end = ch.start + ch.tokens.len();
        for &b in ch.blocks.iter().take(end.div_ceil(bt).min(max_blocks)) {
            side.push(kv.half_ptr(b, layer, false) as *const u8);
            side.push(kv.half_ptr(b, layer, true) as *const u8);
        }
    }
    side
}
