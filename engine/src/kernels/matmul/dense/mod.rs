//! Dense weights (F32, and F16 widened to f32 at packing): a chunk is
//! `[32 k][64 columns]` f32, which is also what the quantized formats
//! dequantize to. So this module owns the accumulation every format ends
//! in, the micro kernel: 32 k-steps of a row block into 64 output columns,
//! one FMA per k in k order. This is the scalar reference; [`avx2`] and
//! [`avx512`] are its SIMD twins (the same FMAs, more lanes).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

use super::layout::{CHUNK_K, TILE_N};

/// Store column `c` of one k-block (32 values in k order).
pub(crate) fn pack_column(chunk: &mut [u8], c: usize, f: &[f32; 32]) {
    for (j, v) in f.iter().enumerate() {
        let p = (j * TILE_N + c) * 4;
        chunk[p..p + 4].copy_from_slice(&v.to_le_bytes());
    }
}

/// Column `c` of one chunk: its 32 weights in k order.
pub(crate) fn dequant_column(chunk: &[u8], c: usize, out: &mut [f32]) {
    for (j, v) in out.iter_mut().enumerate() {
        let p = (j * TILE_N + c) * 4;
        *v = f32::from_le_bytes([chunk[p], chunk[p + 1], chunk[p + 2], chunk[p + 3]]);
    }
}

/// One chunk as `[32 k][64 columns]` f32 (a copy: the kernels read dense
/// chunks in place).
pub(crate) fn dequant(chunk: &[u8], out: &mut [f32]) {
    for (i, v) in out.iter_mut().enumerate() {
        *v = f32::from_le_bytes([
            chunk[4 * i],
            chunk[4 * i + 1],
            chunk[4 * i + 2],
            chunk[4 * i + 3],
        ]);
    }
}

/// Accumulate 32 k-steps of `rows` rows into 64 output columns.
///
/// # Safety
/// `w` holds `[32][64]` f32; `x` `rows` rows `ldx` apart of 32 values;
/// `o` `rows` rows `ldo` apart of 64 writable values.
pub(crate) unsafe fn micro(
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
