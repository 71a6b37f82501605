//! The paged KV pool: fixed-size blocks in one allocation, in the fabric's layout.
//!
//! A block holds `block_tokens` tokens of one sequence, all layers, K and V,
//! laid out exactly as `kvfabric_types::KvLayout` with
//! `BlockOrder::LayerKvTokenHead`: per layer K then V, each
//! `[block_tokens][kv_heads][head_dim]` values of the layout's dtype
//! (`[engine] kv_dtype`: f16 by default, bf16 or f32). The forward pass
//! computes K and V in f32 and [`KvPool::write_token`] rounds them once
//! (to nearest, ties to even) into the pool; attention widens them back
//! exactly. So one block (or one layer of a
//! block) is one contiguous byte range the connector can copy to or from the
//! fabric. The pool is one memfd-backed shared region that the connector
//! registers with the fabric's transfer engine: remote blocks are read
//! straight into engine blocks.
//!
//! Every page of the pool is populated when the pool is made. Left to first
//! touch, a fresh engine loading a 2048-token prefix (94 MB) took ~23k page
//! faults inside the request, which cost as much as the copy itself (the
//! reuse bench's load went from ~45 to ~20 ms). The pool is resident from
//! start, as the `kv_pool` setting says.
//!
//! The pool hands out raw pointers rather than slices of the whole region
//! because the connector reads and writes other blocks concurrently (blocks
//! being loaded or saved), which the scheduler keeps out of forward passes.

use std::ops::Range;
use std::sync::Arc;

use kvfabric_types::SharedRegion;
use kvfabric_types::{BlockOrder, DType, KvLayout};

use crate::kernels::convert::round_row;
use crate::kernels::Isa;
use crate::EngineError;

/// Index of a block in the pool.
pub type BlockId = u32;

/// Fixed-size KV blocks in one contiguous shared region.
pub struct KvPool {
    layout: KvLayout,
    blocks: usize,
    region: Arc<SharedRegion>,
}

impl std::fmt::Debug for KvPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvPool")
            .field("layout", &self.layout)
            .field("blocks", &self.blocks)
            .finish()
    }
}

impl KvPool {
    /// The layout of a pool of `dtype` values for a model shape.
    pub fn layout_for(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        block_tokens: usize,
        dtype: DType,
    ) -> KvLayout {
        KvLayout {
            layers: layers as u32,
            kv_heads: kv_heads as u32,
            head_dim: head_dim as u32,
            dtype,
            block_tokens: block_tokens as u32,
            order: BlockOrder::LayerKvTokenHead,
        }
    }

    /// A pool of as many blocks as fit in `bytes` (at least one).
    pub fn with_bytes(layout: KvLayout, bytes: u64) -> Result<KvPool, EngineError> {
        layout
            .validate()
            .map_err(|e| EngineError::InvalidRequest(format!("KV layout: {e}")))?;
        let blocks = (bytes / layout.block_bytes() as u64) as usize;
        if blocks == 0 {
            return Err(EngineError::InvalidRequest(format!(
                "KV pool of {bytes} bytes holds no block of {} bytes",
                layout.block_bytes()
            )));
        }
        let region =
            SharedRegion::create_populated("kvfabric-kv-pool", blocks * layout.block_bytes())
                .map_err(EngineError::KvPool)?;
        Ok(KvPool {
            layout,
            blocks,
            region: Arc::new(region),
        })
    }

    /// The block layout (part of every block key).
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Number of blocks.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Bytes reserved for all blocks.
    pub fn capacity_bytes(&self) -> usize {
        self.blocks * self.layout.block_bytes()
    }

    /// The shared region holding every block (block `b` at `block_range(b)`).
    pub fn region(&self) -> &Arc<SharedRegion> {
        &self.region
    }

    /// Byte range of `block` in the pool's region.
    pub fn block_range(&self, block: BlockId) -> Range<usize> {
        let n = self.layout.block_bytes();
        block as usize * n..(block as usize + 1) * n
    }

    /// Byte range of one layer (K then V) of `block` in the pool's region.
    pub fn layer_range(&self, block: BlockId, layer: usize) -> Range<usize> {
        let base = self.block_range(block).start;
        let r = self.layout.layer_range(layer);
        base + r.start..base + r.end
    }

    /// One block's bytes (the caller makes sure nobody writes it meanwhile).
    pub fn block_bytes(&self, block: BlockId) -> &[u8] {
        assert!(
            (block as usize) < self.blocks,
            "block {block} out of the pool"
        );
        let r = self.block_range(block);
        // SAFETY: in bounds; writers of this block are excluded by the scheduler.
        unsafe { std::slice::from_raw_parts(self.region.as_ptr().add(r.start), r.len()) }
    }

    /// Byte offset of K (`v == false`) or V of `layer` in `block`.
    fn half_offset(&self, block: BlockId, layer: usize, v: bool) -> usize {
        let half = self.layout.half_layer_bytes();
        block as usize * self.layout.block_bytes() + (2 * layer + v as usize) * half
    }

    /// Base pointer of K or V of one layer of one block (for the attention
    /// kernel; `[block_tokens][kv_heads][head_dim]` values of the layout's dtype).
    pub fn half_ptr(&self, block: BlockId, layer: usize, v: bool) -> *const u8 {
        // SAFETY: the offset is inside the region for a valid block/layer.
        unsafe { self.region.as_ptr().add(self.half_offset(block, layer, v)) }
    }

    /// Copy the whole of block `src` into block `dst` (every layer, K and
    /// V): a sample forked from a prompt gets its own copy of the prompt's
    /// partial last block, which it is about to write into.
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId) {
        let (from, to) = (self.block_range(src), self.block_range(dst));
        assert!(src != dst && from.len() == to.len());
        // SAFETY: both ranges are whole blocks inside the region and do not
        // overlap (distinct blocks); `dst` belongs to the new sample only.
        unsafe {
            let base = self.region.as_ptr();
            std::ptr::copy_nonoverlapping(base.add(from.start), base.add(to.start), from.len());
        }
    }

    /// Round one token's K and V (each `kv_heads*head_dim` f32) to the pool's
    /// dtype into a block slot (`isa`: one this CPU runs; the bits do not
    /// depend on it).
    #[allow(clippy::too_many_arguments)]
    pub fn write_token(
        &mut self,
        isa: Isa,
        block: BlockId,
        layer: usize,
        slot: usize,
        k: &[f32],
        v: &[f32],
    ) {
        let row = (self.layout.kv_heads * self.layout.head_dim) as usize;
        assert!(slot < self.layout.block_tokens as usize && k.len() == row && v.len() == row);
        assert!((block as usize) < self.blocks && layer < self.layout.layers as usize);
        let size = self.layout.dtype.size();
        let ko = self.half_offset(block, layer, false) + slot * row * size;
        let vo = self.half_offset(block, layer, true) + slot * row * size;
        let base = self.region.as_ptr();
        // SAFETY: both rows are inside the block's layer, checked above; the
        // scheduler gives this block to one sequence's forward pass only.
        unsafe {
            round_row(isa, self.layout.dtype, k, base.add(ko));
            round_row(isa, self.layout.dtype, v, base.add(vo));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_store_layout() {
        let layout = KvPool::layout_for(3, 2, 4, 8, DType::F32);
        let mut pool =
            KvPool::with_bytes(layout, 10 * layout.block_bytes() as u64 + 5).expect("pool");
        assert_eq!(pool.blocks(), 10);
        assert_eq!(
            pool.block_range(2),
            2 * layout.block_bytes()..3 * layout.block_bytes()
        );
        assert_eq!(pool.layer_range(2, 1).len(), layout.layer_bytes());
        // Token 3 of layer 1 of block 2: K at layer start + 3*row, V half a layer later.
        let k = [1.0f32; 8];
        let v = [2.0f32; 8];
        pool.write_token(Isa::Scalar, 2, 1, 3, &k, &v);
        let lr = pool.layer_range(2, 1);
        let start = pool.block_range(2).start;
        let bytes = &pool.block_bytes(2)[lr.start - start..lr.end - start];
        let f = |o: usize| f32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
        assert_eq!(f(3 * 8 * 4), 1.0);
        assert_eq!(f(layout.half_layer_bytes() + 3 * 8 * 4), 2.0);
        assert_eq!(f(0), 0.0);
        assert!(KvPool::with_bytes(layout, 10).is_err());
    }

    #[test]
    fn half_pools_store_rounded_values_in_half_the_bytes() {
        use crate::kernels::convert::{bf16_to_f32, f16_to_f32};
        let k: Vec<f32> = (0..8).map(|i| 1.0 + i as f32 / 3.0).collect();
        let v: Vec<f32> = (0..8).map(|i| -1e-3 * i as f32).collect();
        for (dtype, widen) in [
            (DType::F16, f16_to_f32 as fn(u16) -> f32),
            (DType::BF16, bf16_to_f32),
        ] {
            let layout = KvPool::layout_for(3, 2, 4, 8, dtype);
            assert_eq!(
                2 * layout.block_bytes(),
                KvPool::layout_for(3, 2, 4, 8, DType::F32).block_bytes()
            );
            let mut pool =
                KvPool::with_bytes(layout, 4 * layout.block_bytes() as u64).expect("pool");
            for isa in Isa::all_detected() {
                pool.write_token(isa, 3, 2, 7, &k, &v);
                let base = pool.block_range(3).start;
                let lr = pool.layer_range(3, 2);
                let bytes = &pool.block_bytes(3)[lr.start - base..lr.end - base];
                let h = |o: usize| widen(u16::from_le_bytes([bytes[o], bytes[o + 1]]));
                for i in 0..8 {
                    let (gk, gv) = (
                        h(2 * (7 * 8 + i)),
                        h(layout.half_layer_bytes() + 2 * (7 * 8 + i)),
                    );
                    assert!(
                        (gk - k[i]).abs() <= k[i].abs() / 256.0,
                        "{dtype:?} {isa:?} k {i}"
                    );
                    assert!(
                        (gv - v[i]).abs() <= v[i].abs() / 256.0,
                        "{dtype:?} {isa:?} v {i}"
                    );
                    assert_ne!(gk, 0.0);
                }
            }
        }
    }
}
