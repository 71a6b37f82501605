//! Batch-1 (decode) matmul: dequantize in registers and accumulate at once.
//!
//! For one row the dequantization scratch of [`super::matmul`] costs more
//! than it saves (every weight is stored to and reloaded from L1 for one
//! FMA). Here each vector of weights is dequantized to exactly the
//! reference's f32 value (see [`super::matmul`] on why `fma(q, d, m)` equals
//! `q*d + m`) and consumed by one FMA straight away. Each output is still
//! accumulated from 0 with one FMA per k, k = 0..K in order, so the bits
//! equal the scratch path and the scalar reference for every row count,
//! tiling and thread split. Only one row: measured on AVX2 (Zen 3), for
//! 2..=4 rows register dequantization was no faster than the scratch. The
//! AVX-512 and AVX2 twins differ only in how many columns one instruction
//! covers (16 or 8); a lane's value is the same.

// Register tiles are indexed by vector explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::matmul::{PackedFormat, CHUNK_K, TILE_N};
use super::prefetch::{prefetch_ahead, prefetch_ahead_step, SideCursor};
use super::simd::nibbles_as_f32;
use super::Isa;

/// Columns of one fused call: a whole tile, or half of one when a matrix has
/// too few tiles to share evenly between threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FusedCols {
    Half,
    Whole,
}

impl FusedCols {
    pub(crate) fn count(self) -> usize {
        match self {
            FusedCols::Half => TILE_N / 2,
            FusedCols::Whole => TILE_N,
        }
    }
}

/// Columns `col0..col0 + cols.count()` of one tile for one row.
///
/// # Safety
/// `isa` is a SIMD ISA this CPU has (both imply AVX2, F16C and FMA); `tile`
/// points to the tile's `kbs` chunks of `format` (Q4_1 or Q8_0); `x` holds
/// `32 * kbs` values; `out` has `cols.count()` writable values.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn fused_cols(
    isa: Isa,
    format: PackedFormat,
    tile: *const u8,
    kbs: usize,
    col0: usize,
    cols: FusedCols,
    x: *const f32,
    out: *mut f32,
) {
    let cb = format.chunk_bytes();
    match (isa, format, cols) {
        (Isa::Avx512, PackedFormat::Q4_1, FusedCols::Whole) => {
            q4_1_avx512::<4>(tile, cb, kbs, col0, x, out)
        }
        (Isa::Avx512, PackedFormat::Q4_1, FusedCols::Half) => {
            q4_1_avx512::<2>(tile, cb, kbs, col0, x, out)
        }
        (Isa::Avx512, PackedFormat::Q8_0, FusedCols::Whole) => {
            q8_0_avx512::<4>(tile, cb, kbs, col0, x, out)
        }
        (Isa::Avx512, PackedFormat::Q8_0, FusedCols::Half) => {
            q8_0_avx512::<2>(tile, cb, kbs, col0, x, out)
        }
        // Passes of 16 (Q4_1) or 32 (Q8_0) columns: with more at once the compiler
        // runs out of the 16 AVX2 registers and spills inside the k loop (3x slower).
        // Every pass reads the same cache lines: only the first prefetches them.
        (_, PackedFormat::Q4_1, _) => {
            for c in (0..cols.count()).step_by(16) {
                q4_1_avx2::<2>(tile, cb, kbs, col0 + c, x, out.add(c), c == 0);
            }
        }
        (_, PackedFormat::Q8_0, _) => {
            for c in (0..cols.count()).step_by(32) {
                q8_0_avx2::<4>(tile, cb, kbs, col0 + c, x, out.add(c), c == 0);
            }
        }
        (_, PackedFormat::F32, _) => unreachable!("fused kernels take Q4_1 and Q8_0"),
    }
}

/// `G` vectors of 16 columns from `col0`, Q4_1, AVX-512.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
unsafe fn q4_1_avx512<const G: usize>(
    tile: *const u8,
    cb: usize,
    kbs: usize,
    col0: usize,
    x: *const f32,
    out: *mut f32,
) {
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

/// `G` vectors of 16 columns from `col0`, Q8_0, AVX-512.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
unsafe fn q8_0_avx512<const G: usize>(
    tile: *const u8,
    cb: usize,
    kbs: usize,
    col0: usize,
    x: *const f32,
    out: *mut f32,
) {
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

/// Rows of a small batch (2..=[`FUSED_ROWS`]) at once, AVX-512 only: half a
/// tile (32 columns) of `rows` rows, each dequantized weight vector feeding
/// one FMA per row. `x` rows are `ldx` floats apart, `out` rows `ldo`.
///
/// On AVX-512 (Emerald Rapids), a batch-8 decode step through the scratch
/// path stored and reloaded every weight once per tile and split the 9-tile
/// matrices unevenly between 2 threads; half tiles with 8 rows x 2 vectors of
/// accumulators stay in registers (16 of 32).
///
/// # Safety
/// As [`fused_cols`], with `isa == Isa::Avx512`, `x` holding `rows` rows and
/// `out` `rows` rows of 32 writable values. `side`: lines a later step will
/// read, requested evenly over the task's inner loop (see [`super::prefetch`]).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn fused_rows_avx512(
    format: PackedFormat,
    tile: *const u8,
    kbs: usize,
    col0: usize,
    x: *const f32,
    ldx: usize,
    rows: usize,
    out: *mut f32,
    ldo: usize,
    side: &mut SideCursor,
) {
    let cb = format.chunk_bytes();
    macro_rules! by_rows {
        ($f:ident: $($r:literal)*) => {
            match rows {
                $($r => $f::<$r>(tile, cb, kbs, col0, x, ldx, out, ldo, side),)*
                _ => unreachable!("fused_rows_avx512 takes 2..=8 rows"),
            }
        };
    }
    match format {
        PackedFormat::Q4_1 => by_rows!(q4_1_rows_avx512: 2 3 4 5 6 7 8),
        PackedFormat::Q8_0 => by_rows!(q8_0_rows_avx512: 2 3 4 5 6 7 8),
        PackedFormat::F32 => unreachable!("fused kernels take Q4_1 and Q8_0"),
    }
}

/// Most rows [`fused_rows_avx512`] takes.
pub(crate) const FUSED_ROWS: usize = 8;

/// 2 vectors of 16 columns from `col0`, `R` rows, Q4_1, AVX-512.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn q4_1_rows_avx512<const R: usize>(
    tile: *const u8,
    cb: usize,
    kbs: usize,
    col0: usize,
    x: *const f32,
    ldx: usize,
    out: *mut f32,
    ldo: usize,
    side: &mut SideCursor,
) {
    let side_per_step = side.left().div_ceil(kbs * (CHUNK_K / 2));
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for kb in 0..kbs {
        let c = tile.add(kb * cb);
        let mut d = [_mm512_setzero_ps(); 2];
        let mut m = [_mm512_setzero_ps(); 2];
        for g in 0..2 {
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
            // w[g][0]: k = 2p, w[g][1]: k = 2p + 1 (low and high nibbles).
            let w: [[__m512; 2]; 2] = std::array::from_fn(|g| {
                let b = _mm512_cvtepu8_epi32(_mm_loadu_si128(qp.add(16 * g) as *const __m128i));
                let (lo, hi) = nibbles_as_f32(b);
                [
                    _mm512_fmadd_ps(lo, d[g], m[g]),
                    _mm512_fmadd_ps(hi, d[g], m[g]),
                ]
            });
            for r in 0..R {
                let xr = xk.add(r * ldx + 2 * p);
                for h in 0..2 {
                    let xb = _mm512_set1_ps(*xr.add(h));
                    for g in 0..2 {
                        acc[r][g] = _mm512_fmadd_ps(w[g][h], xb, acc[r][g]);
                    }
                }
            }
        }
    }
    for r in 0..R {
        for g in 0..2 {
            _mm512_storeu_ps(out.add(r * ldo + 16 * g), acc[r][g]);
        }
    }
}

/// 2 vectors of 16 columns from `col0`, `R` rows, Q8_0, AVX-512.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn q8_0_rows_avx512<const R: usize>(
    tile: *const u8,
    cb: usize,
    kbs: usize,
    col0: usize,
    x: *const f32,
    ldx: usize,
    out: *mut f32,
    ldo: usize,
    side: &mut SideCursor,
) {
    let side_per_step = side.left().div_ceil(kbs * CHUNK_K);
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for kb in 0..kbs {
        let c = tile.add(kb * cb);
        let mut d = [_mm512_setzero_ps(); 2];
        for g in 0..2 {
            d[g] = _mm512_cvtph_ps(_mm256_loadu_si256(
                c.add(2 * (col0 + 16 * g)) as *const __m256i
            ));
        }
        let xk = x.add(kb * CHUNK_K);
        for j in 0..CHUNK_K {
            prefetch_ahead_step(c, cb, j, CHUNK_K);
            side.issue(side_per_step);
            let qj = c.add(2 * TILE_N + j * TILE_N + col0);
            let w: [__m512; 2] = std::array::from_fn(|g| {
                let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(qj.add(16 * g) as *const __m128i));
                _mm512_mul_ps(_mm512_cvtepi32_ps(q), d[g])
            });
            for r in 0..R {
                let xb = _mm512_set1_ps(*xk.add(r * ldx + j));
                for g in 0..2 {
                    acc[r][g] = _mm512_fmadd_ps(w[g], xb, acc[r][g]);
                }
            }
        }
    }
    for r in 0..R {
        for g in 0..2 {
            _mm512_storeu_ps(out.add(r * ldo + 16 * g), acc[r][g]);
        }
    }
}

/// `G` vectors of 8 columns from `col0`, Q4_1, AVX2; `prefetch`: request
/// the chunks ahead (the first of several passes over one tile).
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn q4_1_avx2<const G: usize>(
    tile: *const u8,
    cb: usize,
    kbs: usize,
    col0: usize,
    x: *const f32,
    out: *mut f32,
    prefetch: bool,
) {
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

/// `G` vectors of 8 columns from `col0`, Q8_0, AVX2; `prefetch`: request
/// the chunks ahead (the first of several passes over one tile).
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn q8_0_avx2<const G: usize>(
    tile: *const u8,
    cb: usize,
    kbs: usize,
    col0: usize,
    x: *const f32,
    out: *mut f32,
    prefetch: bool,
) {
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

#[cfg(test)]
mod tests {
    use crate::kernels::test_weights::{random_q4_1, random_q8_0};
    use crate::kernels::{Isa, PackedMatrix, ThreadPool};

    /// Every row count, through the fused kernels (1 row; 2..=8 rows on
    /// AVX-512) and past them (the scratch path), equals the sequential-FMA reference bit for bit, for
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
            let m = 9;
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
