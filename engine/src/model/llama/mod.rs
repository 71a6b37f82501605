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
//!
//! Here: the batch check, the embedding, the per-layer loop and the logits.
//! The phases of a layer are in [`layer`] (projections, rope, KV store, FFN)
//! and [`attention`] (the task plan, the KV prefetch and the attention
//! itself); `pass` holds what a pass reads and writes (the chunks, the
//! activations, the logits); [`rows`] spreads row-wise steps over the compute pool.

mod attention;
mod layer;
mod pass;
mod rows;

use super::weights::LlamaModel;
use crate::kernels::{rms_norm, Compute, SideLines};
use crate::kv::pool::KvPool;
use crate::EngineError;

use attention::{kv_lines, AttnPlan};
use pass::Activations;
pub use pass::{ForwardOutput, RowLogits, SeqChunk};
use rows::{return_free_heap, FFN_ROWS, RETURN_SCRATCH_ROWS};

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
