//! `DeviceXxh3`: the fabric's block checksum ([`crate::checksum`], XXH3-64
//! with seed 0 and the default secret) computed by the GPU over bytes in
//! VRAM, so a block promoted from the registered RAM arena is checked as it
//! landed without the CPU reading it from DRAM a second time (a promotion
//! that hashed the RAM copy on the host shared the host's memory bandwidth
//! with its own DMA and got about half of it).
//!
//! XXH3's long-input loop looks sequential but is not, between scrambles:
//! the input is cut into 1 KiB rounds (16 stripes of 64 bytes); within a
//! round every word only *adds* a term to one of 8 accumulators, and only
//! the scramble at the end of a round mixes. So:
//!
//! 1. `xxh3_rounds` (one warp per round, every round in parallel, coalesced
//!    256-byte loads): the 8 sums of each full round's terms, into a device
//!    scratch array;
//! 2. `xxh3_finish` (8 threads, one per accumulator): the chain
//!    `acc = scramble(acc + sum[n])` over the rounds, then XXH3's tail (the
//!    last partial round and the last stripe) and its merge, into one word.
//!
//! The result is the specification's value, bit for bit (tests compare a
//! host model of the same split with [`crate::checksum::checksum`], and on a
//! GPU the kernels themselves). Inputs of 240 bytes or fewer take XXH3's
//! short path, which the kernels do not have: [`DeviceXxh3::covers`] says no
//! and the caller hashes those on the host.
//!
//! Each hash runs on a slot of its own (a stream, the scratch for
//! `max_len` bytes, a pinned word for the result and an event), taken from a
//! shared pool, after the event of the copy that wrote the bytes: the copy
//! stream goes on with the next block while the GPU hashes this one. The
//! slots' streams have the device's highest priority, so the hash kernels
//! (a few microseconds of a few SMs per block) take the first SM room the
//! engine's kernels leave. A GPU filled by kernels whose blocks run for
//! milliseconds still makes them wait that long (`bench store --tiers
//! vram` measures both kinds of load); `vram_verify = host` avoids it.

use std::sync::Arc;

use cudarc::driver::{result, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use super::pool::SlotPool;
use super::{cuda_err, GpuDevice, GpuEvent, PinnedBuf, VramSegment};
use crate::TransferError;

/// XXH3's default secret (the specification's `kSecret`).
pub(crate) const SECRET: [u8; 192] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
];

/// Bytes of one round (16 stripes of 64 bytes with the default secret).
pub(crate) const ROUND: usize = 1024;
/// Inputs up to this long take XXH3's short path (not on the device).
pub(crate) const SHORT_MAX: usize = 240;

pub(crate) const PRIME32_1: u64 = 0x9E37_79B1;
pub(crate) const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
pub(crate) const PRIME_MX1: u64 = 0x1656_6791_9E37_79F9;
/// XXH3's initial accumulators.
pub(crate) const INIT: [u64; 8] = [
    0xC2B2_AE3D,
    PRIME64_1,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0x85EB_CA77_C2B2_AE63,
    0x85EB_CA77,
    0x27D4_EB2F_1656_67C5,
    PRIME32_1,
];

/// The little-endian word of the secret at byte `at`.
pub(crate) const fn secret_word(at: usize) -> u64 {
    let mut w = 0u64;
    let mut b = 8;
    while b > 0 {
        b -= 1;
        w = (w << 8) | SECRET[at + b] as u64;
    }
    w
}

/// Secret words a stripe's lane reads (`stripe + lane`), and the scramble's (16..24).
pub(crate) fn stripe_secrets() -> [u64; 24] {
    std::array::from_fn(|k| secret_word(8 * k))
}

/// Secret words of the last stripe (XXH3 reads them 7 bytes before the
/// secret's last 64).
pub(crate) fn last_secrets() -> [u64; 8] {
    std::array::from_fn(|i| secret_word(SECRET.len() - 64 - 7 + 8 * i))
}

/// Secret words of the final merge (from byte 11).
pub(crate) fn merge_secrets() -> [u64; 8] {
    std::array::from_fn(|i| secret_word(11 + 8 * i))
}

fn c_array(name: &str, words: &[u64]) -> String {
    let list: Vec<String> = words.iter().map(|w| format!("{w:#x}ull")).collect();
    format!(
        "__device__ const unsigned long long {name}[{}] = {{{}}};\n",
        words.len(),
        list.join(", ")
    )
}

const KERNELS: &str = r#"
#define FULL 0xffffffffu
typedef unsigned long long u64;

__device__ __forceinline__ u64 mul32(u64 k) { return (k & 0xffffffffull) * (k >> 32); }

__device__ __forceinline__ u64 load64(const unsigned char* p) {
    if (((u64)p & 7) == 0) return *(const u64*)p;
    u64 v = 0;
    for (int b = 7; b >= 0; --b) v = (v << 8) | p[b];
    return v;
}

// The 8 term sums of each full round: warp w takes round w (and w + warps...);
// word r*32 + lane of a round is stripe r*4 + lane/8, accumulator lane & 7.
extern "C" __global__ void xxh3_rounds(const u64* data, u64 rounds, u64* sums) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned i = lane & 7;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 n = warp; n < rounds; n += warps) {
        const u64* round = data + n * 128;
        u64 prod = 0, val = 0;
        #pragma unroll
        for (int r = 0; r < 4; ++r) {
            const u64 v = round[r * 32 + lane];
            prod += mul32(v ^ SEC[r * 4 + (lane >> 3) + i]);
            val += v;
        }
        prod += __shfl_xor_sync(FULL, prod, 8);
        prod += __shfl_xor_sync(FULL, prod, 16);
        val += __shfl_xor_sync(FULL, val, 8);
        val += __shfl_xor_sync(FULL, val, 16);
        // A word at lane i adds itself to accumulator i ^ 1.
        const u64 other = __shfl_xor_sync(FULL, val, 1);
        if (lane < 8) sums[n * 8 + lane] = prod + other;
    }
}

// One stripe's terms for accumulator i (key: the secret word of lane i).
__device__ __forceinline__ u64 stripe_terms(const unsigned char* p, unsigned i, u64 key) {
    return load64(p + 8 * (i ^ 1)) + mul32(load64(p + 8 * i) ^ key);
}

// The chain over the rounds' sums, the tail and the merge; 8 threads.
extern "C" __global__ void xxh3_finish(const unsigned char* data, u64 len, const u64* sums,
                                       u64* out) {
    const unsigned i = threadIdx.x;
    u64 acc = INIT[i];
    const u64 rounds = (len - 1) / 1024;
    #pragma unroll 8
    for (u64 n = 0; n < rounds; ++n) {
        acc += sums[n * 8 + i];
        acc ^= acc >> 47;
        acc ^= SEC[16 + i];
        acc *= PRIME32_1;
    }
    const u64 tail = rounds * 1024;
    const u64 stripes = ((len - 1) - tail) / 64;
    for (u64 s = 0; s < stripes; ++s) acc += stripe_terms(data + tail + s * 64, i, SEC[s + i]);
    acc += stripe_terms(data + len - 64, i, LAST[i]);
    u64 a[8];
    #pragma unroll
    for (int k = 0; k < 8; ++k) a[k] = __shfl_sync(0xffu, acc, k);
    if (i == 0) {
        u64 h = len * PRIME64_1;
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u64 x = a[2 * k] ^ MERGE[2 * k], y = a[2 * k + 1] ^ MERGE[2 * k + 1];
            h += (x * y) ^ __umul64hi(x, y);
        }
        h ^= h >> 37;
        h *= PRIME_MX1;
        h ^= h >> 32;
        *out = h;
    }
}
"#;

/// The kernels' CUDA source, the secret's words written in from [`SECRET`].
pub fn source() -> String {
    let mut s = format!(
        "#define PRIME32_1 {PRIME32_1:#x}ull\n#define PRIME64_1 {PRIME64_1:#x}ull\n#define PRIME_MX1 {PRIME_MX1:#x}ull\n"
    );
    s += &c_array("SEC", &stripe_secrets());
    s += &c_array("LAST", &last_secrets());
    s += &c_array("MERGE", &merge_secrets());
    s += &c_array("INIT", &INIT);
    s + KERNELS
}

/// One hash in flight: its stream, round-sum scratch, result word (device
/// and pinned host) and the event after its result's copy.
struct HashSlot {
    stream: Arc<CudaStream>,
    sums: VramSegment,
    out: VramSegment,
    result: PinnedBuf,
    done: GpuEvent,
}

/// XXH3-64 on the GPU (see the module doc).
pub struct DeviceXxh3 {
    dev: Arc<GpuDevice>,
    rounds: CudaFunction,
    finish: CudaFunction,
    max_len: usize,
    slots: SlotPool<HashSlot>,
}

/// Threads per block of `xxh3_rounds` (8 warps: 8 rounds per block).
const THREADS: u32 = 256;

impl DeviceXxh3 {
    /// Compile the kernels (NVRTC) and make `slots` hash slots, each with
    /// scratch for inputs of up to `max_len` bytes (64 bytes per KiB).
    pub fn new(dev: &Arc<GpuDevice>, max_len: usize, slots: usize) -> Result<Self, TransferError> {
        let ptx = cudarc::nvrtc::compile_ptx(source())
            .map_err(|e| TransferError::io_other("nvrtc", e))?;
        let module = dev.context().load_module(ptx).map_err(cuda_err)?;
        let sums_len = (max_len.saturating_sub(1) / ROUND).max(1) * 64;
        let mut free = Vec::with_capacity(slots.max(1));
        for _ in 0..slots.max(1) {
            free.push(HashSlot {
                stream: dev.new_urgent_stream()?,
                sums: VramSegment::allocate(dev, sums_len)?,
                out: VramSegment::allocate(dev, 8)?,
                result: PinnedBuf::new(dev, 8)?,
                done: GpuEvent::new(dev)?,
            });
        }
        Ok(DeviceXxh3 {
            dev: dev.clone(),
            rounds: module.load_function("xxh3_rounds").map_err(cuda_err)?,
            finish: module.load_function("xxh3_finish").map_err(cuda_err)?,
            max_len,
            slots: SlotPool::new(free),
        })
    }

    /// Whether `len` bytes at device address `addr` can be hashed here:
    /// longer than XXH3's short path, within the scratch, 8-byte aligned.
    pub fn covers(&self, addr: u64, len: usize) -> bool {
        len > SHORT_MAX && len <= self.max_len && addr % 8 == 0
    }

    /// XXH3-64 of `len` bytes of `seg` at `offset`, hashed once `after` (an
    /// event recorded on the stream that writes them) completes. Blocks
    /// until the digest is back on the host.
    pub fn digest_after(
        &self,
        seg: &VramSegment,
        offset: usize,
        len: usize,
        after: &GpuEvent,
    ) -> Result<u64, TransferError> {
        let data = seg.addr(offset, len)?;
        if !self.covers(data, len) {
            return Err(TransferError::io_other(
                "xxh3 on the device",
                format!("{len} bytes at {data:#x}: not longer than {SHORT_MAX}, over {} or not 8-byte aligned", self.max_len),
            ));
        }
        let mut taken = self.slots.take(1);
        let slot = &mut taken[0];
        self.dev.bind()?;
        after.make_wait(&slot.stream)?;
        self.launch(slot, data, len as u64)?;
        // SAFETY: the pinned word is ours and read only after `done`.
        unsafe {
            result::memcpy_dtoh_async(
                &mut slot.result[..8],
                slot.out.addr(0, 8)?,
                slot.stream.cu_stream(),
            )
        }
        .map_err(cuda_err)?;
        slot.done.record(&slot.stream)?;
        let waited = slot.done.wait();
        let mut word = [0u8; 8];
        word.copy_from_slice(&slot.result[..8]);
        self.slots.give_back(taken);
        waited.map(|()| u64::from_le_bytes(word))
    }

    /// Queue both kernels on the slot's stream.
    fn launch(&self, slot: &HashSlot, data: u64, len: u64) -> Result<(), TransferError> {
        let rounds = (len - 1) / ROUND as u64;
        let sums = slot.sums.addr(0, (rounds.max(1) * 64) as usize)?;
        let out = slot.out.addr(0, 8)?;
        if rounds > 0 {
            let blocks = rounds.div_ceil(u64::from(THREADS / 32)).clamp(1, 1024) as u32;
            let cfg = LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut launch = slot.stream.launch_builder(&self.rounds);
            launch.arg(&data).arg(&rounds).arg(&sums);
            // SAFETY: arguments match `xxh3_rounds`; `data` covers every
            // full round (checked by `seg.addr`), `sums` holds 8 words per
            // round (sized for `max_len`), and both outlive the launch (the
            // caller waits on the slot's stream).
            unsafe { launch.launch(cfg) }.map_err(cuda_err)?;
        }
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (8, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = slot.stream.launch_builder(&self.finish);
        launch.arg(&data).arg(&len).arg(&sums).arg(&out);
        // SAFETY: as above; `out` is the slot's 8-byte device word.
        unsafe { launch.launch(cfg) }.map_err(cuda_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
