//! Q8_0 on AVX2: dequantization into the scratch, and the fused one-row
//! kernel ([`cols`]). 8 columns per instruction.

// Register tiles are indexed explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::kernels::matmul::layout::{CHUNK_K, Q8_0_CHUNK_BYTES, TILE_N};
use crate::kernels::prefetch::prefetch_ahead;

/// One chunk dequantized into `[32 k][64 columns]` f32 (the scratch path):
/// the scalar reference's values.
#[target_feature(enable = "avx2,f16c,fma")]
pub(crate) unsafe fn dequant(chunk: &[u8], out: &mut [f32; 2048]) {
    let c = chunk.as_ptr();
    let o = out.as_mut_ptr();
    prefetch_ahead(c, chunk.len());

    for v in 0..8 {
        let d = _mm256_cvtph_ps(_mm_loadu_si128(c.add(16 * v) as *const __m128i));
        for j in 0..CHUNK_K {
            let b = _mm_loadl_epi64(c.add(128 + j * TILE_N + 8 * v) as *const __m128i);
            let q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
            _mm256_storeu_ps(o.add(j * TILE_N + 8 * v), _mm256_mul_ps(q, d));
        }
    }
}

/// `G` vectors of 8 columns from `col0`, Q8_0, AVX2; `prefetch`: request
/// the chunks ahead (the first of several passes over one tile).
#[target_feature(enable = "avx2,f16c,fma")]
pub(crate) unsafe fn cols<const G: usize>(
    tile: *const u8,
    kbs: usize,
    col0: usize,
    x: *const f32,
    out: *mut f32,
    prefetch: bool,
) {
    let cb = Q8_0_CHUNK_BYTES;
    let mut acc = [_mm256_setzero_ps(); G];
    for kb in 0..kbs {
        let c = tile.add(kb * cb);
        if prefetch {
            prefetch_ahead(c, cb);
        }
        let mut d = [_mm256_setzero_ps(); G];
        for g in 0..G {
            d[g] = _mm256_cvtph_ps(_mm_loadu_si128(c.add(2 * (col0 + 8 * g)) as *const __m128i));
        }
        let xk = x.add(kb * CHUNK_K);
        for j in 0..CHUNK_K {
            let xb = _mm256_broadcast_ss(&*xk.add(j));
            let qj = c.add(2 * TILE_N + j * TILE_N + col0);
            for g in 0..G {
                let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(qj.add(8 * g) as *const __m128i));
                let w = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d[g]);
                acc[g] = _mm256_fmadd_ps(w, xb, acc[g]);
            }
        }
    }
    for g in 0..G {
        _mm256_storeu_ps(out.add(8 * g), acc[g]);
    }
}
