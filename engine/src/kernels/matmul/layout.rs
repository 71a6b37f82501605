//! The packed layout every format and ISA shares: tiles of [`TILE_N`]
//! output columns, each split into chunks of [`CHUNK_K`] k values whose
//! columns of one k lie next to each other, and each format's chunk size.
//! A leaf: the format kernels read it and import nothing of the dispatcher.

/// Output columns per tile.
pub const TILE_N: usize = 64;
/// k values per chunk (the ggml quantization block).
pub const CHUNK_K: usize = 32;

/// Storage format of a packed matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackedFormat {
    Q4_1,
    Q8_0,
    F32,
}

/// Bytes of one Q4_1 chunk: d[64] f16, m[64] f16, 16 k-pairs x 64 bytes
/// (low nibble = even k).
///
/// The fused kernels use these constants, not a `chunk_bytes` argument: with
/// the size known at compile time their prefetch loop becomes two fixed
/// prefetches per step and the k loop unrolls. As an argument that happens
/// only where LLVM propagates it, which needs the dispatcher in the
/// kernels' codegen unit; with the kernels in per-format modules it does
/// not, and decode is ~8% slower (docs/BENCHMARKS.md, "bench engine before
/// and after the kernel regroup").
pub(crate) const Q4_1_CHUNK_BYTES: usize = 2 * TILE_N * 2 + 16 * TILE_N;
/// Bytes of one Q8_0 chunk: d[64] f16, 32 k x 64 i8.
pub(crate) const Q8_0_CHUNK_BYTES: usize = TILE_N * 2 + CHUNK_K * TILE_N;

impl PackedFormat {
    pub(crate) fn chunk_bytes(self) -> usize {
        match self {
            PackedFormat::Q4_1 => Q4_1_CHUNK_BYTES,
            PackedFormat::Q8_0 => Q8_0_CHUNK_BYTES,
            // 32 k x 64 f32.
            PackedFormat::F32 => CHUNK_K * TILE_N * 4,
        }
    }
}

/// The f16 scale at index `i` of a chunk's scale array(s), as f32.
#[inline(always)]
pub(crate) fn scale(chunk: &[u8], i: usize) -> f32 {
    crate::kernels::convert::f16_to_f32(u16::from_le_bytes([chunk[2 * i], chunk[2 * i + 1]]))
}
