//! Q4_1 on AVX2: dequantization into the scratch, and the fused kernels
//! that dequantize in registers and accumulate at once ([`cols`]: one row,
//! [`rows`]: a small batch). 8 columns per instruction.
//!
//! [`rows`] runs its inner loop as inline assembly: it needs 16 of the 16
//! registers (the sums, the two weight vectors being made, a broadcast, the
//! scales and the mask), and every arrangement of the same intrinsics tried
//! (docs/BENCHMARKS.md, "AVX2 verification rows dequantized in registers") had LLVM spill sums or re-order the loads so
//! that a 4-row pass cost 2.0-2.6 single-row passes where the same
//! instructions with fixed registers cost 1.6.

// Register tiles are indexed explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

use std::arch::asm;
use std::arch::x86_64::*;

use crate::kernels::matmul::layout::{CHUNK_K, Q4_1_CHUNK_BYTES, TILE_N};
use crate::kernels::prefetch::{prefetch_ahead, SideCursor};

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

/// Assembly: the weights of k = 2p (`lo`: low nibbles) or 2p + 1 (`hi`) of
/// 16 columns as f32, `{t}` columns 0..8 and `{w1}` 8..16, each one
/// `fma(q, d, m)`; the quants are read again for each nibble (a register
/// fewer). Three forms by where the scales live: `regs` (`{d0}`, `{d1}`,
/// `{m0}`, `{m1}`, `{mask}`), `m_mem` (`m` at `{dm} + 64`) and `mem` (all of
/// `{dm}`: d0, d1, m0, m1, mask; `d` loaded through `{xb}`, free here).
macro_rules! dequant {
    (regs, $nib:ident) => {
        concat!(
            nibbles!($nib, "{t}", "", "{mask}"),
            "vfmadd213ps {t}, {d0}, {m0}\n",
            nibbles!($nib, "{w1}", " + 8", "{mask}"),
            "vfmadd213ps {w1}, {d1}, {m1}\n",
        )
    };
    (m_mem, $nib:ident) => {
        concat!(
            nibbles!($nib, "{t}", "", "{mask}"),
            "vfmadd213ps {t}, {d0}, [{dm} + 64]\n",
            nibbles!($nib, "{w1}", " + 8", "{mask}"),
            "vfmadd213ps {w1}, {d1}, [{dm} + 96]\n",
        )
    };
    (mem, $nib:ident) => {
        concat!(
            nibbles!($nib, "{t}", "", "[{dm} + 128]"),
            "vmovups {xb}, [{dm}]\n",
            "vfmadd213ps {t}, {xb}, [{dm} + 64]\n",
            nibbles!($nib, "{w1}", " + 8", "[{dm} + 128]"),
            "vmovups {xb}, [{dm} + 32]\n",
            "vfmadd213ps {w1}, {xb}, [{dm} + 96]\n",
        )
    };
}

/// Assembly: one nibble of the 8 quants at `{q}` + `$off` as f32 in `$reg`.
macro_rules! nibbles {
    (lo, $reg:literal, $off:literal, $mask:literal) => {
        concat!(
            "vpmovzxbd ",
            $reg,
            ", qword ptr [{q}",
            $off,
            "]\n",
            "vpand ",
            $reg,
            ", ",
            $reg,
            ", ",
            $mask,
            "\n",
            "vcvtdq2ps ",
            $reg,
            ", ",
            $reg,
            "\n",
        )
    };
    (hi, $reg:literal, $off:literal, $mask:literal) => {
        concat!(
            "vpmovzxbd ",
            $reg,
            ", qword ptr [{q}",
            $off,
            "]\n",
            "vpsrld ",
            $reg,
            ", ",
            $reg,
            ", 4\n",
            "vcvtdq2ps ",
            $reg,
            ", ",
            $reg,
            "\n",
        )
    };
}

/// One chunk's 16 k-pairs for the listed rows (sums `$a0`, `$a1` of row
/// `$r`, whose x values are at `$lo` and `$hi`), 16 columns: per k-pair the
/// weights of k = 2p, then one FMA per row and column vector, then k = 2p +
/// 1 likewise, so every sum takes its FMAs in k order.
macro_rules! chunk_rows {
    ($mode:ident, [$($scales:tt)*], $q:expr, $x:expr, $x3:expr, $l:expr, $acc:ident;
     $(($a0:ident $a1:ident $r:literal $lo:literal $hi:literal))*) => {
        asm!(
            "mov {n:e}, 16",
            "2:",
            dequant!($mode, lo),
            $(
                concat!("vbroadcastss {xb}, dword ptr ", $lo),
                concat!("vfmadd231ps {", stringify!($a0), "}, {t}, {xb}"),
                concat!("vfmadd231ps {", stringify!($a1), "}, {w1}, {xb}"),
            )*
            dequant!($mode, hi),
            $(
                concat!("vbroadcastss {xb}, dword ptr ", $hi),
                concat!("vfmadd231ps {", stringify!($a0), "}, {t}, {xb}"),
                concat!("vfmadd231ps {", stringify!($a1), "}, {w1}, {xb}"),
            )*
            "add {q}, 64",
            "add {x}, 8",
            "add {x3}, 8",
            "dec {n:e}",
            "jnz 2b",
            n = out(reg) _,
            q = inout(reg) $q => _,
            x = inout(reg) $x => _,
            x3 = inout(reg) $x3 => _,
            l = in(reg) $l,
            $($scales)*
            t = out(ymm_reg) _,
            w1 = out(ymm_reg) _,
            xb = out(ymm_reg) _,
            $($a0 = inout(ymm_reg) $acc[$r][0], $a1 = inout(ymm_reg) $acc[$r][1],)*
            options(nostack, readonly),
        )
    };
}

/// 16 columns from `col0`, `R` rows (2..=6), Q4_1, AVX2. `x` rows are `ldx`
/// floats apart, `out` rows `ldo`; `prefetch`: request the chunks ahead (the
/// first of several passes over one tile); `side`: lines a later step will
/// read, requested a share per chunk.
///
/// Registers: 2R sums, the two weight vectors, a broadcast x, and the
/// scales and mask as far as they fit (all up to 4 rows, `m` in memory at 5,
/// all in memory at 6).
///
/// # Safety
/// AVX2, F16C and FMA; `tile` points to `kbs` Q4_1 chunks, `col0 + 16 <= 64`,
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
    let cb = Q4_1_CHUNK_BYTES;
    let low = _mm256_set1_epi32(0x0f);
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
        let (d, m) = (
            [scale(2 * col0), scale(2 * col0 + 16)],
            [
                scale(2 * TILE_N + 2 * col0),
                scale(2 * TILE_N + 2 * col0 + 16),
            ],
        );
        let dm = [d[0], d[1], m[0], m[1], _mm256_castsi256_ps(low)];
        let (q, xk) = (c.add(4 * TILE_N + col0), x.add(kb * CHUNK_K));
        // Row 3 (and 5, as x3 + 2l): x86 addresses scale an index by 1, 2, 4 or 8.
        let x3 = xk.wrapping_add(3 * ldx);
        let dmp = dm.as_ptr();
        // SAFETY (the assembly): it reads the 16 k-pairs of quants of columns
        // col0..col0 + 16 of this chunk, R rows of 32 x values from xk (rows 3
        // and 5 through x3, which is only read when R > 3), and `dm`; it writes
        // only the registers it names.
        match R {
            2 => {
                chunk_rows!(regs, [mask = in(ymm_reg) low, d0 = in(ymm_reg) d[0], d1 = in(ymm_reg) d[1],
                m0 = in(ymm_reg) m[0], m1 = in(ymm_reg) m[1],],
                q, xk, x3, l, acc;
                (a0 a1 0 "[{x}]" "[{x} + 4]") (a2 a3 1 "[{x} + {l}]" "[{x} + {l} + 4]"))
            }
            3 => {
                chunk_rows!(regs, [mask = in(ymm_reg) low, d0 = in(ymm_reg) d[0], d1 = in(ymm_reg) d[1],
                m0 = in(ymm_reg) m[0], m1 = in(ymm_reg) m[1],],
                q, xk, x3, l, acc;
                (a0 a1 0 "[{x}]" "[{x} + 4]") (a2 a3 1 "[{x} + {l}]" "[{x} + {l} + 4]")
                (a4 a5 2 "[{x} + 2*{l}]" "[{x} + 2*{l} + 4]"))
            }
            4 => {
                chunk_rows!(regs, [mask = in(ymm_reg) low, d0 = in(ymm_reg) d[0], d1 = in(ymm_reg) d[1],
                m0 = in(ymm_reg) m[0], m1 = in(ymm_reg) m[1],],
                q, xk, x3, l, acc;
                (a0 a1 0 "[{x}]" "[{x} + 4]") (a2 a3 1 "[{x} + {l}]" "[{x} + {l} + 4]")
                (a4 a5 2 "[{x} + 2*{l}]" "[{x} + 2*{l} + 4]") (a6 a7 3 "[{x3}]" "[{x3} + 4]"))
            }
            5 => {
                chunk_rows!(m_mem, [mask = in(ymm_reg) low, d0 = in(ymm_reg) d[0], d1 = in(ymm_reg) d[1],
                dm = in(reg) dmp,],
                q, xk, x3, l, acc;
                (a0 a1 0 "[{x}]" "[{x} + 4]") (a2 a3 1 "[{x} + {l}]" "[{x} + {l} + 4]")
                (a4 a5 2 "[{x} + 2*{l}]" "[{x} + 2*{l} + 4]") (a6 a7 3 "[{x3}]" "[{x3} + 4]")
                (a8 a9 4 "[{x} + 4*{l}]" "[{x} + 4*{l} + 4]"))
            }
            6 => chunk_rows!(mem, [dm = in(reg) dmp,],
                q, xk, x3, l, acc;
                (a0 a1 0 "[{x}]" "[{x} + 4]") (a2 a3 1 "[{x} + {l}]" "[{x} + {l} + 4]")
                (a4 a5 2 "[{x} + 2*{l}]" "[{x} + 2*{l} + 4]") (a6 a7 3 "[{x3}]" "[{x3} + 4]")
                (a8 a9 4 "[{x} + 4*{l}]" "[{x} + 4*{l} + 4]")
                (a10 a11 5 "[{x3} + 2*{l}]" "[{x3} + 2*{l} + 4]")),
            _ => unreachable!("Q4_1 AVX2 rows take 2..=6 rows"),
        }
    }
    for r in 0..R {
        for g in 0..2 {
            _mm256_storeu_ps(out.add(r * ldo + 8 * g), acc[r][g]);
        }
    }
}
