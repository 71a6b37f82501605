//! Q8_0 on AVX2: dequantization into the scratch, and the fused kernels
//! that dequantize in registers and accumulate at once ([`cols`]: one row,
//! [`rows`]: a small batch). 8 columns per instruction. [`rows`] runs its
//! inner loop as inline assembly, as Q4_1's does (see `q4_1::avx2`).

// Register tiles are indexed explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

use std::arch::asm;
use std::arch::x86_64::*;

use crate::kernels::matmul::layout::{CHUNK_K, Q8_0_CHUNK_BYTES, TILE_N};
use crate::kernels::prefetch::{prefetch_ahead, SideCursor};

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

/// One chunk's 32 k for the listed rows (sums `$a0`, `$a1` of row `$r`,
/// whose x values are at `$at`), 16 columns: per k the weights `q * d` of
/// columns 0..8 (`{t}`) and 8..16 (`{w1}`), `d` read from `{dp}`, then one
/// FMA per row and column vector, so every sum takes its FMAs in k order.
macro_rules! chunk_rows {
    ($q:expr, $x:expr, $x3:expr, $l:expr, $dp:expr, $acc:ident;
     $(($a0:ident $a1:ident $r:literal $at:literal))*) => {
        asm!(
            "mov {n:e}, 32",
            "2:",
            "vpmovsxbd {t}, qword ptr [{q}]",
            "vcvtdq2ps {t}, {t}",
            "vmulps {t}, {t}, [{dp}]",
            "vpmovsxbd {w1}, qword ptr [{q} + 8]",
            "vcvtdq2ps {w1}, {w1}",
            "vmulps {w1}, {w1}, [{dp} + 32]",
            $(
                concat!("vbroadcastss {xb}, dword ptr ", $at),
                concat!("vfmadd231ps {", stringify!($a0), "}, {t}, {xb}"),
                concat!("vfmadd231ps {", stringify!($a1), "}, {w1}, {xb}"),
            )*
            "add {q}, 64",
            "add {x}, 4",
            "add {x3}, 4",
            "dec {n:e}",
            "jnz 2b",
            n = out(reg) _,
            q = inout(reg) $q => _,
            x = inout(reg) $x => _,
            x3 = inout(reg) $x3 => _,
            l = in(reg) $l,
            dp = in(reg) $dp,
            t = out(ymm_reg) _,
            w1 = out(ymm_reg) _,
            xb = out(ymm_reg) _,
            $($a0 = inout(ymm_reg) $acc[$r][0], $a1 = inout(ymm_reg) $acc[$r][1],)*
            options(nostack, readonly),
        )
    };
}

/// 16 columns from `col0`, `R` rows (3..=6), Q8_0, AVX2. `x` rows are `ldx`
/// floats apart, `out` rows `ldo`; `prefetch`: request the chunks ahead (the
/// first of several passes over one tile); `side`: lines a later step will
/// read, requested a share per chunk. Registers: 2R sums, the two weight
/// vectors and a broadcast x; the scales are read from memory.
///
/// # Safety
/// AVX2, F16C and FMA; `tile` points to `kbs` Q8_0 chunks, `col0 + 16 <= 64`,
/// `x` holds `R` rows of `32 * kbs` values, `out` `R` rows of 16.
#[target_feature(enable = "avx2,f16c,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows<const R: usize>(
    tile: *const u8,
    kbs: usize,
    col0: usize,
    x: *const f32,
    ldx: usize,
    out: *mut f32,
    ldo: usize,
    prefetch: bool,
    side: &mut SideCursor,
) {
    let cb = Q8_0_CHUNK_BYTES;
    let side_per_chunk = side.left().div_ceil(kbs);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let l = 4 * ldx;
    for kb in 0..kbs {
        let c = tile.add(kb * cb);
        if prefetch {
            prefetch_ahead(c, cb);
        }
        side.issue(side_per_chunk);
        let scale = |at: usize| _mm256_cvtph_ps(_mm_loadu_si128(c.add(at) as *const __m128i));
        let d = [scale(2 * col0), scale(2 * col0 + 16)];
        let (q, xk, dp) = (c.add(2 * TILE_N + col0), x.add(kb * CHUNK_K), d.as_ptr());
        // Row 3 (and 5, as x3 + 2l): x86 addresses scale an index by 1, 2, 4 or 8.
        let x3 = xk.wrapping_add(3 * ldx);
        // SAFETY (the assembly): it reads the 32 k of quants of columns col0..col0
        // + 16 of this chunk, R rows of 32 x values from xk (rows 3 and 5 through
        // x3, which is only read when R > 3), and `d`; it writes only the
        // registers it names.
        match R {
            3 => chunk_rows!(q, xk, x3, l, dp, acc;
                (a0 a1 0 "[{x}]") (a2 a3 1 "[{x} + {l}]") (a4 a5 2 "[{x} + 2*{l}]")),
            4 => chunk_rows!(q, xk, x3, l, dp, acc;
                (a0 a1 0 "[{x}]") (a2 a3 1 "[{x} + {l}]") (a4 a5 2 "[{x} + 2*{l}]")
                (a6 a7 3 "[{x3}]")),
            5 => chunk_rows!(q, xk, x3, l, dp, acc;
                (a0 a1 0 "[{x}]") (a2 a3 1 "[{x} + {l}]") (a4 a5 2 "[{x} + 2*{l}]")
                (a6 a7 3 "[{x3}]") (a8 a9 4 "[{x} + 4*{l}]")),
            6 => chunk_rows!(q, xk, x3, l, dp, acc;
                (a0 a1 0 "[{x}]") (a2 a3 1 "[{x} + {l}]") (a4 a5 2 "[{x} + 2*{l}]")
                (a6 a7 3 "[{x3}]") (a8 a9 4 "[{x} + 4*{l}]") (a10 a11 5 "[{x3} + 2*{l}]")),
            _ => unreachable!("Q8_0 AVX2 rows take 3..=6 rows"),
        }
    }
    for r in 0..R {
        for g in 0..2 {
            _mm256_storeu_ps(out.add(r * ldo + 8 * g), acc[r][g]);
        }
    }
}

/// 32 columns from `col0`, 2 rows, Q8_0, AVX2: as [`rows`], but with 16
/// columns 2 rows leave the FMA units waiting on the sums' latency (4 sums,
/// one FMA each per k), so this takes the half tile at once (8 sums).
///
/// # Safety
/// As [`rows`], with `col0 + 32 <= 64` and `out` 2 rows of 32.
#[target_feature(enable = "avx2,f16c,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn two_rows(
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
    let side_per_chunk = side.left().div_ceil(kbs);
    let mut acc = [[_mm256_setzero_ps(); 4]; 2];
    for kb in 0..kbs {
        let c = tile.add(kb * cb);
        prefetch_ahead(c, cb);
        side.issue(side_per_chunk);
        let d: [__m256; 4] = std::array::from_fn(|g| {
            _mm256_cvtph_ps(_mm_loadu_si128(c.add(2 * col0 + 16 * g) as *const __m128i))
        });
        // SAFETY: reads the 32 k of quants of columns col0..col0 + 32 of this
        // chunk, 2 rows of 32 x values and `d`; writes only the named registers.
        asm!(
            "mov {n:e}, 32",
            "2:",
            "vpmovsxbd {w0}, qword ptr [{q}]",
            "vcvtdq2ps {w0}, {w0}",
            "vmulps {w0}, {w0}, [{dp}]",
            "vpmovsxbd {w1}, qword ptr [{q} + 8]",
            "vcvtdq2ps {w1}, {w1}",
            "vmulps {w1}, {w1}, [{dp} + 32]",
            "vpmovsxbd {w2}, qword ptr [{q} + 16]",
            "vcvtdq2ps {w2}, {w2}",
            "vmulps {w2}, {w2}, [{dp} + 64]",
            "vpmovsxbd {w3}, qword ptr [{q} + 24]",
            "vcvtdq2ps {w3}, {w3}",
            "vmulps {w3}, {w3}, [{dp} + 96]",
            "vbroadcastss {xb}, dword ptr [{x}]",
            "vfmadd231ps {a0}, {w0}, {xb}",
            "vfmadd231ps {a1}, {w1}, {xb}",
            "vfmadd231ps {a2}, {w2}, {xb}",
            "vfmadd231ps {a3}, {w3}, {xb}",
            "vbroadcastss {xb}, dword ptr [{x} + {l}]",
            "vfmadd231ps {a4}, {w0}, {xb}",
            "vfmadd231ps {a5}, {w1}, {xb}",
            "vfmadd231ps {a6}, {w2}, {xb}",
            "vfmadd231ps {a7}, {w3}, {xb}",
            "add {q}, 64",
            "add {x}, 4",
            "dec {n:e}",
            "jnz 2b",
            n = out(reg) _,
            q = inout(reg) c.add(2 * TILE_N + col0) => _,
            x = inout(reg) x.add(kb * CHUNK_K) => _,
            l = in(reg) 4 * ldx,
            dp = in(reg) d.as_ptr(),
            w0 = out(ymm_reg) _,
            w1 = out(ymm_reg) _,
            w2 = out(ymm_reg) _,
            w3 = out(ymm_reg) _,
            xb = out(ymm_reg) _,
            a0 = inout(ymm_reg) acc[0][0],
            a1 = inout(ymm_reg) acc[0][1],
            a2 = inout(ymm_reg) acc[0][2],
            a3 = inout(ymm_reg) acc[0][3],
            a4 = inout(ymm_reg) acc[1][0],
            a5 = inout(ymm_reg) acc[1][1],
            a6 = inout(ymm_reg) acc[1][2],
            a7 = inout(ymm_reg) acc[1][3],
            options(nostack, readonly),
        );
    }
    for r in 0..2 {
        for g in 0..4 {
            _mm256_storeu_ps(out.add(r * ldo + 8 * g), acc[r][g]);
        }
    }
}
