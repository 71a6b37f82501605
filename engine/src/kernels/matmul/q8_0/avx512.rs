//! Q8_0 on AVX-512: dequantization into the scratch, and the fused kernels
//! that dequantize in registers and accumulate at once ([`cols`]: one row,
//! [`rows`]: a small batch). 16 columns per instruction.

// Register tiles are indexed explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::kernels::matmul::layout::{CHUNK_K, Q8_0_CHUNK_BYTES, TILE_N};
use crate::kernels::prefetch::{prefetch_ahead, prefetch_ahead_step, SideCursor};

/// One chunk dequantized into `[32 k][64 columns]` f32 (the scratch path):
/// the scalar reference's values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
pub(crate) unsafe fn dequant(chunk: &[u8], out: &mut [f32; 2048]) {
    let c = chunk.as_ptr();
    let o = out.as_mut_ptr();
    prefetch_ahead(c, chunk.len());

    for v in 0..4 {
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(c.add(32 * v) as *const __m256i));
        for j in 0..CHUNK_K {
            let b = _mm_loadu_si128(c.add(128 + j * TILE_N + 16 * v) as *const __m128i);
            let q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
            _mm512_storeu_ps(o.add(j * TILE_N + 16 * v), _mm512_mul_ps(q, d));
        }
    }
}

/// `G` vectors of 16 columns from `col0`, Q8_0, AVX-512.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
pub(crate) unsafe fn cols<const G: usize>(
    tile: *const u8,
    kbs: usize,
    col0: usize,
    x: *const f32,
    out: *mut f32,
) {
    let cb = Q8_0_CHUNK_BYTES;
    let mut acc = [_mm512_setzero_ps(); G];
    for kb in 0..kbs {
        let c = tile.add(kb * cb);
        let mut d = [_mm512_setzero_ps(); G];
        for g in 0..G {
            d[g] = _mm512_cvtph_ps(_mm256_loadu_si256(
                c.add(2 * (col0 + 16 * g)) as *const __m256i
            ));
        }
        let xk = x.add(kb * CHUNK_K);
        for j in 0..CHUNK_K {
            prefetch_ahead_step(c, cb, j, CHUNK_K);
            let xb = _mm512_set1_ps(*xk.add(j));
            let qj = c.add(2 * TILE_N + j * TILE_N + col0);
            for g in 0..G {
                let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(qj.add(16 * g) as *const __m128i));
                let w = _mm512_mul_ps(_mm512_cvtepi32_ps(q), d[g]);
                acc[g] = _mm512_fmadd_ps(w, xb, acc[g]);
            }
        }
    }
    for g in 0..G {
        _mm512_storeu_ps(out.add(16 * g), acc[g]);
    }
}

/// `G` vectors of 16 columns from `col0` (2: half a tile, 4: a whole
/// one), `R` rows, Q8_0, AVX-512.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows<const R: usize, const G: usize>(
    tile: *const u8,
    kbs: usize,
    col0: usize,
    x: *const f32,
    ldx: usize,
    out: *mut f32,
    ldo: usize,
    side: &mut SideCursor,
) {
    let cb = Q8_0_CHUNK_BYTES;
    let side_per_step = side.left().div_ceil(kbs * CHUNK_K);
    let mut acc = [[_mm512_setzero_ps(); G]; R];
    for kb in 0..kbs {
        let c = tile.add(kb * cb);
        let mut d = [_mm512_setzero_ps(); G];
        for g in 0..G {
            d[g] = _mm512_cvtph_ps(_mm256_loadu_si256(
                c.add(2 * (col0 + 16 * g)) as *const __m256i
            ));
        }
        let xk = x.add(kb * CHUNK_K);
        for j in 0..CHUNK_K {
            prefetch_ahead_step(c, cb, j, CHUNK_K);
            side.issue(side_per_step);
            let qj = c.add(2 * TILE_N + j * TILE_N + col0);
            let w: [__m512; G] = std::array::from_fn(|g| {
                let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(qj.add(16 * g) as *const __m128i));
                _mm512_mul_ps(_mm512_cvtepi32_ps(q), d[g])
            });
            for r in 0..R {
                let xb = _mm512_set1_ps(*xk.add(r * ldx + j));
                for g in 0..G {
                    acc[r][g] = _mm512_fmadd_ps(w[g], xb, acc[r][g]);
                }
            }
        }
    }
    for r in 0..R {
        for g in 0..G {
            _mm512_storeu_ps(out.add(r * ldo + 16 * g), acc[r][g]);
        }
    }
}
