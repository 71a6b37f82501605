//! x86-64 SIMD twins of the scalar kernels (AVX-512 and AVX2).
//!
//! Each function performs exactly the scalar reference's operations on each
//! lane (dequantize to the reference's value, Q4_1 as one exact `fma(q, d, m)`;
//! accumulate: one FMA per k), so results are bit-identical to the scalar
//! path; only the lane count differs.

// Register tiles are indexed [row][vector] explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::matmul::{PackedFormat, CHUNK_K, TILE_N};
use super::prefetch::prefetch_ahead;

/// The low and high nibbles of 16 bytes (zero-extended to 32-bit lanes) as
/// f32, by looking them up in `[0.0, 1.0, .., 15.0]`: the permute reads only
/// an index's low 4 bits, so the low nibble needs no mask, and a lookup is one
/// instruction where masking and converting were two (same values: integers
/// below 16 are exact in f32).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn nibbles_as_f32(q: __m512i) -> (__m512, __m512) {
    let values = _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    );
    (
        _mm512_permutexvar_ps(q, values),
        _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), values),
    )
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
pub(crate) unsafe fn dequant_avx512(format: PackedFormat, chunk: &[u8], out: &mut [f32; 2048]) {
    let c = chunk.as_ptr();
    let o = out.as_mut_ptr();
    prefetch_ahead(c, chunk.len());
    match format {
        PackedFormat::Q4_1 => {
            for v in 0..4 {
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(c.add(32 * v) as *const __m256i));
                let m = _mm512_cvtph_ps(_mm256_loadu_si256(c.add(128 + 32 * v) as *const __m256i));
                for p in 0..16 {
                    let b = _mm_loadu_si128(c.add(256 + p * TILE_N + 16 * v) as *const __m128i);
                    let q = _mm512_cvtepu8_epi32(b);
                    let (lo, hi) = nibbles_as_f32(q);
                    _mm512_storeu_ps(o.add(2 * p * TILE_N + 16 * v), _mm512_fmadd_ps(lo, d, m));
                    _mm512_storeu_ps(
                        o.add((2 * p + 1) * TILE_N + 16 * v),
                        _mm512_fmadd_ps(hi, d, m),
                    );
                }
            }
        }
        PackedFormat::Q8_0 => {
            for v in 0..4 {
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(c.add(32 * v) as *const __m256i));
                for j in 0..CHUNK_K {
                    let b = _mm_loadu_si128(c.add(128 + j * TILE_N + 16 * v) as *const __m128i);
                    let q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
                    _mm512_storeu_ps(o.add(j * TILE_N + 16 * v), _mm512_mul_ps(q, d));
                }
            }
        }
        PackedFormat::F32 => super::matmul::dequant_scalar(format, chunk, out),
    }
}

#[target_feature(enable = "avx2,f16c,fma")]
pub(crate) unsafe fn dequant_avx2(format: PackedFormat, chunk: &[u8], out: &mut [f32; 2048]) {
    let c = chunk.as_ptr();
    let o = out.as_mut_ptr();
    prefetch_ahead(c, chunk.len());
    match format {
        PackedFormat::Q4_1 => {
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
        PackedFormat::Q8_0 => {
            for v in 0..8 {
                let d = _mm256_cvtph_ps(_mm_loadu_si128(c.add(16 * v) as *const __m128i));
                for j in 0..CHUNK_K {
                    let b = _mm_loadl_epi64(c.add(128 + j * TILE_N + 8 * v) as *const __m128i);
                    let q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
                    _mm256_storeu_ps(o.add(j * TILE_N + 8 * v), _mm256_mul_ps(q, d));
                }
            }
        }
        PackedFormat::F32 => super::matmul::dequant_scalar(format, chunk, out),
    }
}

#[target_feature(enable = "avx512f,fma")]
unsafe fn micro512_rows<const R: usize>(
    w: *const f32,
    x: *const f32,
    ldx: usize,
    o: *mut f32,
    ldo: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); 4]; R];
    for r in 0..R {
        for v in 0..4 {
            acc[r][v] = _mm512_loadu_ps(o.add(r * ldo + 16 * v));
        }
    }
    for k in 0..CHUNK_K {
        let wv = [
            _mm512_loadu_ps(w.add(k * TILE_N)),
            _mm512_loadu_ps(w.add(k * TILE_N + 16)),
            _mm512_loadu_ps(w.add(k * TILE_N + 32)),
            _mm512_loadu_ps(w.add(k * TILE_N + 48)),
        ];
        for r in 0..R {
            let xb = _mm512_set1_ps(*x.add(r * ldx + k));
            for v in 0..4 {
                acc[r][v] = _mm512_fmadd_ps(wv[v], xb, acc[r][v]);
            }
        }
    }
    for r in 0..R {
        for v in 0..4 {
            _mm512_storeu_ps(o.add(r * ldo + 16 * v), acc[r][v]);
        }
    }
}

/// `rows` rows x 64 columns x 32 k; `w` is 64-byte aligned `[32][64]`.
#[target_feature(enable = "avx512f,fma")]
pub(crate) unsafe fn micro_avx512(
    w: *const f32,
    x: *const f32,
    ldx: usize,
    o: *mut f32,
    ldo: usize,
    rows: usize,
) {
    let mut r = 0;
    while r + 6 <= rows {
        micro512_rows::<6>(w, x.add(r * ldx), ldx, o.add(r * ldo), ldo);
        r += 6;
    }
    while r + 2 <= rows {
        micro512_rows::<2>(w, x.add(r * ldx), ldx, o.add(r * ldo), ldo);
        r += 2;
    }
    if r < rows {
        micro512_rows::<1>(w, x.add(r * ldx), ldx, o.add(r * ldo), ldo);
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn micro256_rows<const R: usize>(
    w: *const f32,
    x: *const f32,
    ldx: usize,
    o: *mut f32,
    ldo: usize,
) {
    // Two passes of 32 columns keep the accumulators in registers.
    for half in 0..2 {
        let (w, o) = (w.add(32 * half), o.add(32 * half));
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        for r in 0..R {
            for v in 0..4 {
                acc[r][v] = _mm256_loadu_ps(o.add(r * ldo + 8 * v));
            }
        }
        for k in 0..CHUNK_K {
            for r in 0..R {
                let xb = _mm256_set1_ps(*x.add(r * ldx + k));
                for v in 0..4 {
                    let wv = _mm256_loadu_ps(w.add(k * TILE_N + 8 * v));
                    acc[r][v] = _mm256_fmadd_ps(wv, xb, acc[r][v]);
                }
            }
        }
        for r in 0..R {
            for v in 0..4 {
                _mm256_storeu_ps(o.add(r * ldo + 8 * v), acc[r][v]);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn micro_avx2(
    w: *const f32,
    x: *const f32,
    ldx: usize,
    o: *mut f32,
    ldo: usize,
    rows: usize,
) {
    let mut r = 0;
    while r + 2 <= rows {
        micro256_rows::<2>(w, x.add(r * ldx), ldx, o.add(r * ldo), ldo);
        r += 2;
    }
    if r < rows {
        micro256_rows::<1>(w, x.add(r * ldx), ldx, o.add(r * ldo), ldo);
    }
}
