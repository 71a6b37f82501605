//! The per-layer checksum trailer the connector saves after each block's
//! KV bytes, so a load can verify (and hand to the engine) one layer at a
//! time instead of waiting for the whole block.
//!
//! A saved block is `KV bytes (layout.block_bytes()) ‖ trailer`, where the
//! trailer is `layers × xxh3_64(layer bytes)` (little endian), the block's
//! 32-byte key, and an xxh3_64 over both. The store's whole-block checksum
//! still covers everything; the trailer's own hash and key make it
//! self-verifying, so a trailer damaged in transit, or one that belongs to
//! another block, is refused before any layer is checked against it.
//!
//! Blocks stored without a trailer (other clients of the gRPC API) are
//! still loaded, whole, against the store's checksum.

use kvfabric_transfer::checksum::checksum as xxh3_64;
use kvfabric_types::{BlockKey, KvLayout};

/// Bytes of the trailer for `layout`.
pub fn trailer_len(layout: &KvLayout) -> usize {
    layout.layers as usize * 8 + 32 + 8
}

/// Byte range of layer `l` inside a block's KV bytes.
pub fn layer_range(layout: &KvLayout, l: usize) -> std::ops::Range<usize> {
    let n = layout.layer_bytes();
    l * n..(l + 1) * n
}

/// The trailer for `key` whose KV bytes are `block` (layer-major).
pub fn build(layout: &KvLayout, key: &BlockKey, block: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(trailer_len(layout));
    for l in 0..layout.layers as usize {
        let sum = block.get(layer_range(layout, l)).map(xxh3_64).unwrap_or(0);
        out.extend_from_slice(&sum.to_le_bytes());
    }
    out.extend_from_slice(key.as_bytes());
    let own = xxh3_64(&out);
    out.extend_from_slice(&own.to_le_bytes());
    out
}

/// `block`'s KV bytes followed by its trailer: the payload saved for `key`.
pub fn with_trailer(layout: &KvLayout, key: &BlockKey, block: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(block.len() + trailer_len(layout));
    out.extend_from_slice(block);
    out.extend_from_slice(&build(layout, key, block));
    out
}

/// The per-layer checksums in `trailer`, if it is intact and belongs to `key`.
pub fn parse(layout: &KvLayout, key: &BlockKey, trailer: &[u8]) -> Option<Vec<u64>> {
    if trailer.len() != trailer_len(layout) {
        return None;
    }
    let (body, own) = trailer.split_at(trailer.len() - 8);
    if xxh3_64(body) != u64::from_le_bytes(own.try_into().ok()?) {
        return None;
    }
    let (sums, k) = body.split_at(body.len() - 32);
    if k != key.as_bytes().as_slice() {
        return None;
    }
    Some(
        sums.chunks_exact(8)
            .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
    )
}

/// Whether `layer` (the bytes of layer `l` of a block) matches its checksum in `sums`.
pub fn layer_ok(sums: &[u64], l: usize, layer: &[u8]) -> bool {
    sums.get(l).is_some_and(|&want| xxh3_64(layer) == want)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvfabric_types::{BlockOrder, DType};

    fn layout() -> KvLayout {
        KvLayout {
            layers: 3,
            kv_heads: 2,
            head_dim: 4,
            dtype: DType::F32,
            block_tokens: 4,
            order: BlockOrder::LayerKvTokenHead,
        }
    }

    #[test]
    fn a_trailer_round_trips_and_checks_each_layer() {
        let l = layout();
        let key = BlockKey([7; 32]);
        let block: Vec<u8> = (0..l.block_bytes()).map(|i| (i * 31 % 251) as u8).collect();
        let t = build(&l, &key, &block);
        assert_eq!(t.len(), trailer_len(&l));
        let sums = parse(&l, &key, &t).expect("intact trailer");
        assert_eq!(sums.len(), 3);
        let layer = |b: &[u8], i: usize| b[layer_range(&l, i)].to_vec();
        for i in 0..3 {
            assert!(layer_ok(&sums, i, &layer(&block, i)));
        }
        let mut bad = block.clone();
        bad[layer_range(&l, 1).start + 5] ^= 1;
        assert!(layer_ok(&sums, 0, &layer(&bad, 0)));
        assert!(!layer_ok(&sums, 1, &layer(&bad, 1)));
        assert!(layer_ok(&sums, 2, &layer(&bad, 2)));
        assert!(!layer_ok(&sums, 3, &layer(&bad, 2)));
    }

    #[test]
    fn a_damaged_or_foreign_trailer_is_refused() {
        let l = layout();
        let key = BlockKey([7; 32]);
        let block = vec![1u8; l.block_bytes()];
        let t = build(&l, &key, &block);
        for i in 0..t.len() {
            let mut d = t.clone();
            d[i] ^= 0x10;
            assert!(parse(&l, &key, &d).is_none(), "flip at {i} accepted");
        }
        assert!(parse(&l, &BlockKey([8; 32]), &t).is_none());
        assert!(parse(&l, &key, &t[1..]).is_none());
    }
}
