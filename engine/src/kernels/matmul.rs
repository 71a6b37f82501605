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
//! the thread split. A single row (decode) skips the scratch:
//! [`super::fused`] dequantizes in registers with the same operations and
//! the same k order, so the bits are the same.

#[cfg(target_arch = "x86_64")]
use super::fused::{fused_cols, fused_rows_avx512, FusedCols, FUSED_ROWS};
use crate::gguf::{GgmlType, TensorInfo};
use crate::kernels::{f16_to_f32, Isa, SideLines, ThreadPool};
use crate::EngineError;

/// Output columns per tile.
pub const TILE_N: usize = 64;
/// k values per chunk (the ggml quantization block).
pub const CHUNK_K: usize = 32;
/// Rows processed per dequantized chunk before moving on (cache blocking).
const ROW_BLOCK: usize = 96;

/// Storage format of a packed matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackedFormat {
    Q4_1,
    Q8_0,
    F32,
}

impl PackedFormat {
    pub(crate) fn chunk_bytes(self) -> usize {
        match self {
            // d[64] f16, m[64] f16, 16 k-pairs x 64 bytes (low nibble = even k).
            PackedFormat::Q4_1 => 2 * TILE_N * 2 + 16 * TILE_N,
            // d[64] f16, 32 k x 64 i8.
            PackedFormat::Q8_0 => TILE_N * 2 + CHUNK_K * TILE_N,
            // 32 k x 64 f32.
            PackedFormat::F32 => CHUNK_K * TILE_N * 4,
        }
    }
}

/// A weight matrix W[N][K] repacked for the kernels.
#[derive(Debug)]
pub struct PackedMatrix {
    k: usize,
    n: usize,
    format: PackedFormat,
    data: Vec<u8>,
}

/// Source rows of one GGUF tensor: `n` rows of `k` elements.
struct Source<'a> {
    ty: GgmlType,
    bytes: &'a [u8],
    n: usize,
}

impl Source<'_> {
    /// Row `row`, k-block `kb`: (quants as i32 in k order, scale d, min m).
    fn block(&self, k: usize, row: usize, kb: usize) -> ([i32; 32], f32, f32, [f32; 32]) {
        let mut q = [0i32; 32];
        let mut f = [0f32; 32];
        match self.ty {
            GgmlType::Q4_1 => {
                let off = (row * (k / 32) + kb) * 20;
                let b = &self.bytes[off..off + 20];
                let d = u16::from_le_bytes([b[0], b[1]]);
                let m = u16::from_le_bytes([b[2], b[3]]);
                for j in 0..16 {
                    q[j] = (b[4 + j] & 0x0f) as i32;
                    q[j + 16] = (b[4 + j] >> 4) as i32;
                }
                (q, f16_to_f32(d), f16_to_f32(m), f)
            }
            GgmlType::Q8_0 => {
                let off = (row * (k / 32) + kb) * 34;
                let b = &self.bytes[off..off + 34];
                for j in 0..32 {
                    q[j] = b[2 + j] as i8 as i32;
                }
                (q, f16_to_f32(u16::from_le_bytes([b[0], b[1]])), 0.0, f)
            }
            GgmlType::F32 => {
                let off = (row * k + kb * 32) * 4;
                for (j, v) in f.iter_mut().enumerate() {
                    let p = off + 4 * j;
                    *v = f32::from_le_bytes([
                        self.bytes[p],
                        self.bytes[p + 1],
                        self.bytes[p + 2],
                        self.bytes[p + 3],
                    ]);
                }
                (q, 0.0, 0.0, f)
            }
            GgmlType::F16 => {
                let off = (row * k + kb * 32) * 2;
                for (j, v) in f.iter_mut().enumerate() {
                    let p = off + 2 * j;
                    *v = f16_to_f32(u16::from_le_bytes([self.bytes[p], self.bytes[p + 1]]));
                }
                (q, 0.0, 0.0, f)
            }
            _ => (q, 0.0, 0.0, f),
        }
    }
}

pub(super) fn f32_to_f16_exact(v: f32) -> u16 {
    // Only used to re-store scales that came from f16: exact round trip.
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0 && man == 0 {
        return sign;
    }
    if exp == 0xff {
        return sign | 0x7c00 | ((man >> 13) as u16);
    }
    let e = exp - 127 + 15;
    if e >= 1 {
        sign | ((e as u16) << 10) | ((man >> 13) as u16)
    } else {
        // Subnormal half.
        let full = man | 0x80_0000;
        let shift = 14 - e;
        sign | ((full >> shift) as u16)
    }
}

impl PackedMatrix {
    /// Pack the rows of `parts` (concatenated along N) — e.g. q, k and v into one matrix.
    /// All parts must have the same K and the same ggml type (Q4_1, Q8_0, F32 or F16).
    pub fn pack(parts: &[(&TensorInfo, &[u8])]) -> Result<PackedMatrix, EngineError> {
        let first = parts
            .first()
            .ok_or_else(|| EngineError::Model("nothing to pack".into()))?
            .0;
        let k = first.dims[0] as usize;
        let format = match first.ggml_type {
            GgmlType::Q4_1 => PackedFormat::Q4_1,
            GgmlType::Q8_0 => PackedFormat::Q8_0,
            GgmlType::F32 | GgmlType::F16 => PackedFormat::F32,
            t => {
                return Err(EngineError::Model(format!(
                    "tensor {}: unsupported weight type {t:?}",
                    first.name
                )))
            }
        };
        let mut sources = Vec::new();
        for (t, bytes) in parts {
            if t.dims.len() != 2 || t.dims[0] as usize != k || t.ggml_type != first.ggml_type {
                return Err(EngineError::Model(format!(
                    "tensor {} does not match {} (dims {:?}, type {:?})",
                    t.name, first.name, t.dims, t.ggml_type
                )));
            }
            sources.push(Source {
                ty: t.ggml_type,
                bytes,
                n: t.dims[1] as usize,
            });
        }
        let n: usize = sources.iter().map(|s| s.n).sum();
        if !k.is_multiple_of(CHUNK_K) || !n.is_multiple_of(TILE_N) {
            return Err(EngineError::Model(format!(
                "tensor {}: K={k} must be a multiple of {CHUNK_K} and N={n} of {TILE_N}",
                first.name
            )));
        }
        let rows: Vec<(&Source, usize)> = sources
            .iter()
            .flat_map(|s| (0..s.n).map(move |r| (s, r)))
            .collect();
        let kbs = k / CHUNK_K;
        let cb = format.chunk_bytes();
        let mut data = vec![0u8; (n / TILE_N) * kbs * cb];
        for tile in 0..n / TILE_N {
            for kb in 0..kbs {
                let chunk = &mut data[(tile * kbs + kb) * cb..][..cb];
                for c in 0..TILE_N {
                    let (src, row) = rows[tile * TILE_N + c];
                    let (q, d, m, f) = src.block(k, row, kb);
                    match format {
                        PackedFormat::Q4_1 => {
                            chunk[2 * c..2 * c + 2]
                                .copy_from_slice(&f32_to_f16_exact(d).to_le_bytes());
                            chunk[128 + 2 * c..130 + 2 * c]
                                .copy_from_slice(&f32_to_f16_exact(m).to_le_bytes());
                            for p in 0..16 {
                                chunk[256 + p * TILE_N + c] =
                                    (q[2 * p] as u8) | ((q[2 * p + 1] as u8) << 4);
                            }
                        }
                        PackedFormat::Q8_0 => {
                            chunk[2 * c..2 * c + 2]
                                .copy_from_slice(&f32_to_f16_exact(d).to_le_bytes());
                            for (j, qv) in q.iter().enumerate() {
                                chunk[128 + j * TILE_N + c] = *qv as i8 as u8;
                            }
                        }
                        PackedFormat::F32 => {
                            for (j, v) in f.iter().enumerate() {
                                let p = (j * TILE_N + c) * 4;
                                chunk[p..p + 4].copy_from_slice(&v.to_le_bytes());
                            }
                        }
                    }
                }
            }
        }
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
            let h = |i: usize| f16_to_f32(u16::from_le_bytes([ch[2 * i], ch[2 * i + 1]]));
            let o = &mut out[kb * CHUNK_K..(kb + 1) * CHUNK_K];
            match self.format {
                PackedFormat::Q4_1 => {
                    let (d, mn) = (h(c), h(TILE_N + c));
                    for p in 0..16 {
                        let b = ch[256 + p * TILE_N + c];
                        o[2 * p] = ((b & 0x0f) as f32) * d + mn;
                        o[2 * p + 1] = ((b >> 4) as f32) * d + mn;
                    }
                }
                PackedFormat::Q8_0 => {
                    let d = h(c);
                    for (j, v) in o.iter_mut().enumerate() {
                        *v = (ch[128 + j * TILE_N + c] as i8 as f32) * d;
                    }
                }
                PackedFormat::F32 => {
                    for (j, v) in o.iter_mut().enumerate() {
                        let p = (j * TILE_N + c) * 4;
                        *v = f32::from_le_bytes([ch[p], ch[p + 1], ch[p + 2], ch[p + 3]]);
                    }
                }
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
    /// on the small-batch AVX-512 path (2..=8 rows of a quantized matrix),
    /// where the matmul is compute-bound and a batch's next step memory-bound.
    pub fn takes_side_lines(&self, isa: Isa, m: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        return isa == Isa::Avx512
            && self.format != PackedFormat::F32
            && (2..=FUSED_ROWS).contains(&m);
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
            // A small batch: half tiles, every row at once, weights dequantized in registers.
            let half = TILE_N / 2;
            pool.run(tiles * 2, &|task| {
                let (tile, col0) = (task / 2, (task % 2) * half);
                let out_ptr = &out_ptr;
                let mut side = side.share(task, tiles * 2);
                // SAFETY: Isa::Avx512 is only chosen when the CPU has it; each task
                // writes only its own 32 columns of every row; shapes were checked.
                unsafe {
                    fused_rows_avx512(
                        self.format,
                        self.chunk(tile, 0).as_ptr(),
                        self.k / CHUNK_K,
                        col0,
                        x.as_ptr(),
                        self.k,
                        m,
                        out_ptr.0.add(tile * TILE_N + col0),
                        self.n,
                        &mut side,
                    )
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
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Isa::Avx512 is only chosen when the CPU has these features.
        Isa::Avx512 => unsafe { super::simd::dequant_avx512(format, chunk, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above for AVX2.
        Isa::Avx2 => unsafe { super::simd::dequant_avx2(format, chunk, out) },
        _ => dequant_scalar(format, chunk, out),
    }
}

/// Reference dequantization of one chunk into `[32 k][64 columns]` f32.
pub(crate) fn dequant_scalar(format: PackedFormat, chunk: &[u8], out: &mut [f32]) {
    let h = |i: usize| f16_to_f32(u16::from_le_bytes([chunk[2 * i], chunk[2 * i + 1]]));
    match format {
        PackedFormat::Q4_1 => {
            for c in 0..TILE_N {
                let (d, mn) = (h(c), h(TILE_N + c));
                for p in 0..16 {
                    let b = chunk[256 + p * TILE_N + c];
                    out[2 * p * TILE_N + c] = ((b & 0x0f) as f32) * d + mn;
                    out[(2 * p + 1) * TILE_N + c] = ((b >> 4) as f32) * d + mn;
                }
            }
        }
        PackedFormat::Q8_0 => {
            for c in 0..TILE_N {
                let d = h(c);
                for j in 0..CHUNK_K {
                    out[j * TILE_N + c] = (chunk[128 + j * TILE_N + c] as i8 as f32) * d;
                }
            }
        }
        PackedFormat::F32 => {
            for (i, v) in out.iter_mut().enumerate() {
                *v = f32::from_le_bytes([
                    chunk[4 * i],
                    chunk[4 * i + 1],
                    chunk[4 * i + 2],
                    chunk[4 * i + 3],
                ]);
            }
        }
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
        Isa::Avx512 => super::simd::micro_avx512(w, x, ldx, o, ldo, rows),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => super::simd::micro_avx2(w, x, ldx, o, ldo, rows),
        _ => micro_scalar(w, x, ldx, o, ldo, rows),
    }
}

unsafe fn micro_scalar(
    w: *const f32,
    x: *const f32,
    ldx: usize,
    o: *mut f32,
    ldo: usize,
    rows: usize,
) {
    for r in 0..rows {
        for c in 0..TILE_N {
            let mut acc = *o.add(r * ldo + c);
            for k in 0..CHUNK_K {
                acc = (*w.add(k * TILE_N + c)).mul_add(*x.add(r * ldx + k), acc);
            }
            *o.add(r * ldo + c) = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_weights::random_q4_1;

    #[test]
    fn matmul_equals_sequential_fma_reference_on_every_isa_and_batch() {
        let (n, k) = (128, 96);
        let (info, bytes, deq) = random_q4_1(n, k, 7);
        let w = PackedMatrix::pack(&[(&info, &bytes)]).expect("pack");
        let mut row = vec![0f32; k];
        w.row(5, &mut row);
        assert_eq!(row, deq[5 * k..6 * k]);
        let m = 130;
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 31.0)
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
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            for isa in Isa::all_detected() {
                for rows in [1, 3, m] {
                    let mut out = vec![0f32; rows * n];
                    w.matmul(&pool, isa, &x[..rows * k], rows, &mut out);
                    assert!(
                        out.iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{isa:?} rows={rows} threads={threads}"
                    );
                }
            }
        }
    }

    #[test]
    fn pack_rejects_bad_shapes() {
        let (info, bytes, _) = random_q4_1(32, 64, 1);
        assert!(PackedMatrix::pack(&[(&info, &bytes)]).is_err());
        assert!(PackedMatrix::pack(&[]).is_err());
    }
}
