//! The micro kernel on AVX-512: the same FMAs as [`super::micro`], 16
//! columns per instruction, up to 6 rows of accumulators in registers.

// Register tiles are indexed explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::kernels::matmul::layout::{CHUNK_K, TILE_N};

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
pub(crate) unsafe fn micro(
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
