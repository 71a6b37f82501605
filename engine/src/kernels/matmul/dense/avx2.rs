//! The micro kernel on AVX2: the same FMAs as [`super::micro`], 8 columns
//! per instruction, two passes of 32 columns per tile.

// Register tiles are indexed explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::kernels::matmul::layout::{CHUNK_K, TILE_N};

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
pub(crate) unsafe fn micro(
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
