//! Q8_0 weights: per column and 32-wide k-block, an f16 scale `d` and 32
//! signed 8-bit quants `q`; a weight is `q*d`.
//!
//! The chunk layout (see [`super::layout`]): `d[64]`, then 32 k of 64 bytes.
//! This module is the scalar reference (packing, dequantization); [`avx2`]
//! and [`avx512`] are its SIMD twins (one exact product per weight).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

use super::layout::{scale, CHUNK_K, TILE_N};
use crate::kernels::convert::f32_to_f16_exact;

/// Store column `c` of one k-block (quants `q` in k order, scale `d`).
pub(crate) fn pack_column(chunk: &mut [u8], c: usize, q: &[i32; 32], d: f32) {
    chunk[2 * c..2 * c + 2].copy_from_slice(&f32_to_f16_exact(d).to_le_bytes());
    for (j, qv) in q.iter().enumerate() {
        chunk[128 + j * TILE_N + c] = *qv as i8 as u8;
    }
}

/// Column `c` of one chunk: its 32 weights in k order.
pub(crate) fn dequant_column(chunk: &[u8], c: usize, out: &mut [f32]) {
    let d = scale(chunk, c);
    for (j, v) in out.iter_mut().enumerate() {
        *v = (chunk[128 + j * TILE_N + c] as i8 as f32) * d;
    }
}

/// Reference dequantization of one chunk into `[32 k][64 columns]` f32.
pub(crate) fn dequant(chunk: &[u8], out: &mut [f32]) {
    for c in 0..TILE_N {
        let d = scale(chunk, c);
        for j in 0..CHUNK_K {
            out[j * TILE_N + c] = (chunk[128 + j * TILE_N + c] as i8 as f32) * d;
        }
    }
}
