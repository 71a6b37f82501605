//! Random quantized weight matrices for the kernel tests and probes: GGUF
//! bytes plus the f32 values the reference dequantizes them to.

use super::convert::f32_to_f16_exact;
use super::f16_to_f32;
use crate::gguf::{GgmlType, TensorInfo};

/// A xorshift64 generator (test data only; `seed` must not be 0).
pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// The header of a [n][k] tensor of `len` bytes at offset 0.
fn info(name: &str, ggml_type: GgmlType, n: usize, k: usize, len: usize) -> TensorInfo {
    TensorInfo {
        name: name.into(),
        dims: vec![k as u64, n as u64],
        ggml_type,
        data_start: 0,
        data_len: len,
    }
}

/// A random Q4_1 tensor [n][k] as GGUF bytes, plus its f32 dequantization.
pub(crate) fn random_q4_1(n: usize, k: usize, seed: u64) -> (TensorInfo, Vec<u8>, Vec<f32>) {
    let mut rnd = xorshift(seed);
    let mut bytes = Vec::new();
    let mut deq = Vec::new();
    for _ in 0..n {
        for _ in 0..k / 32 {
            let d = f32_to_f16_exact(f16_to_f32(0x2000 + (rnd() % 0x800) as u16));
            let m = 0x8000 | (0x2000 + (rnd() % 0x800) as u16);
            bytes.extend_from_slice(&d.to_le_bytes());
            bytes.extend_from_slice(&m.to_le_bytes());
            let qs: Vec<u8> = (0..16).map(|_| rnd() as u8).collect();
            bytes.extend_from_slice(&qs);
            let (df, mf) = (f16_to_f32(d), f16_to_f32(m));
            let mut blk = [0f32; 32];
            for j in 0..16 {
                blk[j] = ((qs[j] & 15) as f32) * df + mf;
                blk[j + 16] = ((qs[j] >> 4) as f32) * df + mf;
            }
            deq.extend_from_slice(&blk);
        }
    }
    (info("w", GgmlType::Q4_1, n, k, bytes.len()), bytes, deq)
}

/// A random Q8_0 tensor [n][k] as GGUF bytes, plus its f32 dequantization.
pub(crate) fn random_q8_0(n: usize, k: usize, seed: u64) -> (TensorInfo, Vec<u8>, Vec<f32>) {
    let mut rnd = xorshift(seed);
    let mut bytes = Vec::new();
    let mut deq = Vec::new();
    for _ in 0..n {
        for _ in 0..k / 32 {
            let d = (0x2000 + (rnd() % 0x800) as u16) | (((rnd() & 1) as u16) << 15);
            bytes.extend_from_slice(&d.to_le_bytes());
            for _ in 0..32 {
                let q = rnd() as u8;
                bytes.push(q);
                deq.push((q as i8 as f32) * f16_to_f32(d));
            }
        }
    }
    (info("w8", GgmlType::Q8_0, n, k, bytes.len()), bytes, deq)
}
