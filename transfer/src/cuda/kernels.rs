//! The GPU-side consumers of VRAM blocks, compiled at run time with NVRTC:
//!
//! - `block_digest`: a digest of a block computed on the device, so a test
//!   (and an engine) can prove that the bytes a VRAM lease points at are the
//!   block's without copying them back. The digest is the XOR over the
//!   block's little-endian 8-byte words (the last one zero-padded) of
//!   `mix64(word ^ index * φ)` (splitmix64's finaliser; φ = 0x9E37...): the
//!   terms are independent, so threads fold them in any order and the result
//!   is deterministic. It is a check against wrong or stale bytes, not a MAC
//!   and not the store's XXH3 (which is sequential). [`block_digest_host`] is
//!   the same function on the CPU.
//! - `spin`: a compute-bound kernel of known length; `bench store --tiers
//!   vram` times it alone and beside the tier's copies to measure how much the
//!   copies slow the GPU's work.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use super::{cuda_err, GpuDevice, VramSegment};
use crate::TransferError;

const SOURCE: &str = r#"
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

extern "C" __global__ void block_digest(const unsigned char* data,
                                        unsigned long long len,
                                        unsigned long long* out) {
    const unsigned long long words = len >> 3;
    const unsigned long long tail = len & 7;
    const unsigned long long total = words + (tail ? 1 : 0);
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long acc = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < total; i += stride) {
        unsigned long long w = 0;
        if (i < words) {
            w = ((const unsigned long long*)data)[i];
        } else {
            for (unsigned long long b = 0; b < tail; ++b)
                w |= ((unsigned long long)data[(words << 3) + b]) << (8 * b);
        }
        acc ^= mix64(w ^ (i * 0x9E3779B97F4A7C15ull));
    }
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0 && acc != 0) atomicXor(out, acc);
}

extern "C" __global__ void spin(float* out, unsigned int iters) {
    float a = threadIdx.x * 1e-3f;
    for (unsigned int i = 0; i < iters; ++i) a = fmaf(a, 0.999999f, 1e-6f);
    out[blockIdx.x * blockDim.x + threadIdx.x] = a;
}
"#;

const THREADS: u32 = 256;

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The `block_digest` kernel's function, computed on the CPU.
pub fn block_digest_host(bytes: &[u8]) -> u64 {
    bytes.chunks(8).enumerate().fold(0, |acc, (i, piece)| {
        let mut w = [0u8; 8];
        w[..piece.len()].copy_from_slice(piece);
        acc ^ mix64(u64::from_le_bytes(w) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    })
}

/// The compiled kernels, loaded into one device's context.
pub struct Kernels {
    dev: Arc<GpuDevice>,
    digest: CudaFunction,
    spin: CudaFunction,
}

impl Kernels {
    /// Compile the kernels with NVRTC (needs libnvrtc) and load them.
    pub fn compile(dev: &Arc<GpuDevice>) -> Result<Self, TransferError> {
        let ptx = super::compile(SOURCE)?;
        let module = dev.context().load_module(ptx).map_err(cuda_err)?;
        Ok(Kernels {
            dev: dev.clone(),
            digest: module.load_function("block_digest").map_err(cuda_err)?,
            spin: module.load_function("spin").map_err(cuda_err)?,
        })
    }

    /// The digest of `len` bytes of `seg` at `offset` (8-byte aligned),
    /// computed on the device on `stream` (waits for it).
    pub fn digest(
        &self,
        seg: &VramSegment,
        offset: usize,
        len: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<u64, TransferError> {
        let data = seg.addr(offset, len)?;
        if data % 8 != 0 {
            return Err(TransferError::io_other(
                "block_digest",
                format!("device address {data:#x} is not 8-byte aligned"),
            ));
        }
        let out = VramSegment::allocate(&self.dev, 8)?;
        let out_ptr = out.addr(0, 8)?;
        let words = len.div_ceil(8) as u64;
        let blocks = words.div_ceil(u64::from(THREADS)).clamp(1, 1024) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let len = len as u64;
        let mut launch = stream.launch_builder(&self.digest);
        launch.arg(&data).arg(&len).arg(&out_ptr);
        // SAFETY: the arguments match the kernel's signature; both device
        // ranges are checked and live until the stream is synchronised below.
        unsafe { launch.launch(cfg) }.map_err(cuda_err)?;
        stream.synchronize().map_err(cuda_err)?;
        let mut word = [0u8; 8];
        out.copy_out(0, &mut word)?;
        Ok(u64::from_le_bytes(word))
    }

    /// Queue `spin` on `stream`: `blocks` x 256 threads, `iters` dependent
    /// FMAs each, results into `out` (at least `blocks * 256 * 4` bytes).
    pub fn spin(
        &self,
        out: &VramSegment,
        blocks: u32,
        iters: u32,
        stream: &Arc<CudaStream>,
    ) -> Result<(), TransferError> {
        let out_ptr = out.addr(0, blocks as usize * THREADS as usize * 4)?;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(&self.spin);
        launch.arg(&out_ptr).arg(&iters);
        // SAFETY: arguments match the kernel; `out` covers every thread's
        // float and outlives the launch (the caller waits on the stream).
        unsafe { launch.launch(cfg) }.map_err(cuda_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_digest_depends_on_every_byte_and_its_place() {
        let a: Vec<u8> = (0..1003u32).map(|i| (i * 7) as u8).collect();
        let d = block_digest_host(&a);
        for at in [0, 8, 500, 1000, 1002] {
            let mut b = a.clone();
            b[at] ^= 1;
            assert_ne!(block_digest_host(&b), d, "flip at {at}");
        }
        let mut swapped = a.clone();
        swapped.swap(0, 8);
        assert_ne!(block_digest_host(&swapped), d, "word order matters");
    }
}
