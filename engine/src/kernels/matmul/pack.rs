//! Repacking GGUF tensors into the tiled layout of [`super::layout`]: reads
//! each source row's k-blocks and hands every column to its format's
//! `pack_column`.

use super::layout::{PackedFormat, CHUNK_K, TILE_N};
use super::{dense, q4_1, q8_0};
use crate::gguf::{GgmlType, TensorInfo};
use crate::kernels::convert::f16_to_f32;
use crate::EngineError;

/// A packed matrix's parts: `n` columns of `k`, in `format`.
pub(crate) struct Packed {
    pub k: usize,
    pub n: usize,
    pub format: PackedFormat,
    pub data: Vec<u8>,
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

/// Pack the rows of `parts` (concatenated along N) — e.g. q, k and v into one matrix.
/// All parts must have the same K and the same ggml type (Q4_1, Q8_0, F32 or F16).
pub(crate) fn pack(parts: &[(&TensorInfo, &[u8])]) -> Result<Packed, EngineError> {
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
                    PackedFormat::Q4_1 => q4_1::pack_column(chunk, c, &q, d, m),
                    PackedFormat::Q8_0 => q8_0::pack_column(chunk, c, &q, d),
                    PackedFormat::F32 => dense::pack_column(chunk, c, &f),
                }
            }
        }
    }
    Ok(Packed { k, n, format, data })
}
