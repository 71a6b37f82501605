//! kvfabric-codec: a lossless codec for KV blocks of 16- and 32-bit floats.
//!
//! A KV block is K and V values of many tokens; its floats' high bytes
//! (sign and exponent) repeat a few values, and their low mantissa bytes
//! are close to random. The codec splits each segment of a block into byte
//! planes and codes every plane with what pays: a static Huffman code
//! (four interleaved streams, 11-bit codes: one table lookup per byte),
//! a single repeated byte, or the raw bytes. See `planes` for the format.
//!
//! Measured on the engine's blocks (`kvfabric bench kv`, docs/BENCHMARKS.md)
//! against zstd-1 and lz4 on raw bytes and on the same planes: Huffman on
//! planes gets the ratio of zstd-1 on planes at several times its decode
//! speed, since the planes have no repeats for an LZ stage to find.
//!
//! The fast profile ([`encode_fast`], format version 2) codes the high
//! byte of f16 elements in `window`'s fixed-width code instead: as small
//! on KV blocks, and decoded by SIMD loops at a good fraction of memcpy
//! (the Huffman decoder walks a table per byte). [`decode`] reads both.
//!
//! Every encoded block starts with a [`Header`] (codec id, version, element
//! width, decoded and encoded lengths). Decoding never trusts it: the
//! caller states the decoded length it expects ([`decode`] takes the output
//! buffer, [`decode_to_vec`] a limit) before anything is allocated, and
//! truncated or corrupt input is a [`CodecError`], never a panic.
//!
//! ```
//! let block: Vec<u8> = (0..4096u32).flat_map(|i| ((i % 7) as f32).to_le_bytes()).collect();
//! let mut enc = Vec::new();
//! kvfabric_codec::encode(&block, 4, &mut enc).unwrap();
//! assert!(enc.len() < block.len());
//! let mut back = vec![0u8; block.len()];
//! kvfabric_codec::decode(&enc, &mut back).unwrap();
//! assert_eq!(back, block);
//! ```

mod error;
mod estimate;
mod header;
mod huffman;
mod planes;
pub mod sample;
mod window;

pub use error::CodecError;
pub use header::{Header, CODEC_PLANES, HEADER_LEN, VERSION, VERSION_FAST};
pub use planes::{shuffle, unshuffle, Profile};

/// Elements per segment when the caller names none: 12288 is one layer's K
/// (or V) of a 64-token SmolLM2 block (64 tokens x 3 heads x 64 dims), and
/// large enough that the per-segment tables cost under 2%.
pub const DEFAULT_SEGMENT: u32 = 12288;

/// Encode `src`, a block of `width`-byte elements (2 for f16/bf16, 4 for
/// f32), into `out` (cleared first), with [`DEFAULT_SEGMENT`] segments.
pub fn encode(src: &[u8], width: usize, out: &mut Vec<u8>) -> Result<(), CodecError> {
    encode_with(src, width, DEFAULT_SEGMENT, Profile::Compact, out)
}

/// Encode `src` for decoding at memory speed: 2-byte elements (f16) in
/// rows of `row` (a KV block's channels, `kv_heads x head_dim`) get the
/// window code (`window`); other widths, or `row` 0, fall back to
/// [`encode`]. As small as [`encode`]'s output on the engine's f16 blocks
/// (1.165 against 1.163), decoded ~6x faster with AVX-512 (~0.5-0.7x
/// memcpy, `bench kv`); encoding is about half as fast.
pub fn encode_fast(
    src: &[u8],
    width: usize,
    row: usize,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    encode_with(src, width, DEFAULT_SEGMENT, Profile::fast(width, row), out)
}

/// Encode with `segment` elements per segment (see [`Profile::segment`])
/// in `profile`.
pub fn encode_with(
    src: &[u8],
    width: usize,
    segment: u32,
    profile: Profile,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    planes::encode(src, width, segment, profile, out)
}

/// [`encode`] with `segment` elements per segment (one table each).
pub fn encode_segmented(
    src: &[u8],
    width: usize,
    segment: u32,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    encode_with(src, width, segment, Profile::Compact, out)
}

/// Estimated encoded length of `src` (as [`encode_segmented`] would
/// write it) from a sample of each segment's planes, at a small fraction of
/// the encoder's cost: lets a caller skip encoding what would not shrink.
/// It leans towards under-estimating (see `estimate`).
pub fn estimate_encoded_len(src: &[u8], width: usize, segment: u32) -> usize {
    estimate::encoded_len(src, width, segment)
}

/// Decode `enc` into `out`; the block must decode to exactly `out.len()`
/// bytes. Bytes of `enc` past its encoded length (padding) are ignored.
pub fn decode(enc: &[u8], out: &mut [u8]) -> Result<(), CodecError> {
    planes::decode(enc, out)
}

/// Decode `enc` into a new buffer, refusing (before allocating) a block
/// that claims more than `limit` bytes.
pub fn decode_to_vec(enc: &[u8], limit: u64) -> Result<Vec<u8>, CodecError> {
    let h = Header::parse(enc)?;
    if h.decoded_len > limit {
        return Err(CodecError::WrongLength {
            len: h.decoded_len,
            limit,
        });
    }
    let mut out = vec![0u8; h.decoded_len as usize];
    planes::decode(enc, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests;
