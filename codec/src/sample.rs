//! A synthetic KV-like block: normal values with a per-channel scale over
//! 64 channels (as K and V are), as f16 or f32. Not real KV: a stand-in
//! with similar byte-plane statistics, for calibrating codec throughput at
//! run time (the transfer engine's wire-compression chooser) and for
//! benches that have no engine blocks at hand.

/// xorshift64*: deterministic, dependency-free (also the codec tests' data).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(crate) fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub(crate) fn normal(&mut self) -> f32 {
        let (u, v) = (self.unit(), self.unit());
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
}

/// `x` as IEEE binary16 bits, rounded to nearest even; values below the
/// normal range flush to signed zero, above it saturate to infinity
/// (a sample needs neither).
fn f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let man = b & 0x7f_ffff;
    if exp >= 31 {
        return sign | 0x7c00;
    }
    if exp <= 0 {
        return sign;
    }
    let mut h = ((exp as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
        h += 1;
    }
    sign | h as u16
}

/// `bytes` bytes (rounded down to whole elements) of KV-like values of
/// `width` bytes each: 2 gives f16, anything else f32.
pub fn kv_like(width: usize, bytes: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    let scales: Vec<f32> = (0..64).map(|_| 0.05 + 4.0 * r.unit() as f32).collect();
    let n = bytes / if width == 2 { 2 } else { 4 };
    let mut out = Vec::with_capacity(bytes);
    for i in 0..n {
        let v = r.normal() * scales[i % 64];
        if width == 2 {
            out.extend_from_slice(&f16_bits(v).to_le_bytes());
        } else {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rounding_matches_known_values() {
        assert_eq!(f16_bits(1.0), 0x3c00);
        assert_eq!(f16_bits(-2.0), 0xc000);
        assert_eq!(f16_bits(0.5), 0x3800);
        // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even (1) wins.
        assert_eq!(f16_bits(1.0 + 1.0 / 2048.0), 0x3c00);
        // 1 + 3 * 2^-11 ties up to the even 1 + 2^-9.
        assert_eq!(f16_bits(1.0 + 3.0 / 2048.0), 0x3c02);
        assert_eq!(f16_bits(1e-9), 0);
        assert_eq!(f16_bits(1e9), 0x7c00);
    }

    #[test]
    fn samples_are_deterministic_sized_and_compress() {
        for width in [2, 4] {
            let a = kv_like(width, 1 << 16, 7);
            assert_eq!(a.len(), 1 << 16);
            assert_eq!(a, kv_like(width, 1 << 16, 7));
            assert_ne!(a, kv_like(width, 1 << 16, 8));
            let mut enc = Vec::new();
            crate::encode(&a, width, &mut enc).unwrap();
            assert!(enc.len() < a.len(), "width {width}: {}", enc.len());
        }
    }
}
