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
//! 1. `xxh3_rounds` on the GPU (one warp per round, every round in
//!    parallel, coalesced 256-byte loads): the 8 sums of each full round's
//!    terms, and of the tail's (the last partial round and the last
//!    stripe), into a device array copied back to pinned host memory (64
//!    bytes per KiB, 6% of the block);
//! 2. [`finish`] on the host: the chain `acc = scramble(acc + sum[n])` over
//!    the rounds, the tail's sums and the merge. It is the sequential part
//!    but tiny (8 words per KiB, already in the cache).
//!
//! The result is the specification's value, bit for bit (tests compare a
//! host model of the same split with [`crate::checksum::checksum`], and on a
//! GPU the kernels themselves). Inputs of 240 bytes or fewer take XXH3's
//! short path, which the kernels do not have: [`DeviceXxh3::covers`] says no
//! and the caller hashes those on the host.
//!
//! Each hash runs on a slot of its own (a stream, the sums of a
//! `max_len`-byte input on the device and pinned on the host, an event),
//! taken from a shared pool, after the event of the copy that wrote the
//! bytes: the copy stream goes on with the next block while the GPU hashes
//! this one. The slots' streams have the device's highest priority, so the
//! kernel (short blocks that read the block once from HBM) takes the first
//! SM room the engine's kernels leave rather than queuing behind them; what
//! that costs a running kernel is measured by `bench store --tiers vram`
//! (docs/BENCHMARKS.md, "promotions checked on the GPU").

use std::sync::Arc;

use cudarc::driver::{result, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use super::pool::SlotPool;
use super::{cuda_err, GpuDevice, GpuEvent, PinnedBuf, VramSegment};
use crate::TransferError;

/// XXH3's default secret (the specification's `kSecret`).
const SECRET: [u8; 192] = [
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
const ROUND: usize = 1024;
/// Inputs up to this long take XXH3's short path (not on the device).
const SHORT_MAX: usize = 240;

const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME_MX1: u64 = 0x1656_6791_9E37_79F9;
/// XXH3's initial accumulators.
const INIT: [u64; 8] = [
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
const fn secret_word(at: usize) -> u64 {
    let mut w = 0u64;
    let mut b = 8;
    while b > 0 {
        b -= 1;
        w = (w << 8) | SECRET[at + b] as u64;
    }
    w
}

/// Secret words a stripe's lane reads (`stripe + lane`), and the scramble's (16..24).
fn stripe_secrets() -> [u64; 24] {
    std::array::from_fn(|k| secret_word(8 * k))
}

/// Secret words of the last stripe (XXH3 reads them 7 bytes before the
/// secret's last 64).
fn last_secrets() -> [u64; 8] {
    std::array::from_fn(|i| secret_word(SECRET.len() - 64 - 7 + 8 * i))
}

/// Secret words of the final merge (from byte 11).
fn merge_secrets() -> [u64; 8] {
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

// One stripe's terms for accumulator i (key: the secret word of lane i).
__device__ __forceinline__ u64 stripe_terms(const unsigned char* p, unsigned i, u64 key) {
    return load64(p + 8 * (i ^ 1)) + mul32(load64(p + 8 * i) ^ key);
}

// The 8 term sums of each full round n < rounds, then of the tail (the
// last partial round's whole stripes and the last stripe) as entry
// `rounds`. Warp w takes entry w (and w + warps...); word r*32 + lane of a
// round is stripe r*4 + lane/8, accumulator lane & 7.
extern "C" __global__ void xxh3_rounds(const unsigned char* data, u64 len, u64 rounds,
                                       u64* sums) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned i = lane & 7;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 n = warp; n <= rounds; n += warps) {
        if (n == rounds) {
            if (lane < 8) {
                const u64 tail = rounds * 1024;
                const u64 stripes = ((len - 1) - tail) / 64;
                u64 acc = 0;
                for (u64 s = 0; s < stripes; ++s)
                    acc += stripe_terms(data + tail + s * 64, i, SEC[s + i]);
                sums[n * 8 + lane] = acc + stripe_terms(data + len - 64, i, LAST[i]);
            }
            continue;
        }
        const u64* round = (const u64*)data + n * 128;
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
"#;

/// XXH3-64 of a `len`-byte input (> 240) from its rounds' term sums and
/// the tail's (`xxh3_rounds`' output as it lands in host memory: `(len - 1)
/// / 1024 + 1` entries of 8 little-endian words, 64 bytes each):
/// the scramble chain, the tail and the merge. The chain is the sequential
/// part (a few microseconds per MiB here), so the host runs it: on the GPU
/// one thread per accumulator held an SM slot for tens of microseconds per
/// block, which delayed an engine's kernels.
fn finish(sums: &[u8], len: u64) -> u64 {
    let sec = stripe_secrets();
    let entry = |e: &[u8], i: usize| le_word(&e[8 * i..8 * i + 8]);
    let (rounds, tail) = sums.split_at(sums.len().saturating_sub(64));
    let mut acc = INIT;
    for s in rounds.chunks_exact(64) {
        for i in 0..8 {
            let mut a = acc[i].wrapping_add(entry(s, i));
            a ^= a >> 47;
            a ^= sec[16 + i];
            acc[i] = a.wrapping_mul(PRIME32_1);
        }
    }
    if tail.len() == 64 {
        for (i, a) in acc.iter_mut().enumerate() {
            *a = a.wrapping_add(entry(tail, i));
        }
    }
    let merge = merge_secrets();
    let mut h = len.wrapping_mul(PRIME64_1);
    for k in 0..4 {
        let (x, y) = (acc[2 * k] ^ merge[2 * k], acc[2 * k + 1] ^ merge[2 * k + 1]);
        let p = u128::from(x) * u128::from(y);
        h = h.wrapping_add(p as u64 ^ (p >> 64) as u64);
    }
    h ^= h >> 37;
    h = h.wrapping_mul(PRIME_MX1);
    h ^ (h >> 32)
}

/// The kernels' CUDA source, the secret's words written in from [`SECRET`].
fn source() -> String {
    let mut s = c_array("SEC", &stripe_secrets());
    s += &c_array("LAST", &last_secrets());
    s + KERNELS
}

/// One hash in flight: its stream, the round sums (device and pinned host
/// copies, for `max_len` bytes) and the event after their copy back.
struct HashSlot {
    stream: Arc<CudaStream>,
    sums: VramSegment,
    host: PinnedBuf,
    done: GpuEvent,
}

/// XXH3-64 on the GPU (see the module doc).
pub struct DeviceXxh3 {
    dev: Arc<GpuDevice>,
    rounds: CudaFunction,
    max_len: usize,
    slots: SlotPool<HashSlot>,
}

/// Threads per block of `xxh3_rounds` (8 warps: 8 rounds per block).
const THREADS: u32 = 256;

/// Bytes of the sums of a `len`-byte input: 8 words per full round and 8
/// for the tail.
fn sums_len(len: usize) -> usize {
    (len.saturating_sub(1) / ROUND + 1) * 64
}

impl DeviceXxh3 {
    /// Compile the kernel (NVRTC) and make `slots` hash slots, each with
    /// room for the sums of inputs of up to `max_len` bytes (64 bytes per
    /// KiB, on the device and pinned on the host).
    pub fn new(dev: &Arc<GpuDevice>, max_len: usize, slots: usize) -> Result<Self, TransferError> {
        let ptx = super::compile(&source())?;
        let module = dev.context().load_module(ptx).map_err(cuda_err)?;
        let mut free = Vec::with_capacity(slots.max(1));
        for _ in 0..slots.max(1) {
            free.push(HashSlot {
                stream: dev.new_urgent_stream()?,
                sums: VramSegment::allocate(dev, sums_len(max_len))?,
                host: PinnedBuf::new(dev, sums_len(max_len))?,
                done: GpuEvent::new(dev)?,
            });
        }
        Ok(DeviceXxh3 {
            dev: dev.clone(),
            rounds: module.load_function("xxh3_rounds").map_err(cuda_err)?,
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
    /// until the sums are back on the host and finished there.
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
                format!(
                    "{len} bytes at {data:#x}: not longer than {SHORT_MAX}, over {} or not 8-byte aligned",
                    self.max_len
                ),
            ));
        }
        let bytes = sums_len(len);
        let mut taken = self.slots.take(1);
        let slot = &mut taken[0];
        let digest = match self.queue(slot, after, data, len as u64, bytes) {
            Ok(()) => slot
                .done
                .wait()
                .map(|()| finish(&slot.host[..bytes], len as u64)),
            Err(e) => {
                // Part of the work may be queued: nothing may still write the
                // slot's pinned sums when it goes back to the pool.
                let _ = slot.stream.synchronize();
                Err(e)
            }
        };
        self.slots.give_back(taken);
        digest
    }

    /// Queue, on the slot's stream: a wait for `after`, the sums kernel and
    /// the copy of its `bytes` of sums into the slot's pinned buffer, then
    /// the slot's event.
    fn queue(
        &self,
        slot: &mut HashSlot,
        after: &GpuEvent,
        data: u64,
        len: u64,
        bytes: usize,
    ) -> Result<(), TransferError> {
        self.dev.bind()?;
        after.make_wait(&slot.stream)?;
        let rounds = (len - 1) / ROUND as u64;
        let sums = slot.sums.addr(0, bytes)?;
        let warps = rounds + 1;
        let blocks = warps.div_ceil(u64::from(THREADS / 32)).clamp(1, 1024) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = slot.stream.launch_builder(&self.rounds);
        launch.arg(&data).arg(&len).arg(&rounds).arg(&sums);
        // SAFETY: arguments match `xxh3_rounds`; `data` covers `len` bytes
        // (checked by `seg.addr`), `sums` holds 8 words per round and 8 for
        // the tail (checked above), and both outlive the launch (the caller
        // waits for the slot's event).
        unsafe { launch.launch(cfg) }.map_err(cuda_err)?;
        // SAFETY: the pinned buffer is the slot's, read only after `done`.
        unsafe {
            result::memcpy_dtoh_async(&mut slot.host[..bytes], sums, slot.stream.cu_stream())
        }
        .map_err(cuda_err)?;
        slot.done.record(&slot.stream)
    }
}

fn le_word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(b);
    u64::from_le_bytes(w)
}

#[cfg(test)]
mod tests;
