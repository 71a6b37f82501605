//! Batch-invariant CPU kernels: weight-only-quantized matmul, attention, norms.
//!
//! Invariance is by construction: every output element is reduced in one
//! fixed order that depends only on its own row (matmul: k = 0..K, one FMA per
//! step; attention: key positions in block order), whatever the batch size,
//! tiling or thread split. Threads split outputs, never a reduction.
//! Accumulation always uses fused multiply-add, and dequantization gives the
//! f32 reference's exact value on every ISA path (see [`matmul`]), so the
//! AVX-512, AVX2 and scalar paths give the same bits.
//!
//! Kernels are grouped by what they compute, then by ISA ([`matmul`]: by
//! weight format, each with `avx2` and `avx512` submodules; [`attention`]:
//! `avx2`, `avx512`). A dispatcher imports its kernels, never the reverse.

pub mod attention;
pub mod convert;
mod isa;
pub mod matmul;
#[cfg(test)]
mod perf_tests;
pub mod pool;
pub mod prefetch;
#[cfg(test)]
mod test_weights;

pub use convert::f16_to_f32;
pub use isa::Isa;
pub use matmul::PackedMatrix;
pub use pool::ThreadPool;
pub use prefetch::SideLines;

/// What the kernels run on: an ISA and a thread pool.
#[derive(Debug)]
pub struct Compute {
    pub isa: Isa,
    pub pool: ThreadPool,
}

impl Compute {
    /// Detect the ISA and start a pool of `threads` threads (0 = one per core).
    pub fn new(threads: usize) -> Compute {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        Compute {
            isa: Isa::detect(),
            pool: ThreadPool::new(threads),
        }
    }
}

// exp(x) for x <= 0 (softmax, silu): 2^n * p(r), same operations on every path.
pub(crate) const EXP_LO: f32 = -87.0;
pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;
pub(crate) const LN2_HI: f32 = 0.693_145_75;
pub(crate) const LN2_LO: f32 = 1.428_606_8e-6;
pub(crate) const EXP_C: [f32; 7] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
];

/// Deterministic exp for x in [-87, 88]: the scalar twin of the SIMD versions.
#[inline(always)]
pub fn exp_det(x: f32) -> f32 {
    let x = x.clamp(EXP_LO, 88.0);
    let n = (x * LOG2E).round_ties_even();
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let mut p = EXP_C[0];
    for c in &EXP_C[1..] {
        p = p.mul_add(r, *c);
    }
    p = p.mul_add(r, 1.0);
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    p * scale
}

/// `exp_det` on 16 lanes, same operations (softmax and SwiGLU use it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
pub(crate) unsafe fn exp16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(EXP_LO)),
        _mm512_set1_ps(88.0),
    );
    let n = _mm512_roundscale_ps(
        _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(EXP_C[0]);
    for c in &EXP_C[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
    }
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0));
    let e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)),
        23,
    );
    _mm512_mul_ps(p, _mm512_castsi512_ps(e))
}

/// RMSNorm of every row of `x` (rows of `w.len()` values):
/// `x / sqrt(mean(x^2) + eps) * w`, each row's sum of squares sequential.
///
/// Up to [`NORM_ROWS`] rows go through the loop together. One row's sum is a
/// chain of dependent FMAs (~4 cycles each, ~0.8 us for 576 values); the
/// chains of different rows are independent, so interleaving them fills the
/// FMA units and 8 rows cost about what one did. Each row's operations and
/// their order are the same whatever the grouping: the same bits.
pub fn rms_norm(isa: Isa, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    assert!(
        h > 0 && x.len().is_multiple_of(h) && out.len() == x.len(),
        "rms_norm shapes"
    );
    for (xs, os) in x.chunks(NORM_ROWS * h).zip(out.chunks_mut(NORM_ROWS * h)) {
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: non-scalar ISAs imply FMA and AVX2 (checked at detection).
            Isa::Avx512 | Isa::Avx2 => unsafe { rms_norm_fma(xs, w, eps, os) },
            _ => rms_norm_rows(xs, w, eps, os),
        }
    }
}

/// Rows one [`rms_norm`] loop takes together.
pub const NORM_ROWS: usize = 8;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rms_norm_fma(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    rms_norm_rows(x, w, eps, out)
}

/// 1..=[`NORM_ROWS`] rows, dispatched to a loop with that many chains.
#[inline(always)]
fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    match x.len() / w.len() {
        1 => rms_norm_body::<1>(x, w, eps, out),
        2 => rms_norm_body::<2>(x, w, eps, out),
        3 => rms_norm_body::<3>(x, w, eps, out),
        4 => rms_norm_body::<4>(x, w, eps, out),
        5 => rms_norm_body::<5>(x, w, eps, out),
        6 => rms_norm_body::<6>(x, w, eps, out),
        7 => rms_norm_body::<7>(x, w, eps, out),
        _ => rms_norm_body::<NORM_ROWS>(x, w, eps, out),
    }
}

#[inline(always)]
fn rms_norm_body<const R: usize>(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    let mut ss = [0.0f32; R];
    for i in 0..h {
        for (r, s) in ss.iter_mut().enumerate() {
            let v = x[r * h + i];
            *s = v.mul_add(v, *s);
        }
    }
    for (r, s) in ss.iter().enumerate() {
        let scale = 1.0 / ((s / h as f32) + eps).sqrt();
        let (xr, or) = (&x[r * h..(r + 1) * h], &mut out[r * h..(r + 1) * h]);
        for ((o, v), g) in or.iter_mut().zip(xr).zip(w) {
            *o = (v * scale) * g;
        }
    }
}

/// SwiGLU on a row holding `[gate | up]`: out = silu(gate) * up.
pub fn swiglu(isa: Isa, gate_up: &[f32], out: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Isa::Avx512 is only chosen when the CPU has AVX-512F and FMA.
        Isa::Avx512 => unsafe { swiglu_avx512(gate_up, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as for rms_norm.
        Isa::Avx2 => unsafe { swiglu_fma(gate_up, out) },
        _ => swiglu_body(gate_up, out),
    }
}

/// [`swiglu_body`] 16 lanes at a time with the same operations (exp16 is
/// `exp_det`'s twin; division and products are IEEE-exact), so the same bits:
/// the compiler left the scalar loop unvectorized (~5 cycles per value).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn swiglu_avx512(gate_up: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = out.len();
    let (gate, up) = gate_up.split_at(n);
    let full = n / 16 * 16;
    let one = _mm512_set1_ps(1.0);
    let sign = _mm512_set1_ps(-0.0);
    for i in (0..full).step_by(16) {
        let g = _mm512_loadu_ps(gate.as_ptr().add(i));
        let u = _mm512_loadu_ps(up.as_ptr().add(i));
        let neg = _mm512_castsi512_ps(_mm512_xor_si512(
            _mm512_castps_si512(g),
            _mm512_castps_si512(sign),
        ));
        let silu = _mm512_div_ps(g, _mm512_add_ps(one, exp16(neg)));
        _mm512_storeu_ps(out.as_mut_ptr().add(i), _mm512_mul_ps(silu, u));
    }
    if full < n {
        // The scalar body takes `[gate | up]` contiguous: the tails, joined.
        let tail = [&gate[full..], &up[full..]].concat();
        swiglu_body(&tail, &mut out[full..]);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_fma(gate_up: &[f32], out: &mut [f32]) {
    swiglu_body(gate_up, out)
}

#[inline(always)]
fn swiglu_body(gate_up: &[f32], out: &mut [f32]) {
    let n = out.len();
    let (gate, up) = gate_up.split_at(n);
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        let silu = g / (1.0 + exp_det(-g));
        *o = silu * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SIMD SwiGLU has the scalar body's bits on every ISA, over the
    /// range the clamp cuts and a tail shorter than a vector.
    #[test]
    fn swiglu_paths_equal_the_scalar_body() {
        let n = 16 * 40 + 7;
        let gate_up: Vec<f32> = (0..2 * n)
            .map(|i| ((i * 7919 % 2001) as f32 - 1000.0) / 10.0)
            .collect();
        let mut want = vec![0f32; n];
        swiglu_body(&gate_up, &mut want);
        for isa in Isa::all_detected() {
            let mut got = vec![f32::NAN; n];
            swiglu(isa, &gate_up, &mut got);
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{isa:?}");
        }
    }

    /// Why the SIMD paths may dequantize Q4_1 with one FMA: for every q in
    /// 0..16, every finite f16 scale d and a spread of f16 offsets m,
    /// `fma(q, d, m)` has the bits of the reference's `q*d + m`.
    #[test]
    fn fma_dequant_equals_multiply_then_add() {
        let mut rnd = test_weights::xorshift(0x5eed);
        let finite = |h: u16| h & 0x7c00 != 0x7c00;
        for dh in (0..=u16::MAX).filter(|&h| finite(h)) {
            let d = f16_to_f32(dh);
            for _ in 0..4 {
                let mh = rnd() as u16;
                if !finite(mh) {
                    continue;
                }
                let m = f16_to_f32(mh);
                for q in 0..16u8 {
                    let q = q as f32;
                    assert_eq!(
                        q.mul_add(d, m).to_bits(),
                        (q * d + m).to_bits(),
                        "q={q} d={d} m={m}"
                    );
                }
            }
        }
    }

    #[test]
    fn f16_conversion_matches_known_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert!(f16_to_f32(0x7c00).is_infinite());
    }

    #[test]
    fn norm_and_swiglu_are_isa_independent() {
        let x: Vec<f32> = (0..576)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let w: Vec<f32> = (0..576).map(|i| 1.0 + (i % 13) as f32 / 10.0).collect();
        let (mut a, mut b) = (vec![0f32; 576], vec![0f32; 576]);
        rms_norm(Isa::Scalar, &x, &w, 1e-5, &mut a);
        rms_norm(Isa::detect(), &x, &w, 1e-5, &mut b);
        assert_eq!(a, b);
        // Rows normed together (any count, past one loop's 8) equal each row alone.
        let rows: Vec<f32> = (0..11 * 576)
            .map(|i| ((i * 53 % 211) as f32 - 105.0) / 9.0)
            .collect();
        for isa in [Isa::Scalar, Isa::detect()] {
            let mut together = vec![0f32; rows.len()];
            rms_norm(isa, &rows, &w, 1e-5, &mut together);
            for (r, got) in together.chunks(576).enumerate() {
                let mut alone = vec![0f32; 576];
                rms_norm(isa, &rows[r * 576..(r + 1) * 576], &w, 1e-5, &mut alone);
                assert_eq!(got, &alone[..], "row {r}, {isa:?}");
            }
        }
        let (mut a, mut b) = (vec![0f32; 288], vec![0f32; 288]);
        swiglu(Isa::Scalar, &x, &mut a);
        swiglu(Isa::detect(), &x, &mut b);
        assert_eq!(a, b);
        let want = x[3] / (1.0 + (-x[3] as f64).exp() as f32) * x[291];
        assert!((a[3] - want).abs() < 1e-4 * want.abs().max(1.0));
    }

    #[test]
    fn exp_is_accurate() {
        let mut x = -87.0f32;
        while x < 20.0 {
            let got = exp_det(x) as f64;
            let want = (x as f64).exp();
            assert!(
                ((got - want) / want).abs() < 3e-7,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.0137;
        }
    }
}
