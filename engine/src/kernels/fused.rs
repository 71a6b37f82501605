//! Batch-1 (decode) matmul: dequantize in registers and accumulate at once.
//!
//! For one row the dequantization scratch of [`super::matmul`] costs more
//! than it saves (every weight is stored to and reloaded from L1 for one
//! FMA). Here each 8-column vector of weights is dequantized exactly as the
//! reference does (convert, multiply by `d`, then add `m`: two rounded
//! operations, never an FMA) and consumed by one FMA per row straight away.
//! Each output is still accumulated from 0 with one FMA per k, k = 0..K in
//! order, so the bits equal the scratch path and the scalar reference for
//! every row count, tiling and thread split.
//!
//! The kernels use AVX2 (8 lanes) on both SIMD ISAs: every AVX-512 CPU has
//! AVX2, and lane count does not change a lane's value.

// Register tiles are indexed [row][vector] explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::matmul::{PackedFormat, CHUNK_K, TILE_N};

/// Output columns per fused task (a half tile).
pub(crate) const FUSED_COLS: usize = 32;
/// Largest row count the fused kernels take. Measured on AVX2 (Zen 3): for
/// 2..=4 rows they were no faster than dequantizing once into the scratch.
pub(crate) const FUSED_MAX_ROWS: usize = 1;

/// Columns `col0..col0 + 32` of one tile for `rows` rows.
///
/// # Safety
/// The CPU must have AVX2, F16C and FMA; `tile` points to the tile's `kbs`
/// chunks of `format`; `x` holds `rows` rows of `ldx >= 32 * kbs` values;
/// `out` holds `rows` rows of stride `ldo` with 32 writable columns.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn fused_cols(
    format: PackedFormat,
    tile: *const u8,
    kbs: usize,
    col0: usize,
    x: *const f32,
    ldx: usize,
    out: *mut f32,
    ldo: usize,
    rows: usize,
) {
    let cb = format.chunk_bytes();
    match (format, rows) {
        // Two passes of 16 columns: with 32 at once the compiler runs out of
        // registers and spills inside the k loop, which made it 3x slower.
        (PackedFormat::Q4_1, 1) => {
            q4_1::<1, 2>(tile, cb, kbs, col0, x, ldx, out, ldo);
            q4_1::<1, 2>(tile, cb, kbs, col0 + 16, x, ldx, out.add(16), ldo);
        }
        (PackedFormat::Q8_0, 1) => q8_0::<1, 4>(tile, cb, kbs, col0, x, ldx, out, ldo),
        _ => unreachable!("fused kernels take Q4_1/Q8_0 and one row"),
    }
}

/// `G` vectors of 8 columns from `col0`, `R` rows, Q4_1.
#[target_feature(enable = "avx2,f16c,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn q4_1<const R: usize, const G: usize>(
    tile: *const u8,
    cb: usize,
    kbs: usize,
    col0: usize,
    x: *const f32,
    ldx: usize,
    out: *mut f32,
    ldo: usize,
) {
    let low = _mm256_set1_epi32(0x0f);
    let mut acc = [[_mm256_setzero_ps(); G]; R];
    for kb in 0..kbs {
        let c = tile.add(kb * cb);
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
            let mut x0 = [_mm256_setzero_ps(); R];
            let mut x1 = [_mm256_setzero_ps(); R];
            for r in 0..R {
                x0[r] = _mm256_broadcast_ss(&*xk.add(r * ldx + 2 * p));
                x1[r] = _mm256_broadcast_ss(&*xk.add(r * ldx + 2 * p + 1));
            }
            let qp = c.add(4 * TILE_N + p * TILE_N + col0);
            for g in 0..G {
                let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(qp.add(8 * g) as *const __m128i));
                let lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, low));
                let hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
                let wlo = _mm256_add_ps(_mm256_mul_ps(lo, d[g]), m[g]);
                let whi = _mm256_add_ps(_mm256_mul_ps(hi, d[g]), m[g]);
                for r in 0..R {
                    acc[r][g] = _mm256_fmadd_ps(wlo, x0[r], acc[r][g]);
                }
                for r in 0..R {
                    acc[r][g] = _mm256_fmadd_ps(whi, x1[r], acc[r][g]);
                }
            }
        }
    }
    for r in 0..R {
        for g in 0..G {
            _mm256_storeu_ps(out.add(r * ldo + 8 * g), acc[r][g]);
        }
    }
}

/// `G` vectors of 8 columns from `col0`, `R` rows, Q8_0.
#[target_feature(enable = "avx2,f16c,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn q8_0<const R: usize, const G: usize>(
    tile: *const u8,
    cb: usize,
    kbs: usize,
    col0: usize,
    x: *const f32,
    ldx: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); G]; R];
    for kb in 0..kbs {
        let c = tile.add(kb * cb);
        let mut d = [_mm256_setzero_ps(); G];
        for g in 0..G {
            d[g] = _mm256_cvtph_ps(_mm_loadu_si128(c.add(2 * (col0 + 8 * g)) as *const __m128i));
        }
        let xk = x.add(kb * CHUNK_K);
        for j in 0..CHUNK_K {
            let mut xb = [_mm256_setzero_ps(); R];
            for r in 0..R {
                xb[r] = _mm256_broadcast_ss(&*xk.add(r * ldx + j));
            }
            let qj = c.add(2 * TILE_N + j * TILE_N + col0);
            for g in 0..G {
                let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(qj.add(8 * g) as *const __m128i));
                let w = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d[g]);
                for r in 0..R {
                    acc[r][g] = _mm256_fmadd_ps(w, xb[r], acc[r][g]);
                }
            }
        }
    }
    for r in 0..R {
        for g in 0..G {
            _mm256_storeu_ps(out.add(r * ldo + 8 * g), acc[r][g]);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::kernels::matmul::tests::{random_q4_1, random_q8_0};
    use crate::kernels::{Isa, PackedMatrix, ThreadPool};

    /// Every row count, through the fused kernels (1 row) and past them (the
    /// scratch path), equals the sequential-FMA reference bit for bit, for
    /// both quantized formats, every ISA and thread count.
    #[test]
    fn fused_rows_equal_sequential_fma_reference() {
        let isas = Isa::all_detected();
        let (n, k) = (192, 160);
        for q8 in [false, true] {
            let (info, bytes, deq) = if q8 {
                random_q8_0(n, k, 11)
            } else {
                random_q4_1(n, k, 11)
            };
            let w = PackedMatrix::pack(&[(&info, &bytes)]).expect("pack");
            let m = 7;
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 13.0)
                .collect();
            let mut want = vec![0f32; m * n];
            for r in 0..m {
                for c in 0..n {
                    let mut acc = 0f32;
                    for j in 0..k {
                        acc = deq[c * k + j].mul_add(x[r * k + j], acc);
                    }
                    want[r * n + c] = acc;
                }
            }
            for threads in [1, 2, 3] {
                let pool = ThreadPool::new(threads);
                for &isa in &isas {
                    for rows in 1..=m {
                        let mut out = vec![f32::NAN; rows * n];
                        w.matmul(&pool, isa, &x[..rows * k], rows, &mut out);
                        let same = out
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "q8={q8} {isa:?} rows={rows} threads={threads}");
                    }
                }
            }
        }
    }
}
