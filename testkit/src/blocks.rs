//! Test blocks: a small f16 layout, keys made from a tag and an index, and
//! distinct bytes per key (the store's and the node's tests).

use kvfabric_types::{BlockKey, BlockOrder, DType, KvLayout};

/// 2 layers x K,V x 64 tokens x 1 head x `head_dim` f16.
pub fn layout(head_dim: u32) -> KvLayout {
    KvLayout {
        layers: 2,
        kv_heads: 1,
        head_dim,
        dtype: DType::F16,
        block_tokens: 64,
        order: BlockOrder::LayerKvTokenHead,
    }
}

pub fn key(tag: u8, i: u32) -> BlockKey {
    let mut k = [tag; 32];
    k[..4].copy_from_slice(&i.to_le_bytes());
    BlockKey(k)
}

/// Distinct bytes per key.
pub fn data(k: &BlockKey, len: usize) -> Vec<u8> {
    let seed = u64::from_le_bytes(k.0[..8].try_into().unwrap_or_default());
    (0..len)
        .map(|j| (seed.wrapping_mul(31).wrapping_add(j as u64 * 7) >> 3) as u8 ^ (j as u8))
        .collect()
}
