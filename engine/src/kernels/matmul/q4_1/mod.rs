//! Q4_1 weights: per column and 32-wide k-block, an f16 scale `d`, an f16
//! offset `m` and 32 4-bit quants `q`; a weight is `q*d + m`.
//!
//! The chunk layout (see [`super::layout`]): `d[64]`, `m[64]`, then 16
//! k-pairs of 64 bytes, the even k in the low nibble. This module is the
//! scalar reference (packing, dequantization); [`avx2`] and [`avx512`] are
//! its SIMD twins, which dequantize with one exact `fma(q, d, m)` (see
//! [`super`] on why that is the same value).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

use super::layout::{scale, TILE_N};
use crate::kernels::convert::f32_to_f16_exact;

/// Store column `c` of one k-block (quants `q` in k order, scale `d`, offset `m`).
pub(crate) fn pack_column(chunk: &mut [u8], c: usize, q: &[i32; 32], d: f32, m: f32) {
    chunk[2 * c..2 * c + 2].copy_from_slice(&f32_to_f16_exact(d).to_le_bytes());
    chunk[128 + 2 * c..130 + 2 * c].copy_from_slice(&f32_to_f16_exact(m).to_le_bytes());
    for p in 0..16 {
        chunk[256 + p * TILE_N + c] = (q[2 * p] as u8) | ((q[2 * p + 1] as u8) << 4);
    }
}

/// Column `c` of one chunk: its 32 weights in k order.
pub(crate) fn dequant_column(chunk: &[u8], c: usize, out: &mut [f32]) {
    let (d, mn) = (scale(chunk, c), scale(chunk, TILE_N + c));
    for p in 0..16 {
        let b = chunk[256 + p * TILE_N + c];
        out[2 * p] = ((b & 0x0f) as f32) * d + mn;
        out[2 * p + 1] = ((b >> 4) as f32) * d + mn;
    }
}

/// Reference dequantization of one chunk into `[32 k][64 columns]` f32.
pub(crate) fn dequant(chunk: &[u8], out: &mut [f32]) {
    for c in 0..TILE_N {
        let (d, mn) = (scale(chunk, c), scale(chunk, TILE_N + c));
        for p in 0..16 {
            let b = chunk[256 + p * TILE_N + c];
            out[2 * p * TILE_N + c] = ((b & 0x0f) as f32) * d + mn;
            out[(2 * p + 1) * TILE_N + c] = ((b >> 4) as f32) * d + mn;
        }
    }
}
