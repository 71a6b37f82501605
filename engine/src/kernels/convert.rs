//! Half-precision conversions: IEEE binary16 and bfloat16 to and from f32.
//!
//! The KV pool stores K and V as f16 or bf16 (`[engine] kv_dtype`): each
//! value is computed in f32 and rounded once, to nearest with ties to even,
//! by [`round_row`] when the forward pass writes it; attention widens it
//! back, which is exact. Rounding must give the same bits on every ISA
//! (a block written by one engine is read by another), so the scalar code
//! here is the reference and the F16C path ([`round_row`] on AVX2/AVX-512)
//! is tested against it: every f16 pattern, and a sweep over f32 patterns
//! with every rounding case. NaNs come out quiet with the payload's top
//! bits kept, as `vcvtps2ph` gives them.
//!
//! Written out rather than taken from the `half` crate: the scalar twin has
//! to match x86's NaN handling bit for bit, and the conversions are a few
//! lines each.

use kvfabric_types::DType;

use super::isa::Isa;

/// IEEE half -> f32 (exact; a NaN comes out quiet, as `vcvtph2ps` gives it).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // Subnormal: normalize.
            let mut e = 127 - 15 + 1;
            let mut m = man;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x3ff) << 13)
        }
    } else if exp == 0x1f {
        let quiet = if man != 0 { 0x40_0000 } else { 0 };
        sign | 0x7f80_0000 | quiet | (man << 13)
    } else {
        sign | ((exp + 127 - 15) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

/// `v >> s` rounded to nearest, ties to even (`1 <= s <= 31`).
#[inline(always)]
fn shift_rne(v: u32, s: u32) -> u32 {
    let q = v >> s;
    let rem = v & ((1 << s) - 1);
    let half = 1 << (s - 1);
    q + (rem > half || (rem == half && q & 1 == 1)) as u32
}

/// f32 -> IEEE half, to nearest with ties to even (as `vcvtps2ph` with
/// rounding mode 0): overflow gives infinity, NaN a quiet NaN.
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        let nan = if man != 0 {
            0x200 | (man >> 13) as u16
        } else {
            0
        };
        return sign | 0x7c00 | nan;
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // A half subnormal (or zero): units of 2^-24.
        let shift = (14 - e) as u32;
        if shift > 24 {
            return sign;
        }
        return sign | shift_rne(man | 0x80_0000, shift) as u16;
    }
    // A carry out of the mantissa moves the exponent up (to infinity at the top).
    sign | shift_rne(((e as u32) << 23) | man, 13) as u16
}

/// bfloat16 -> f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 -> bfloat16, to nearest with ties to even; NaN stays a quiet NaN.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// Store `src` at `dst` as `dtype` (little-endian), rounding each value once.
///
/// # Safety
/// `dst` must be valid for `src.len() * dtype.size()` bytes of writes, and
/// `isa` must be one this CPU runs.
pub unsafe fn round_row(isa: Isa, dtype: DType, src: &[f32], dst: *mut u8) {
    match dtype {
        DType::F32 => std::ptr::copy_nonoverlapping(src.as_ptr() as *const u8, dst, 4 * src.len()),
        #[cfg(target_arch = "x86_64")]
        DType::F16 if isa != Isa::Scalar => round_f16_f16c(src, dst as *mut u16),
        DType::F16 => {
            for (i, x) in src.iter().enumerate() {
                (dst as *mut u16)
                    .add(i)
                    .write_unaligned(f32_to_f16(*x).to_le());
            }
        }
        DType::BF16 => {
            for (i, x) in src.iter().enumerate() {
                (dst as *mut u16)
                    .add(i)
                    .write_unaligned(f32_to_bf16(*x).to_le());
            }
        }
    }
    let _ = isa;
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn round_f16_f16c(src: &[f32], dst: *mut u16) {
    use std::arch::x86_64::*;
    let mut chunks = src.chunks_exact(8);
    let mut d = dst;
    for c in &mut chunks {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(c.as_ptr()));
        _mm_storeu_si128(d as *mut __m128i, h);
        d = d.add(8);
    }
    for (i, x) in chunks.remainder().iter().enumerate() {
        d.add(i).write_unaligned(f32_to_f16(*x));
    }
}

/// f32 to f16 for values that came from f16 (packed scales): an exact round trip.
pub(crate) fn f32_to_f16_exact(v: f32) -> u16 {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// f32 patterns that hit every rounding case of both formats: a stride
    /// over all 2^32 patterns, plus ties, near-ties and the range edges.
    fn sweep() -> Vec<f32> {
        let mut v: Vec<u32> = (0..(1u64 << 32)).step_by(4093).map(|b| b as u32).collect();
        for e in [
            0u32, 1, 100, 101, 102, 103, 112, 113, 126, 127, 142, 143, 254, 255,
        ] {
            for m in [
                0u32, 1, 0xfff, 0x1000, 0x1001, 0x2000, 0x3000, 0x7fff, 0x8000, 0x8001,
            ] {
                for s in [0u32, 1 << 31] {
                    v.push(s | (e << 23) | m);
                    v.push(s | (e << 23) | (0x7f_ffff - m));
                }
            }
        }
        v.into_iter().map(f32::from_bits).collect()
    }

    fn reference_f16(x: f32) -> u16 {
        // Round through f64 arithmetic: the nearest half, ties to even.
        if x.is_nan() {
            return f32_to_f16(x);
        }
        let a = (x as f64).abs();
        let sign = if x.is_sign_negative() { 0x8000u16 } else { 0 };
        if a >= 65520.0 {
            return sign | 0x7c00;
        }
        // Halves are k * 2^(e-10) with e >= -14.
        let e = if a < 2f64.powi(-14) {
            -14
        } else {
            a.log2().floor() as i32
        };
        let unit = 2f64.powi(e - 10);
        let q = a / unit;
        let r = q.round_ties_even();
        let k = r as u32;
        let bits = if e == -14 {
            k
        } else if k == 2048 {
            ((e + 16) as u32) << 10
        } else {
            (((e + 15) as u32) << 10) | (k - 1024)
        };
        sign | bits as u16
    }

    #[test]
    fn f32_to_f16_rounds_to_nearest_even() {
        for x in sweep() {
            assert_eq!(
                f32_to_f16(x),
                reference_f16(x),
                "{x:e} ({:#010x})",
                x.to_bits()
            );
        }
        assert_eq!(
            f32_to_f16(1.0 + 2f32.powi(-11)),
            0x3c00,
            "tie to even, down"
        );
        assert_eq!(
            f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)),
            0x3c02,
            "tie to even, up"
        );
    }

    #[test]
    fn halves_widen_exactly_and_round_back() {
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h);
            if x.is_nan() {
                assert_eq!(f32_to_f16(x), h | 0x200, "{h:#06x}: quieted");
            } else {
                assert_eq!(f32_to_f16(x), h, "{h:#06x}");
            }
            assert_eq!(
                f32_to_bf16(bf16_to_f32(h)),
                if bf16_to_f32(h).is_nan() { h | 0x40 } else { h }
            );
        }
    }

    #[test]
    fn f32_to_bf16_rounds_to_nearest_even() {
        for x in sweep() {
            let got = f32_to_bf16(x);
            if x.is_nan() || x.is_infinite() {
                assert_eq!(
                    bf16_to_f32(got).to_bits() | 0x40_0000,
                    x.to_bits() & 0xffff_0000 | 0x40_0000
                );
                continue;
            }
            let xd = x as f64;
            if bf16_to_f32(got).is_infinite() && x.is_finite() {
                // Past the largest bf16 by half an ulp or more: rounds to 2^128.
                assert!(xd.abs() >= 2f64.powi(128) - 2f64.powi(127 - 8), "{x:e}");
                continue;
            }
            let w = bf16_to_f32(got) as f64;
            // No bf16 is nearer, and a tie goes to an even mantissa.
            for n in [got.wrapping_sub(1), got.wrapping_add(1)] {
                let o = bf16_to_f32(n) as f64;
                if o.is_nan() || (n ^ got) & 0x8000 != 0 {
                    continue;
                }
                let (dw, dn) = ((w - xd).abs(), (o - xd).abs());
                assert!(
                    dw < dn || (dw == dn && got & 1 == 0),
                    "{x:e}: {got:#06x} vs {n:#06x}"
                );
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn hardware_conversions_match_the_scalar_ones() {
        use std::arch::x86_64::*;
        if Isa::detect() == Isa::Scalar {
            return;
        }
        let xs = sweep();
        for isa in Isa::all_detected() {
            let mut got = vec![0u16; xs.len()];
            unsafe { round_row(isa, DType::F16, &xs, got.as_mut_ptr() as *mut u8) };
            for (x, g) in xs.iter().zip(&got) {
                assert_eq!(*g, f32_to_f16(*x), "{isa:?} {:#010x}", x.to_bits());
            }
        }
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn widen8(h: &[u16; 8]) -> [f32; 8] {
            let mut out = [0f32; 8];
            _mm256_storeu_ps(
                out.as_mut_ptr(),
                _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i)),
            );
            out
        }
        for h0 in (0..=u16::MAX).step_by(8) {
            let h: [u16; 8] = std::array::from_fn(|i| h0 + i as u16);
            let w = unsafe { widen8(&h) };
            for (hi, wi) in h.iter().zip(w) {
                assert_eq!(wi.to_bits(), f16_to_f32(*hi).to_bits(), "{hi:#06x}");
            }
        }
    }
}
