//! Weight-only-quantized matmul `out[M][N] = x[M][K] · W[N][K]ᵀ`, batch-invariant.
//!
//! Weights are repacked at load into tiles of 64 output columns; inside a tile
//! each 32-wide k-block is one chunk whose layout puts the 64 columns of one k
//! next to each other, so a k-step loads a vector of columns. Q4_1 and Q8_0
//! stay packed (4 and 8 bits per weight, f16 scales); a chunk is dequantized
//! to exactly the reference's f32 value into an L1-resident f32 scratch and
//! consumed by every row of the batch. The reference computes Q4_1 as
//! `q*d + m` (two roundings); the SIMD paths use one `fma(q, d, m)`, which is
//! the same value: `q` has at most 4 significant bits and `d` (an f16) 11, so
//! `q*d` is exact in f32 and rounding it first changes nothing (the kernels
//! module's test `fma_dequant_equals_multiply_then_add` checks every finite
//! f16 `d`). Each output is accumulated with one FMA per k, k = 0..K in
//! order, starting from 0 — independent of M, of the row grouping and of
//! the thread split. A single row (decode) and a small batch skip the
//! scratch: the fused kernels dequantize in registers with the same
//! operations and the same k order, so the bits are the same.
//!
//! For one row the scratch costs more than it saves (every weight is stored
//! to and reloaded from L1 for one FMA). A small batch takes half tiles (32
//! columns: the 9-tile matrices split evenly between 2 threads) with every
//! row's sums in registers. On AVX-512 (Emerald Rapids), where a batch-8
//! decode step through the scratch path stored and reloaded every weight
//! once per tile, 2..=8 rows take 8 rows x 2 vectors of sums (16 of 32
//! registers), and up to 16 rows (a sequence verifying a speculative draft)
//! two passes of about half the rows each over the same half tile, its
//! chunks still in L1 for the second (on the reference model the scratch
//! path cost about 0.9 ms per row past 8 against 0.55 ms per fused row,
//! docs/BENCHMARKS.md, speculative decoding; the two passes' own gain is not yet measured on
//! a quiet machine: `bench spec`'s `verify_cost`). On AVX2 (Zen 3, 16
//! registers) 2..=6 rows take passes of 16 columns x up to 6 rows (2 rows
//! of Q8_0: 32 columns), the inner loop in inline assembly (with intrinsics
//! LLVM spilled sums: see `q4_1::avx2`). Measured on a Zen 3 with
//! `perf_matmul_rows` (one forward's matmuls of the reference model, hot in
//! cache), they cost 0.75-0.87 of the scratch path's time at 2..=6 rows (1 +
//! 4 rows: 1.84-1.88 single-row passes against 2.23-2.29 on 2 threads,
//! 1.91-2.09 against 2.54-2.77 on one); in a whole verify pass of the
//! reference model (`perf_verify_rows`, 2 threads) 1 + 4 rows went from
//! 1.70-1.87 single-row passes (median 1.82) to 1.55-1.73 (1.58), while
//! 2..=3 rows, bound by reading the weights, did not measurably change. Past 6 rows a second pass
//! dequantizes every weight again, and 7..=16 rows in two passes cost
//! 0.96-1.19 of the scratch path's, so they keep it. On AVX-512 a matrix
//! with tiles enough to share evenly (16 or more: the lm_head, gate_up)
//! takes whole tiles when that needs no more passes: 2..=3 rows of Q4_1,
//! 2..=6 and 9..=12 (two passes) of Q8_0, 4 vectors of sums per row. A half
//! tile's task reads half of every cache line of its tile (the 64 columns
//! of one k share lines), so two cores pulled each line; with whole tiles
//! the lm_head at 2 rows went from 1.6-1.7 to 1.35-1.4 single-row times on
//! a Zen 4 (`perf_matmul_rows`, 2 threads), and one forward's matmuls at 2
//! rows from 1.44 to 1.23-1.30. Q4_1 stops at 3 rows: at 4, LLVM kept the
//! sums on the stack.
//!
//! The code is grouped by format, then ISA (as candle's quantized kernels
//! are): [`layout`] (the tile layout, a leaf), `pack` (GGUF to tiles),
//! `q4_1` and `q8_0` (scalar reference, `avx2`, `avx512`: dequantization and
//! fused kernels), `dense` (F32, and the micro kernel every format
//! accumulates with). This module owns [`PackedMatrix`] and picks a kernel
//! by format, ISA and row count; the kernels import only [`layout`], so no
//! two files import each other.

pub mod layout;
mod pack;

#[cfg(target_arch = "x86_64")]
mod fused;

mod dense;
mod q4_1;
mod q8_0;

pub use layout::{PackedFormat, CHUNK_K, TILE_N};

use crate::gguf::TensorInfo;
use crate::kernels::isa::Isa;
use crate::kernels::pool::ThreadPool;
use crate::kernels::prefetch::SideLines;
use crate::EngineError;
#[cfg(target_arch = "x86_64")]
use fused::{
    fused_cols, fused_max_rows, fused_rows, fused_rows_per_pass, fused_whole_rows, FusedCols,
};

/// Rows processed per dequantized chunk before moving on (cache blocking).
const ROW_BLOCK: usize = 96;

/// A weight matrix W[N][K] repacked for the kernels.
#[derive(Debug)]
pub struct PackedMatrix {
    k: usize,
    n: usize,
    format: PackedFormat,
    data: Vec<u8>,
}

impl PackedMatrix {
    /// Pack the rows of `parts` (concatenated along N) — e.g. q, k and v into one matrix.
    /// All parts must have the same K and the same ggml type (Q4_1, Q8_0, F32 or F16).
    pub fn pack(parts: &[(&TensorInfo, &[u8])]) -> Result<PackedMatrix, EngineError> {
        let pack::Packed { k, n, format, data } = pack::pack(parts)?;
        Ok(PackedMatrix { k, n, format, data })
    }

    /// Input width K.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Output width N.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Packed bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Dequantize output row `row` of W (K values) — for embedding lookups and tests.
    /// Gives the same values as the matmul's dequantization.
    pub fn row(&self, row: usize, out: &mut [f32]) {
        let kbs = self.k / CHUNK_K;
        let (tile, c) = (row / TILE_N, row % TILE_N);
        for kb in 0..kbs {
            let ch = self.chunk(tile, kb);
            let o = &mut out[kb * CHUNK_K..(kb + 1) * CHUNK_K];
            match self.format {
                PackedFormat::Q4_1 => q4_1::dequant_column(ch, c, o),
                PackedFormat::Q8_0 => q8_0::dequant_column(ch, c, o),
                PackedFormat::F32 => dense::dequant_column(ch, c, o),
            }
        }
    }

    fn chunk(&self, tile: usize, kb: usize) -> &[u8] {
        let cb = self.format.chunk_bytes();
        &self.data[(tile * (self.k / CHUNK_K) + kb) * cb..][..cb]
    }

    /// `out[m][n] = sum_k x[m][k] * W[n][k]` for `m` rows; `out` is overwritten.
    pub fn matmul(&self, pool: &ThreadPool, isa: Isa, x: &[f32], m: usize, out: &mut [f32]) {
        self.matmul_prefetching(pool, isa, x, m, out, &SideLines::none())
    }

    /// Whether [`Self::matmul_prefetching`] requests side lines for `m` rows:
    /// on the small-batch fused path (2..=16 rows of a quantized matrix on
    /// AVX-512, 2..=6 on AVX2), where the matmul is compute-bound and a
    /// batch's next step memory-bound.
    pub fn takes_side_lines(&self, isa: Isa, m: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        return isa != Isa::Scalar
            && self.format != PackedFormat::F32
            && (2..=fused_max_rows(isa)).contains(&m);
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (isa, m);
            false
        }
    }

    /// [`Self::matmul`], requesting `side`'s lines into L2 as it goes when
    /// [`Self::takes_side_lines`] (otherwise `side` is ignored). The result
    /// is the same bits.
    pub fn matmul_prefetching(
        &self,
        pool: &ThreadPool,
        isa: Isa,
        x: &[f32],
        m: usize,
        out: &mut [f32],
        side: &SideLines,
    ) {
        assert_eq!(x.len(), m * self.k, "matmul input shape");
        assert_eq!(out.len(), m * self.n, "matmul output shape");
        let tiles = self.n / TILE_N;
        let out_ptr = SendPtr(out.as_mut_ptr());
        #[cfg(target_arch = "x86_64")]
        if isa != Isa::Scalar && self.format != PackedFormat::F32 && m == 1 {
            // Half-tile tasks when there are few tiles, so that threads get even shares.
            let cols = if tiles < 16 {
                FusedCols::Half
            } else {
                FusedCols::Whole
            };
            let per_tile = TILE_N / cols.count();
            pool.run(tiles * per_tile, &|task| {
                let (tile, col0) = (task / per_tile, (task % per_tile) * cols.count());
                let out_ptr = &out_ptr;
                // SAFETY: SIMD ISAs imply AVX2+F16C+FMA; each task writes only its own
                // columns of the row; shapes were checked above.
                unsafe {
                    fused_cols(
                        isa,
                        self.format,
                        self.chunk(tile, 0).as_ptr(),
                        self.k / CHUNK_K,
                        col0,
                        cols,
                        x.as_ptr(),
                        out_ptr.0.add(tile * TILE_N + col0),
                    )
                }
            });
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.takes_side_lines(isa, m) {
            // A small batch: weights dequantized in registers, every row at
            // once, or past the rows one pass takes in passes of near-equal
            // rows (a speculative step's verification rows): the task's
            // chunks are in L1 (or L2) for the later passes. Whole tiles
            // where they share evenly between threads and take no more
            // passes than half tiles would.
            let half_passes = m.div_ceil(fused_rows_per_pass(isa));
            let (cols, passes) = match fused_whole_rows(isa, self.format) {
                most if most > 0 && tiles >= 16 && m.div_ceil(most) <= half_passes => {
                    (FusedCols::Whole, m.div_ceil(most))
                }
                _ => (FusedCols::Half, half_passes),
            };
            let per_tile = TILE_N / cols.count();
            pool.run(tiles * per_tile, &|task| {
                let (tile, col0) = (task / per_tile, (task % per_tile) * cols.count());
                let out_ptr = &out_ptr;
                let mut side = side.share(task, tiles * per_tile);
                let mut r0 = 0;
                for pass in 0..passes {
                    let rows = (m - r0) / (passes - pass);
                    // SAFETY: SIMD ISAs are only chosen when the CPU has them; each
                    // task writes only its own columns of rows r0..r0 + rows, and
                    // 2 <= rows <= the pass's most (fused_rows_per_pass, or
                    // fused_whole_rows for whole tiles): m <= passes * most, at
                    // most 2 passes, and m >= 2 * passes when there are 2; shapes
                    // were checked.
                    unsafe {
                        fused_rows(
                            isa,
                            self.format,
                            self.chunk(tile, 0).as_ptr(),
                            self.k / CHUNK_K,
                            col0,
                            cols,
                            x.as_ptr().add(r0 * self.k),
                            self.k,
                            rows,
                            out_ptr.0.add(r0 * self.n + tile * TILE_N + col0),
                            self.n,
                            &mut side,
                        )
                    }
                    r0 += rows;
                }
            });
            return;
        }
        pool.run(tiles, &|tile| {
            let out_ptr = &out_ptr;
            // SAFETY: each task writes only its own 64 columns of every row.
            unsafe { self.tile(isa, tile, x, m, out_ptr.0) }
        });
    }

    /// [`Self::matmul`] through the scratch path whatever the row count: the
    /// tests and the perf probes compare it with the fused kernels.
    #[cfg(test)]
    pub(crate) fn matmul_scratch(
        &self,
        pool: &ThreadPool,
        isa: Isa,
        x: &[f32],
        m: usize,
        out: &mut [f32],
    ) {
        assert_eq!(x.len(), m * self.k, "matmul input shape");
        assert_eq!(out.len(), m * self.n, "matmul output shape");
        let out_ptr = SendPtr(out.as_mut_ptr());
        pool.run(self.n / TILE_N, &|tile| {
            let out_ptr = &out_ptr;
            // SAFETY: each task writes only its own 64 columns of every row.
            unsafe { self.tile(isa, tile, x, m, out_ptr.0) }
        });
    }

    /// One tile (64 columns) for all rows.
    unsafe fn tile(&self, isa: Isa, tile: usize, x: &[f32], m: usize, out: *mut f32) {
        let (k, n) = (self.k, self.n);
        let mut scratch = Scratch([0f32; CHUNK_K * TILE_N]);
        // The block's sums live in a contiguous buffer, not in `out`: rows of `out`
        // are N floats apart, often a multiple of 4 KiB, so they would all fall in
        // the same L1 sets and evict each other between k-chunks. Left uninitialized
        // (24 KiB per tile): only the block's own rows are zeroed, below.
        let mut acc = std::mem::MaybeUninit::<Acc>::uninit();
        let acc = acc.as_mut_ptr() as *mut f32;
        let mut r0 = 0;
        while r0 < m {
            let rows = (m - r0).min(ROW_BLOCK);
            std::ptr::write_bytes(acc, 0, rows * TILE_N);
            for kb in 0..k / CHUNK_K {
                let chunk = self.chunk(tile, kb);
                let w: *const f32 = if self.format == PackedFormat::F32 {
                    chunk.as_ptr() as *const f32
                } else {
                    dequant(isa, self.format, chunk, &mut scratch.0);
                    scratch.0.as_ptr()
                };
                let xk = x.as_ptr().add(r0 * k + kb * CHUNK_K);
                micro(isa, w, xk, k, acc, TILE_N, rows);
            }
            for r in 0..rows {
                let o = out.add((r0 + r) * n + tile * TILE_N);
                std::ptr::copy_nonoverlapping(acc.add(r * TILE_N), o, TILE_N);
            }
            r0 += rows;
        }
    }
}

#[repr(align(64))]
struct Scratch([f32; CHUNK_K * TILE_N]);

/// Room for a row block's output sums for one tile, `[rows][64]` (used
/// through a raw pointer, uninitialized until zeroed).
#[repr(align(64))]
#[allow(dead_code)]
struct Acc([f32; ROW_BLOCK * TILE_N]);

struct SendPtr(*mut f32);
// SAFETY: used only to hand disjoint output columns to pool tasks.
unsafe impl Sync for SendPtr {}

fn dequant(isa: Isa, format: PackedFormat, chunk: &[u8], out: &mut [f32; CHUNK_K * TILE_N]) {
    match (isa, format) {
        (_, PackedFormat::F32) => dense::dequant(chunk, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Isa::Avx512 is only chosen when the CPU has these features.
        (Isa::Avx512, PackedFormat::Q4_1) => unsafe { q4_1::avx512::dequant(chunk, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        (Isa::Avx512, PackedFormat::Q8_0) => unsafe { q8_0::avx512::dequant(chunk, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above for AVX2.
        (Isa::Avx2, PackedFormat::Q4_1) => unsafe { q4_1::avx2::dequant(chunk, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above for AVX2.
        (Isa::Avx2, PackedFormat::Q8_0) => unsafe { q8_0::avx2::dequant(chunk, out) },
        (_, PackedFormat::Q4_1) => q4_1::dequant(chunk, out),
        (_, PackedFormat::Q8_0) => q8_0::dequant(chunk, out),
    }
}

/// Accumulate 32 k-steps of `rows` rows into 64 output columns.
unsafe fn micro(
    isa: Isa,
    w: *const f32,
    x: *const f32,
    ldx: usize,
    o: *mut f32,
    ldo: usize,
    rows: usize,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => dense::avx512::micro(w, x, ldx, o, ldo, rows),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => dense::avx2::micro(w, x, ldx, o, ldo, rows),
        _ => dense::micro(w, x, ldx, o, ldo, rows),
    }
}

#[cfg(test)]
mod tests;
