//! The element types of K and V in the pool, as the attention kernels read
//! them: f32 as is, IEEE half and bfloat16 widened to f32 on load.
//!
//! Widening is exact (every half and every bfloat16 is an f32), so a kernel
//! generic over [`KvElem`] does the same f32 operations on the same values
//! whatever the ISA: `vcvtph2ps` (F16C, AVX-512) and the bfloat16 shift give
//! the scalar [`KvElem::widen`]'s bits. The kernels are monomorphized per
//! dtype; [`super::attend_group`] picks one from the geometry's dtype.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use kvfabric_types::DType;

use crate::kernels::convert::{bf16_to_f32, f16_to_f32};

/// One stored K or V value.
pub(crate) trait KvElem: Copy + 'static {
    /// The pool's dtype this element is.
    const DTYPE: DType;

    /// The value as f32 (exact).
    fn widen(self) -> f32;

    /// 8 values from `p` widened (needs AVX2 + F16C in the caller).
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> __m256;

    /// 16 values from `p` widened (needs AVX-512F in the caller).
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> __m512;
}

/// An IEEE binary16 value (little-endian bits).
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub(crate) struct F16(pub u16);

/// A bfloat16 value (little-endian bits: the high half of an f32).
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub(crate) struct Bf16(pub u16);

impl KvElem for f32 {
    const DTYPE: DType = DType::F32;

    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
}

impl KvElem for F16 {
    const DTYPE: DType = DType::F16;

    #[inline(always)]
    fn widen(self) -> f32 {
        f16_to_f32(u16::from_le(self.0))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const F16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const F16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
}

impl KvElem for Bf16 {
    const DTYPE: DType = DType::BF16;

    #[inline(always)]
    fn widen(self) -> f32 {
        bf16_to_f32(u16::from_le(self.0))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Bf16) -> __m256 {
        let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Bf16) -> __m512 {
        let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h))
    }
}

/// Rows of `E` values for the f32 SIMD kernels: f32 rows are read in place,
/// others are widened once into `buf` (row `i` at `i * len`) so that a row
/// read by many queries is converted once.
///
/// # Safety
/// `src` must hold `len` values; `buf` must hold `(i + 1) * len` floats; AVX2 + F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn stage_row<E: KvElem>(
    src: *const E,
    buf: *mut f32,
    i: usize,
    len: usize,
) -> *const f32 {
    if E::DTYPE == DType::F32 {
        return src as *const f32;
    }
    let dst = buf.add(i * len);
    for c in (0..len).step_by(8) {
        _mm256_storeu_ps(dst.add(c), E::load8(src.add(c)));
    }
    dst
}
