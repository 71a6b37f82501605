//! Picking a fused kernel (dequantize in registers, accumulate at once) by
//! ISA, format and column or row count; the kernels are the formats' own
//! (`q4_1::avx512`, ...). Each vector of weights is dequantized to exactly
//! the reference's f32 value and consumed by one FMA straight away; each
//! output is still accumulated from 0 with one FMA per k, k = 0..K in
//! order, so the bits equal the scratch path and the scalar reference for
//! every row count, tiling and thread split. The AVX-512 and AVX2 twins
//! differ only in how many columns one instruction covers (16 or 8).

use super::layout::{PackedFormat, TILE_N};
use super::{q4_1, q8_0};
use crate::kernels::isa::Isa;
use crate::kernels::prefetch::SideCursor;

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
    match (isa, format, cols) {
        (Isa::Avx512, PackedFormat::Q4_1, FusedCols::Whole) => {
            q4_1::avx512::cols::<4>(tile, kbs, col0, x, out)
        }
        (Isa::Avx512, PackedFormat::Q4_1, FusedCols::Half) => {
            q4_1::avx512::cols::<2>(tile, kbs, col0, x, out)
        }
        (Isa::Avx512, PackedFormat::Q8_0, FusedCols::Whole) => {
            q8_0::avx512::cols::<4>(tile, kbs, col0, x, out)
        }
        (Isa::Avx512, PackedFormat::Q8_0, FusedCols::Half) => {
            q8_0::avx512::cols::<2>(tile, kbs, col0, x, out)
        }
        // Passes of 16 (Q4_1) or 32 (Q8_0) columns: with more at once the compiler
        // runs out of the 16 AVX2 registers and spills inside the k loop (3x slower).
        // Every pass reads the same cache lines: only the first prefetches them.
        (_, PackedFormat::Q4_1, _) => {
            for c in (0..cols.count()).step_by(16) {
                q4_1::avx2::cols::<2>(tile, kbs, col0 + c, x, out.add(c), c == 0);
            }
        }
        (_, PackedFormat::Q8_0, _) => {
            for c in (0..cols.count()).step_by(32) {
                q8_0::avx2::cols::<4>(tile, kbs, col0 + c, x, out.add(c), c == 0);
            }
        }
        (_, PackedFormat::F32, _) => unreachable!("fused kernels take Q4_1 and Q8_0"),
    }
}

/// Rows of a small batch at once (2..=[`fused_rows_per_pass`] of `isa`):
/// half a tile (32 columns) of `rows` rows, or on AVX-512 a whole tile of
/// up to [`fused_whole_rows`] rows, each dequantized weight vector feeding
/// one FMA per row. `x` rows are `ldx` floats apart, `out` rows `ldo`.
///
/// (Why half tiles and these row counts: see [`super`].)
///
/// # Safety
/// As [`fused_cols`], with `x` holding `rows` rows and `out` `rows` rows of
/// 32 writable values. `side`: lines a later step will read, requested
/// evenly over the task's inner loop (AVX-512: a share per k step, AVX2: per
/// chunk; see [`crate::kernels::prefetch`]).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn fused_rows(
    isa: Isa,
    format: PackedFormat,
    tile: *const u8,
    kbs: usize,
    col0: usize,
    cols: FusedCols,
    x: *const f32,
    ldx: usize,
    rows: usize,
    out: *mut f32,
    ldo: usize,
    side: &mut SideCursor,
) {
    if isa == Isa::Avx512 {
        macro_rules! by_rows {
            ($format:ident, $g:literal: $($r:literal)*) => {
                match rows {
                    $($r => $format::avx512::rows::<$r, $g>(tile, kbs, col0, x, ldx, out, ldo, side),)*
                    _ => unreachable!("AVX-512 fused rows: {rows} rows of {} columns", 16 * $g),
                }
            };
        }
        match (format, cols) {
            (PackedFormat::Q4_1, FusedCols::Half) => by_rows!(q4_1, 2: 2 3 4 5 6 7 8),
            (PackedFormat::Q8_0, FusedCols::Half) => by_rows!(q8_0, 2: 2 3 4 5 6 7 8),
            (PackedFormat::Q4_1, FusedCols::Whole) => by_rows!(q4_1, 4: 2 3),
            (PackedFormat::Q8_0, FusedCols::Whole) => by_rows!(q8_0, 4: 2 3 4 5 6),
            (PackedFormat::F32, _) => unreachable!("fused kernels take Q4_1 and Q8_0"),
        }
        return;
    }
    debug_assert_eq!(cols, FusedCols::Half, "AVX2 fused rows take half tiles");
    // AVX2: the half tile in two passes of 16 columns (the sums of 16 columns
    // x up to 6 rows fill the registers); only the first requests the chunks
    // ahead, the second finds the half tile's chunks in L1 or L2. Two rows of
    // Q8_0 take all 32 columns at once (see `q8_0::avx2::two_rows`).
    macro_rules! by_rows {
        ($format:ident: $($r:literal)*) => {
            match rows {
                $($r => {
                    for c in [0, 16] {
                        $format::avx2::rows::<$r>(
                            tile, kbs, col0 + c, x, ldx, out.add(c), ldo, c == 0, side,
                        );
                    }
                })*
                _ => unreachable!("AVX2 fused rows take 2..=6 rows"),
            }
        };
    }
    match format {
        PackedFormat::Q4_1 => by_rows!(q4_1: 2 3 4 5 6),
        PackedFormat::Q8_0 if rows == 2 => {
            q8_0::avx2::two_rows(tile, kbs, col0, x, ldx, out, ldo, side)
        }
        PackedFormat::Q8_0 => by_rows!(q8_0: 3 4 5 6),
        PackedFormat::F32 => unreachable!("fused kernels take Q4_1 and Q8_0"),
    }
}

/// Most rows one [`fused_rows`] call takes on `isa`: as many as keep the
/// sums, the weights being made and a broadcast in registers (32 on
/// AVX-512, 16 on AVX2).
pub(crate) fn fused_rows_per_pass(isa: Isa) -> usize {
    match isa {
        Isa::Avx512 => 8,
        _ => 6,
    }
}

/// Most rows a whole-tile [`fused_rows`] call takes (0: none): as many as
/// keep 4 vectors of sums per row and the tile's scales in the 32 AVX-512
/// registers. A whole tile per task halves the x broadcasts per weight and
/// reads each cache line of the weights on one core only (a half tile's
/// task reads half of every line of its tile), so matrices with enough tiles
/// to share evenly between threads take it.
pub(crate) fn fused_whole_rows(isa: Isa, format: PackedFormat) -> usize {
    match (isa, format) {
        (Isa::Avx512, PackedFormat::Q4_1) => 3,
        (Isa::Avx512, PackedFormat::Q8_0) => 6,
        _ => 0,
    }
}

/// Most rows the small-batch fused path takes on `isa`, in passes of
/// [`fused_rows_per_pass`]: on AVX-512 two passes (a decoding sequence and a
/// 15-token draft); on AVX2 one, as a second pass dequantizes every weight
/// again and was no faster than the scratch path (see [`super`]).
pub(crate) fn fused_max_rows(isa: Isa) -> usize {
    match isa {
        Isa::Avx512 => 2 * fused_rows_per_pass(isa),
        _ => fused_rows_per_pass(isa),
    }
}
