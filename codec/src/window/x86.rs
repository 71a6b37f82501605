//! The window decoder's x86 loops: 64 elements a step on AVX-512 (VBMI2's
//! expanding loads place the escape streams' values in their lanes), 32
//! on AVX2 (BMI2's `pdep` unpacks the fields; a table of byte shuffles
//! expands the escapes 8 lanes at a time). Both compute exactly what the
//! scalar decoder does; they stop where a vector step would not fit (the
//! row not a multiple of the step, the segment's tail, a cursor past its
//! count) and hand the rest to it.

use std::arch::x86_64::*;

use super::{Parsed, Scratch};

/// Decode what the vector loops can; returns (elements done, L2 cursor,
/// L3 cursor) for the scalar decoder to go on from.
pub fn decode(
    p: &Parsed,
    lo: &[u8],
    s: &Scratch,
    out: &mut [u8],
    ahead: &[u8],
) -> (usize, usize, usize) {
    if p.row.is_multiple_of(64) && has_avx512() {
        // SAFETY: the features are present; the loop's loads and stores
        // are bounded as its comments say.
        return unsafe { avx512(p, lo, s, out, ahead) };
    }
    if p.row.is_multiple_of(32) && has_avx2() {
        // SAFETY: as above.
        return unsafe { avx2(p, lo, s, out, ahead) };
    }
    (0, 0, 0)
}

fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vbmi")
        && is_x86_feature_detected!("avx512vbmi2")
        && is_x86_feature_detected!("popcnt")
}

fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("bmi2")
        && is_x86_feature_detected!("popcnt")
}

/// Byte indices of a 64-byte vector, as `_mm512_set_epi8` wants them
/// (highest first), from a function of the index.
fn bytes64(f: impl Fn(usize) -> u8) -> [i8; 64] {
    let mut b = [0i8; 64];
    for (i, v) in b.iter_mut().enumerate() {
        *v = f(i) as i8;
    }
    b
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vbmi2,popcnt")]
unsafe fn avx512(
    p: &Parsed,
    lo: &[u8],
    s: &Scratch,
    out: &mut [u8],
    ahead: &[u8],
) -> (usize, usize, usize) {
    let load = |b: [i8; 64]| _mm512_loadu_si512(b.as_ptr().cast());
    // Qword q of the gathered fields holds packed bytes 5q..5q+8; byte j of
    // each qword then takes the 8 bits at bit 5j.
    let gather = load(bytes64(|i| (5 * (i / 8) + i % 8).min(63) as u8));
    let shifts = load(bytes64(|i| (5 * (i % 8)) as u8));
    // Output bytes 2k, 2k+1 = lo[k], hi[k] (hi is the second table, +64).
    let il0 = load(bytes64(|i| (i / 2 + 64 * (i % 2)) as u8));
    let il1 = load(bytes64(|i| (32 + i / 2 + 64 * (i % 2)) as u8));
    // Field bits 4 (sign) and 0-1 (mantissa) in their high-byte places,
    // indexed by the low 6 bits (bit 5 is the next field's: duplicated).
    let sign_mantissa = load(bytes64(|x| (((x >> 4) & 1) as u8 * 0x80) | (x & 3) as u8));
    let (x0c, x12, x7c) = (
        _mm512_set1_epi8(0x0c),
        _mm512_set1_epi8(12),
        _mm512_set1_epi8(0x7c),
    );
    let (mut k1, mut k2) = (0usize, 0usize);
    let steps = lo.len() / 64;
    let (mut i, mut col) = (0, 0);
    for c in 0..steps {
        // Cursors at most n1, n2: the 64-byte loads of the escape streams
        // stay inside their PAD.
        if k1 > p.n1 || k2 > p.n2 {
            break;
        }
        // Two lines of what comes next (a hint: never faults).
        _mm_prefetch::<_MM_HINT_T0>(ahead.as_ptr().wrapping_add(c * 128).cast());
        _mm_prefetch::<_MM_HINT_T0>(ahead.as_ptr().wrapping_add(c * 128 + 64).cast());
        // 40 bytes at 40c: inside fields, which holds packed5_len(m).
        let packed = _mm512_maskz_loadu_epi8(0xff_ffff_ffff, p.fields.as_ptr().add(c * 40).cast());
        let f = _mm512_multishift_epi64_epi8(shifts, _mm512_permutexvar_epi8(gather, packed));
        // row % 64 == 0 and col = i % row: 64 bases from col.
        let b4 = _mm512_loadu_si512(s.bases4.as_ptr().add(col).cast());
        let b4m12 = _mm512_loadu_si512(s.bases4m12.as_ptr().add(col).cast());
        let c4 = _mm512_and_si512(f, x0c);
        let esc1 = _mm512_cmpeq_epi8_mask(c4, x0c);
        // Expanding from a register: the memory form measured slower on Zen 4.
        let v2 = _mm512_maskz_expand_epi8(esc1, _mm512_loadu_si512(s.l2.as_ptr().add(k1).cast()));
        k1 += esc1.count_ones() as usize;
        let e4 = _mm512_mask_sub_epi8(_mm512_sub_epi8(b4, c4), esc1, b4m12, v2);
        let esc2 = _mm512_mask_cmpeq_epi8_mask(esc1, v2, x12);
        let v3 = _mm512_maskz_expand_epi8(esc2, _mm512_loadu_si512(s.l3.as_ptr().add(k2).cast()));
        k2 += esc2.count_ones() as usize;
        let e4 = _mm512_mask_mov_epi8(e4, esc2, v3);
        // sign_mantissa | (e4 & 0x7c)
        let hi =
            _mm512_ternarylogic_epi32::<0xf8>(_mm512_permutexvar_epi8(f, sign_mantissa), e4, x7c);
        let l = _mm512_loadu_si512(lo.as_ptr().add(i).cast());
        let o = out.as_mut_ptr().add(2 * i);
        _mm512_storeu_si512(o.cast(), _mm512_permutex2var_epi8(l, il0, hi));
        _mm512_storeu_si512(o.add(64).cast(), _mm512_permutex2var_epi8(l, il1, hi));
        i += 64;
        col = if col + 64 == p.row { 0 } else { col + 64 };
    }
    (i, k1, k2)
}

/// Unpack `n` packed `bits`-bit values (5 or 2) from `src` into `dst`,
/// each times 4, 64 a step; returns the values done (whole steps whose
/// bytes `src` holds), for the scalar unpacker to finish.
pub fn unpack_times4(bits: usize, src: &[u8], n: usize, dst: &mut [u8]) -> usize {
    if has_avx512() {
        // SAFETY: the features are present; loads and stores are bounded.
        unsafe { unpack_times4_avx512(bits, src, n, dst) }
    } else {
        0
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn unpack_times4_avx512(bits: usize, src: &[u8], n: usize, dst: &mut [u8]) -> usize {
    let load = |b: [i8; 64]| _mm512_loadu_si512(b.as_ptr().cast());
    // Qword q takes the step's bytes bits*q.. ; byte j of it the 8 bits
    // from bit bits*j - 2 (so the value lands times 4; bits 62-63 of the
    // qword fall in the bits the mask clears).
    let gather = load(bytes64(|i| (bits * (i / 8) + i % 8).min(63) as u8));
    let shifts = load(bytes64(|i| ((bits * (i % 8)) as u8).wrapping_sub(2) & 63));
    let mask = _mm512_set1_epi8(if bits == 5 { 0x7c } else { 0x0c });
    let step = 8 * bits;
    let mut done = 0;
    // A whole step reads `step` bytes and writes 64: both inside.
    while done + 64 <= n && (done / 64 + 1) * step <= src.len() && done + 64 <= dst.len() {
        let keep = (1u64 << step) - 1;
        let packed = _mm512_maskz_loadu_epi8(keep, src.as_ptr().add(done / 64 * step).cast());
        let v = _mm512_multishift_epi64_epi8(shifts, _mm512_permutexvar_epi8(gather, packed));
        _mm512_storeu_si512(dst.as_mut_ptr().add(done).cast(), _mm512_and_si512(v, mask));
        done += 64;
    }
    done
}

/// For each 8-bit lane mask, the `pshufb` control that places the next
/// popcount(mask) stream bytes in the set lanes (0x80: zero).
const EXPAND: [[u8; 8]; 256] = {
    let mut t = [[0x80u8; 8]; 256];
    let mut m = 0;
    while m < 256 {
        let mut k = 0;
        let mut lane = 0;
        while lane < 8 {
            if m & (1 << lane) != 0 {
                t[m][lane] = k;
                k += 1;
            }
            lane += 1;
        }
        m += 1;
    }
    t
};

/// 32 lanes of `stream` values from cursor `k` into the lanes set in
/// `mask`, advancing `k`. The stream holds `k + 32` readable bytes.
#[target_feature(enable = "avx2,popcnt")]
unsafe fn expand32(mask: u32, stream: &[u8], k: &mut usize) -> __m256i {
    let mut group = |g: u32| {
        let m = (mask >> (8 * g)) as u8 as usize;
        // SAFETY (caller): 8 bytes at k stay inside the stream's PAD.
        let src = _mm_loadl_epi64(stream.as_ptr().add(*k).cast());
        let ctl = _mm_loadl_epi64(EXPAND[m].as_ptr().cast());
        *k += m.count_ones() as usize;
        _mm_shuffle_epi8(src, ctl)
    };
    let (a, b, c, d) = (group(0), group(1), group(2), group(3));
    _mm256_set_m128i(_mm_unpacklo_epi64(c, d), _mm_unpacklo_epi64(a, b))
}

#[target_feature(enable = "avx2,bmi2,popcnt")]
unsafe fn avx2(
    p: &Parsed,
    lo: &[u8],
    s: &Scratch,
    out: &mut [u8],
    ahead: &[u8],
) -> (usize, usize, usize) {
    let (x0c, x12, x80, x7c, x03) = (
        _mm256_set1_epi8(0x0c),
        _mm256_set1_epi8(12),
        _mm256_set1_epi8(-128),
        _mm256_set1_epi8(0x7c),
        _mm256_set1_epi8(3),
    );
    let (mut k1, mut k2) = (0usize, 0usize);
    let steps = lo.len() / 32;
    let (mut i, mut col) = (0, 0);
    for c in 0..steps {
        if k1 > p.n1 || k2 > p.n2 {
            break;
        }
        // One line of what comes next (a hint: never faults).
        _mm_prefetch::<_MM_HINT_T0>(ahead.as_ptr().wrapping_add(c * 64).cast());
        // 4 groups of 8 fields, 5 bytes each, at 20c: inside fields.
        let group = |g: usize| {
            let w = super::load40(&p.fields[c * 20 + g * 5..c * 20 + g * 5 + 5]);
            _pdep_u64(w, 0x1f1f_1f1f_1f1f_1f1f) as i64
        };
        let f = _mm256_set_epi64x(group(3), group(2), group(1), group(0));
        // row % 32 == 0 and col = i % row: 32 bases from col.
        let b4 = _mm256_loadu_si256(s.bases4.as_ptr().add(col).cast());
        let c4 = _mm256_and_si256(f, x0c);
        let esc1v = _mm256_cmpeq_epi8(c4, x0c);
        let esc1 = _mm256_movemask_epi8(esc1v) as u32;
        // No branches on the masks: most steps have both escapes.
        let v2 = expand32(esc1, &s.l2, &mut k1);
        let b4m12 = _mm256_loadu_si256(s.bases4m12.as_ptr().add(col).cast());
        let e4 = _mm256_blendv_epi8(_mm256_sub_epi8(b4, c4), _mm256_sub_epi8(b4m12, v2), esc1v);
        let esc2v = _mm256_and_si256(esc1v, _mm256_cmpeq_epi8(v2, x12));
        let esc2 = _mm256_movemask_epi8(esc2v) as u32;
        let v3 = expand32(esc2, &s.l3, &mut k2);
        let e4 = _mm256_blendv_epi8(e4, v3, esc2v);
        let sign = _mm256_and_si256(_mm256_slli_epi16(f, 3), x80);
        let hi = _mm256_or_si256(
            _mm256_or_si256(sign, _mm256_and_si256(e4, x7c)),
            _mm256_and_si256(f, x03),
        );
        let l = _mm256_loadu_si256(lo.as_ptr().add(i).cast());
        // unpack works within 128-bit halves: fix the halves' order.
        let a = _mm256_unpacklo_epi8(l, hi);
        let b = _mm256_unpackhi_epi8(l, hi);
        let o = out.as_mut_ptr().add(2 * i);
        _mm256_storeu_si256(o.cast(), _mm256_permute2x128_si256(a, b, 0x20));
        _mm256_storeu_si256(o.add(32).cast(), _mm256_permute2x128_si256(a, b, 0x31));
        i += 32;
        col = if col + 32 == p.row { 0 } else { col + 32 };
    }
    (i, k1, k2)
}

/// A vector loop, as the tests call it.
#[cfg(test)]
pub type Loop = fn(&Parsed, &[u8], &Scratch, &mut [u8]) -> (usize, usize, usize);

/// Each vector loop this CPU runs, by name (None: not on this CPU).
#[cfg(test)]
pub fn loops() -> [(&'static str, Option<Loop>); 2] {
    fn a512(p: &Parsed, lo: &[u8], s: &Scratch, out: &mut [u8]) -> (usize, usize, usize) {
        // SAFETY: offered only where the features are present.
        unsafe { avx512(p, lo, s, out, &[]) }
    }
    fn a2(p: &Parsed, lo: &[u8], s: &Scratch, out: &mut [u8]) -> (usize, usize, usize) {
        // SAFETY: as above.
        unsafe { avx2(p, lo, s, out, &[]) }
    }
    [
        ("avx512", has_avx512().then_some(a512 as Loop)),
        ("avx2", has_avx2().then_some(a2 as Loop)),
    ]
}
