//! Q4_1 on AVX2: dequantization into the scratch, and the fused one-row
//! kernel ([`cols`]). 8 columns per instruction.

// Register tiles are indexed explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::kernels::matmul::layout::{CHUNK_K, Q4_1_CHUNK_BYTES, TILE_N};
use crate::kernels::prefetch::prefetch_ahead;

/// One chunk dequantized into `[32 k][64 columns]` f32 (the scratch path):
/// the scalar reference's values.
#[target_feature(enable = "avx2,f16c,fma")]
pub(crate) unsafe fn dequant(chunk: &[u8], out: &mut [f32; 2048]) {
    let c = chunk.as_ptr();
    let o = out.as_mut_ptr();
    prefetch_ahead(c, chunk.len());

    let low = _mm256_set1_epi32(0x0f);
    for v in 0..8 {
        let d = _mm256_cvtph_ps(_mm_loadu_si128(c.add(16 * v) as *const __m128i));
        let m = _mm256_cvtph_ps(_mm_loadu_si128(c.add(128 + 16 * v) as *const __m128i));
        for p in 0..16 {
            let b = _mm_loadl_epi64(c.add(256 + p * TILE_N + 8 * v) as *const __m128i);
            let q = _mm256_cvtepu8_epi32(b);
            let lo = _mm256_cvtepi32_ps(_mm256_and_si256(q, low));
            let hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4));
            _mm256_storeu_ps(o.add(2 * p * TILE_N + 8 * v), _mm256_fmadd_ps(lo, d, m));
            _mm256_storeu_ps(
                o.add((2 * p + 1) * TILE_N + 8 * v),
                _mm256_fmadd_ps(hi, d, m),
            );
        }
    }
}

/// `G` vectors of 8 columns from `col0`, Q4_1, AVX2; `prefetch`: request
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
    let cb = Q4_1_CHUNK_BYTES;
    let low = _mm256_set1_epi32(0x0f);
    let mut acc = [_mm256_setzero_ps(); G];
    for kb in 0..kbs {
        let c = tile.add(kb * cb);
        if prefetch {
            prefetch_ahead(c, cb);
        }
        let mut d = [_mm256_setzero_ps(); G];
        let mut m = [_mm256_setzero_ps(); G];
        for g in 0..G {
            let col = col0 + 8 * g;
            d[g] = _mm256_cvtph_ps(_mm_loadu_si128(c.add(2 * col) as *const __m128i));
            m[g] = _mm256_cvtph_ps(_mm_loadu_si128(
                c.add(2 * TILE_N + 2 * col) as *const __m128i
            ));
        }
        let xk = x.add(kb * CHUNK_K);
        for p in 0..CHUNK_K / 2 {
            let x0 = _mm256_broadcast_ss(&*xk.add(2 * p));
            let x1 = _mm256_broadcast_ss(&*xk.add(2 * p + 1));
            let qp = c.add(4 * TILE_N + p * TILE_N + col0);
            for g in 0..G {
                let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(qp.add(8 * g) as *const __m128i));
                let lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, low));
                let hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
                acc[g] = _mm256_fmadd_ps(_mm256_fmadd_ps(lo, d[g], m[g]), x0, acc[g]);
                acc[g] = _mm256_fmadd_ps(_mm256_fmadd_ps(hi, d[g], m[g]), x1, acc[g]);
            }
        }
    }
    for g in 0..G {
        _mm256_storeu_ps(out.add(8 * g), acc[g]);
    }
}
