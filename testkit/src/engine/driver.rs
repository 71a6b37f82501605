//! A minimal direct driver of the forward pass (no scheduler), for the model
//! tests: the compute pool, KV pools for the reference model, greedy decoding.

use std::sync::OnceLock;

use kvfabric_engine::kernels::Compute;
use kvfabric_engine::kv::{BlockId, KvPool};
use kvfabric_engine::model::SeqChunk;
pub use kvfabric_types::DType;

pub use super::{model, model_path};

pub fn compute() -> &'static Compute {
    static C: OnceLock<Compute> = OnceLock::new();
    C.get_or_init(|| Compute::new(0))
}

/// A pool of `blocks` blocks of `bt` tokens of `dtype` K/V for the reference model.
pub fn pool(bt: usize, blocks: usize, dtype: DType) -> KvPool {
    let m = model();
    let c = &m.config;
    let layout = KvPool::layout_for(c.layers, c.kv_heads, c.head_dim, bt, dtype);
    KvPool::with_bytes(layout, (blocks * layout.block_bytes()) as u64).expect("pool")
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Prefill `prompt` in one pass with blocks `table`, then `steps - 1` greedy decode steps.
/// Returns (logits after the prompt, greedy tokens).
pub fn greedy(
    kv: &mut KvPool,
    table: &[BlockId],
    prompt: &[u32],
    steps: usize,
) -> (Vec<f32>, Vec<u32>) {
    let (m, cx) = (model(), compute());
    let out = m
        .forward(
            cx,
            kv,
            &[SeqChunk {
                tokens: prompt,
                start: 0,
                blocks: table,
                logits: true,
            }],
        )
        .expect("prefill");
    let first = out[0].clone().expect("logits");
    let mut toks = vec![argmax(&first)];
    while toks.len() < steps {
        let pos = prompt.len() + toks.len() - 1;
        let last = [*toks.last().expect("token")];
        let out = m
            .forward(
                cx,
                kv,
                &[SeqChunk {
                    tokens: &last,
                    start: pos,
                    blocks: table,
                    logits: true,
                }],
            )
            .expect("decode");
        toks.push(argmax(out[0].as_ref().expect("logits")));
    }
    (first, toks)
}
