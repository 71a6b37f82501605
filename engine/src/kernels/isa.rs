//! [`Isa`]: which instruction set the kernels run with, detected once at
//! runtime. Every kernel dispatcher reads it, so it sits in a file of its
//! own that imports nothing of the kernels.

/// The instruction set the kernels run with, picked once at runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 F/BW/VL + AVX2 + F16C + FMA.
    Avx512,
    /// AVX2 + F16C + FMA.
    Avx2,
    /// Portable scalar code (software FMA when the CPU has none).
    Scalar,
}

impl Isa {
    /// The best ISA this CPU supports. Choosing another one is the engine
    /// config's job (`[engine] isa`, env `KVFABRIC_ISA`, flag `--isa`): the
    /// kernels read no environment.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            // Both SIMD ISAs need AVX2 (the norm and SwiGLU kernels use it on AVX-512 too).
            let base = is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
                && is_x86_feature_detected!("avx2");
            if base
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
            {
                return Isa::Avx512;
            }
            if base {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Every ISA this CPU can run, scalar first: the kernel tests compare them all.
    #[cfg(test)]
    pub(crate) fn all_detected() -> Vec<Isa> {
        let best = Isa::detect();
        let mut v = vec![Isa::Scalar];
        if best != Isa::Scalar {
            v.push(Isa::Avx2);
        }
        if best == Isa::Avx512 {
            v.push(Isa::Avx512);
        }
        v
    }
}
