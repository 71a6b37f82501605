//! What one forward pass reads and writes: the sequences' chunks in, the
//! activation buffers the layer phases share, the logits out.

use crate::kv::pool::BlockId;

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

/// The buffers of one forward pass over `t` rows.
pub(super) struct Activations {
    pub(super) t: usize,
    /// The residual stream, `[t][hidden]`.
    pub(super) x: Vec<f32>,
    /// Normed rows (the input of the q|k|v and gate|up matmuls).
    pub(super) hn: Vec<f32>,
    /// `[t][q | k | v]`.
    pub(super) qkv: Vec<f32>,
    /// Attention output, `[t][heads * head_dim]`.
    pub(super) att: Vec<f32>,
    /// The output of the attention and down projections, `[t][hidden]`.
    pub(super) tmp: Vec<f32>,
    /// gate|up and SwiGLU output of one FFN slice of at most [`super::rows::FFN_ROWS`] rows.
    pub(super) gu: Vec<f32>,
    pub(super) act: Vec<f32>,
}
