//! The phases of one layer around attention: the attention RMSNorm and
//! fused q|k|v matmul, rotary embedding, the K/V store into the paged pool,
//! the output projection and the FFN (gate|up, SwiGLU, down).

use super::pass::{Activations, SeqChunk};
use super::rows::{for_rows, FFN_ROWS};
use crate::kernels::{rms_norm, swiglu, Compute, SideLines, NORM_ROWS};
use crate::kv::pool::KvPool;
use crate::model::weights::{LayerWeights, LlamaModel};

impl LlamaModel {
    /// Attention RMSNorm of the residual stream, then the fused q|k|v matmul.
    pub(super) fn qkv_projection(&self, cx: &Compute, lw: &LayerWeights, a: &mut Activations) {
        let (h, eps) = (self.config.hidden, self.config.rms_eps);
        for_rows(cx, NORM_ROWS, (&mut a.x, h), (&mut a.hn, h), &|_, x, hn| {
            rms_norm(cx.isa, x, &lw.attn_norm, eps, hn)
        });
        lw.qkv.matmul(&cx.pool, cx.isa, &a.hn, a.t, &mut a.qkv);
    }

    /// Rotary embedding of every row's q and k heads at its position (GGUF
    /// llama layout: adjacent pairs).
    pub(super) fn rope(&self, rows: &[(usize, usize)], qkv: &mut [f32]) {
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
    pub(super) fn store_kv(
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

    /// Output projection of the attention, added to the residual stream,
    /// then the FFN RMSNorm (into `hn`).
    pub(super) fn attn_output(
        &self,
        cx: &Compute,
        lw: &LayerWeights,
        a: &mut Activations,
        ahead: &SideLines,
    ) {
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
    pub(super) fn mlp(
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
}
