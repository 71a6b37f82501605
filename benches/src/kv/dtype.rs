//! The half-precision blocks `bench kv` measures, made from the engine's f32
//! blocks: every element rounded once, to nearest with ties to even (what
//! the engine's f16 KV pool stores), keeping the block's element order.

/// f32 -> IEEE binary16 bits, round to nearest even; NaN stays NaN, overflow
/// goes to infinity, values below the f16 range to (signed) subnormals or zero.
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x007f_ffff;
    if exp == 0xff {
        let nan = if man != 0 { 0x0200 } else { 0 };
        return sign | 0x7c00 | nan;
    }
    // Unbiased exponent, rebiased for f16 (bias 15).
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // Subnormal f16 (or zero): shift the full significand into place.
        if e < -10 {
            return sign;
        }
        let m = man | 0x0080_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1u32 << shift) - 1);
        let mut v = m >> shift;
        if rest > half || (rest == half && v & 1 == 1) {
            v += 1;
        }
        return sign | v as u16;
    }
    let mut v = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && v & 1 == 1) {
        // A carry into the exponent is the correct rounding (up to infinity).
        v += 1;
    }
    sign | v as u16
}

/// f32 -> bfloat16 bits, round to nearest even; NaN stays a (quiet) NaN.
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x0040;
    }
    let lsb = (b >> 16) & 1;
    ((b.wrapping_add(0x7fff + lsb)) >> 16) as u16
}

/// A little-endian f32 block rounded element by element with `round`.
pub fn narrow(block: &[u8], round: fn(f32) -> u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(block.len() / 2);
    for c in block.chunks_exact(4) {
        let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        out.extend_from_slice(&round(x).to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rounding_matches_ieee() {
        let cases: &[(f32, u16)] = &[
            (0.0, 0x0000),
            (-0.0, 0x8000),
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (65504.0, 0x7bff),
            (65520.0, 0x7c00), // halfway to the next: rounds to even (infinity)
            (1e10, 0x7c00),
            (5.960_464_5e-8, 0x0001), // smallest subnormal
            (2.980_232_2e-8, 0x0000), // half of it: ties to even (zero)
            (6.103_515_6e-5, 0x0400), // smallest normal
            (f32::INFINITY, 0x7c00),
            // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1).
            (1.000_488_3, 0x3c00),
            // 1 + 3 * 2^-11 is halfway between odd and even: up to even.
            (1.001_464_8, 0x3c02),
            (0.1, 0x2e66),
        ];
        for &(x, want) in cases {
            assert_eq!(f32_to_f16_bits(x), want, "{x:e}");
        }
        assert_eq!(f32_to_f16_bits(f32::NAN) & 0x7c00, 0x7c00);
        assert_ne!(f32_to_f16_bits(f32::NAN) & 0x03ff, 0);
    }

    #[test]
    fn bf16_rounding_matches_ieee() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
        assert_eq!(f32_to_bf16_bits(-2.0), 0xc000);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert!(f32_to_bf16_bits(f32::NAN) & 0x7f != 0);
        let n = narrow(&[0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0], f32_to_bf16_bits);
        assert_eq!(n, vec![0x80, 0x3f, 0x00, 0xc0]);
    }
}
