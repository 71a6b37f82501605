//! The geometry of an attention call, shared by the dispatcher in
//! [`super`] and its per-ISA kernels (its own file so that the kernels need
//! not import the dispatcher that calls them).

use kvfabric_types::DType;

/// Where one sequence's KV of one layer lives: per block, K and V base pointers,
/// each `[block_tokens][kv_heads][head_dim]` values of the geometry's dtype.
#[derive(Clone, Copy, Debug)]
pub struct BlockKv {
    pub k: *const u8,
    pub v: *const u8,
}

// SAFETY: read-only pointers into the KV pool, which outlives every kernel call
// and is not written while attention reads it.
unsafe impl Send for BlockKv {}
unsafe impl Sync for BlockKv {}

/// Geometry shared by all rows of a call.
#[derive(Clone, Copy, Debug)]
pub struct AttnGeometry {
    pub block_tokens: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Element type of the stored K and V.
    pub dtype: DType,
}
