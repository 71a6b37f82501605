//! Q4_1 on AVX-512: dequantization into the scratch, and the fused kernels
//! that dequantize in registers and accumulate at once ([`cols`]: one row,
//! [`rows`]: a small batch). 16 columns per instruction.

// Register tiles are indexed explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::kernels::matmul::layout::{CHUNK_K, Q4_1_CHUNK_BYTES, TILE_N};
use crate::kernels::prefetch::{prefetch_ahead, prefetch_ahead_step, SideCursor};

/// The low (`high` false) or high nibbles of 16 bytes (zero-extended to
/// 32-bit lanes) as f32, by looking them up in `[0.0, 1.0, .., 15.0]`: the
/// permute reads only an index's low 4 bits, so the low nibble needs no
/// mask, and a lookup is one instruction where masking and converting were
/// two (same values: integers below 16 are exact in f32).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn nibble_as_f32(q: __m512i, high: bool) -> __m512 {
    let values = _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    );
    let q = if high { _mm512_srli_epi32(q, 4) } else { q };
    _mm512_permutexvar_ps(q, values)
}

/// Both nibbles of 16 bytes as f32 ([`nibble_as_f32`]).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn nibbles_as_f32(q: __m512i) -> (__m512, __m512) {
    (nibble_as_f32(q, false), nibble_as_f32(q, true))
}

/// One chunk dequantized into `[32 k][64 columns]` f32 (the scratch path):
/// the scalar reference's values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
pub(crate) unsafe fn dequant(chunk: &[u8], out: &mut [f32; 2048]) {
    let c = chunk.as_ptr();
    let o = out.as_mut_ptr();
    prefetch_ahead(c, chunk.len());

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

/// `G` vectors of 16 columns from `col0`, Q4_1, AVX-512.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
pub(crate) unsafe fn cols<const G: usize>(
    tile: *const u8,
    kbs: usize,
    col0: usize,
    x: *const f32,
    out: *mut f32,
) {
    let cb = Q4_1_CHUNK_BYTES;
    let mut acc = [_mm512_setzero_ps(); G];
    for kb in 0..kbs {
        let c = tile.add(kb * cb);
        let mut d = [_mm512_setzero_ps(); G];
        let mut m = [_mm512_setzero_ps(); G];
        for g in 0..G {
            let col = col0 + 16 * g;
            d[g] = _mm512_cvtph_ps(_mm256_loadu_si256(c.add(2 * col) as *const __m256i));
            m[g] = _mm512_cvtph_ps(_mm256_loadu_si256(
                c.add(2 * TILE_N + 2 * col) as *const __m256i
            ));
        }
        let xk = x.add(kb * CHUNK_K);
        for p in 0..CHUNK_K / 2 {
            prefetch_ahead_step(c, cb, p, CHUNK_K / 2);
            let x0 = _mm512_set1_ps(*xk.add(2 * p));
            let x1 = _mm512_set1_ps(*xk.add(2 * p + 1));
            let qp = c.add(4 * TILE_N + p * TILE_N + col0);
            for g in 0..G {
                let b = _mm512_cvtepu8_epi32(_mm_loadu_si128(qp.add(16 * g) as *const __m128i));
                let (lo, hi) = nibbles_as_f32(b);
                acc[g] = _mm512_fmadd_ps(_mm512_fmadd_ps(lo, d[g], m[g]), x0, acc[g]);
                acc[g] = _mm512_fmadd_ps(_mm512_fmadd_ps(hi, d[g], m[g]), x1, acc[g]);
            }
        }
    }
    for g in 0..G {
        _mm512_storeu_ps(out.add(16 * g), acc[g]);
    }
}

/// `G` vectors of 16 columns from `col0` (2: half a tile, 4: a whole
/// one), `R` rows, Q4_1, AVX-512. Each k's weights are made and consumed
/// before the next k's, so only `G` of them are live at once.
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
    let cb = Q4_1_CHUNK_BYTES;
    let side_per_step = side.left().div_ceil(kbs * (CHUNK_K / 2));
    let mut acc = [[_mm512_setzero_ps(); G]; R];
    for kb in 0..kbs {
        let c = tile.add(kb * cb);
        let mut d = [_mm512_setzero_ps(); G];
        let mut m = [_mm512_setzero_ps(); G];
        for g in 0..G {
            let col = col0 + 16 * g;
            d[g] = _mm512_cvtph_ps(_mm256_loadu_si256(c.add(2 * col) as *const __m256i));
            m[g] = _mm512_cvtph_ps(_mm256_loadu_si256(
                c.add(2 * TILE_N + 2 * col) as *const __m256i
            ));
        }
        let xk = x.add(kb * CHUNK_K);
        for p in 0..CHUNK_K / 2 {
            prefetch_ahead_step(c, cb, p, CHUNK_K / 2);
            side.issue(side_per_step);
            let qp = c.add(4 * TILE_N + p * TILE_N + col0);
            let b: [__m512i; G] = std::array::from_fn(|g| {
                _mm512_cvtepu8_epi32(_mm_loadu_si128(qp.add(16 * g) as *const __m128i))
            });
            // h = 0: k = 2p (low nibbles), h = 1: k = 2p + 1 (high nibbles).
            for h in 0..2 {
                let w: [__m512; G] = std::array::from_fn(|g| {
                    _mm512_fmadd_ps(nibble_as_f32(b[g], h == 1), d[g], m[g])
                });
                for r in 0..R {
                    let xb = _mm512_set1_ps(*xk.add(r * ldx + 2 * p + h));
                    for g in 0..G {
                        acc[r][g] = _mm512_fmadd_ps(w[g], xb, acc[r][g]);
                    }
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
