//! The split of XXH3 the kernels compute, modelled on the host thread by
//! thread and compared with the specification's value (runs everywhere);
//! NVRTC compiling the kernels (where libnvrtc loads); and the kernels on a
//! GPU against the host checksum (where a device is).

use super::*;
use crate::checksum::checksum;

fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn word(p: &[u8], at: usize) -> u64 {
    le_word(&p[at..at + 8])
}

fn mul32(k: u64) -> u64 {
    (k & 0xffff_ffff).wrapping_mul(k >> 32)
}

/// `xxh3_rounds` for one round, lane by lane of its warp, with the warp's
/// shuffles as index arithmetic.
fn round_sums(round: &[u8], sec: &[u64; 24]) -> [u64; 8] {
    let mut prod = [0u64; 32];
    let mut val = [0u64; 32];
    for lane in 0..32 {
        let i = lane & 7;
        for r in 0..4 {
            let v = word(round, 8 * (r * 32 + lane));
            prod[lane] = prod[lane].wrapping_add(mul32(v ^ sec[r * 4 + (lane >> 3) + i]));
            val[lane] = val[lane].wrapping_add(v);
        }
    }
    let fold = |a: &[u64; 32], lane: usize| {
        [lane, lane ^ 8, lane ^ 16, lane ^ 24]
            .iter()
            .fold(0u64, |s, l| s.wrapping_add(a[*l]))
    };
    std::array::from_fn(|lane| fold(&prod, lane).wrapping_add(fold(&val, lane ^ 1)))
}

/// The tail entry of `xxh3_rounds`, thread `i` being accumulator `i`.
fn tail_sums(data: &[u8], rounds: usize) -> [u64; 8] {
    let (sec, last) = (stripe_secrets(), last_secrets());
    let len = data.len();
    let terms = |at: usize, i: usize, key: u64| {
        word(data, at + 8 * (i ^ 1)).wrapping_add(mul32(word(data, at + 8 * i) ^ key))
    };
    std::array::from_fn(|i| {
        let tail = rounds * ROUND;
        let mut acc = 0u64;
        for s in 0..((len - 1) - tail) / 64 {
            acc = acc.wrapping_add(terms(tail + s * 64, i, sec[s + i]));
        }
        acc.wrapping_add(terms(len - 64, i, last[i]))
    })
}

/// The kernel's sums, modelled, finished by the production [`finish`].
fn split_model(data: &[u8]) -> u64 {
    let sec = stripe_secrets();
    let rounds = (data.len() - 1) / ROUND;
    let entries = (0..rounds)
        .map(|n| round_sums(&data[n * ROUND..(n + 1) * ROUND], &sec))
        .chain([tail_sums(data, rounds)]);
    // As the kernel leaves them in memory: 8 little-endian words per entry.
    let sums: Vec<u8> = entries.flatten().flat_map(u64::to_le_bytes).collect();
    finish(&sums, data.len() as u64)
}

/// Lengths around every boundary of the split: the short path's end, a
/// stripe, a round, rounds ending exactly at the input's end, odd tails.
fn lengths() -> Vec<usize> {
    let mut v = vec![241, 255, 256, 319, 320, 1000, 1023, 1024, 1025, 1087, 1088];
    v.extend([2047, 2048, 2049, 4096 + 7, 9 * 1024 + 63, 65536, 3 << 19]);
    v
}

#[test]
fn the_split_is_xxh3_at_every_boundary() {
    for (n, len) in lengths().into_iter().enumerate() {
        let data = bytes(len, n as u64);
        assert_eq!(split_model(&data), checksum(&data), "len {len}");
    }
}

#[test]
fn the_secret_words_are_the_specifications() {
    // Spot values of kSecret read little-endian (xxhash.h).
    assert_eq!(secret_word(0), 0xbe4b_a423_396c_feb8);
    assert_eq!(stripe_secrets()[23], 0x7e40_4bbb_cafb_d7af);
    assert_eq!(INIT.len(), 8);
}

#[test]
fn nvrtc_compiles_the_kernels() {
    match crate::cuda::compile(&source()) {
        Ok(ptx) => assert!(ptx.to_src().contains("xxh3_rounds")),
        Err(e) => eprintln!("skipped: NVRTC not usable here ({e})"),
    }
}

#[test]
fn on_the_gpu_the_digest_is_the_checksum() {
    let dev = match GpuDevice::open(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let max = 3 << 19;
    let hasher = DeviceXxh3::new(&dev, max, 2).expect("compile and load the kernel");
    let seg = VramSegment::allocate(&dev, max + 64).expect("allocate");
    let written = GpuEvent::new(&dev).expect("event");
    for (n, len) in lengths().into_iter().enumerate() {
        let data = bytes(len, n as u64 + 100);
        seg.copy_in(8, &data).expect("copy in");
        written.record(dev.h2d()).expect("record");
        let got = hasher.digest_after(&seg, 8, len, &written).expect("digest");
        assert_eq!(got, checksum(&data), "len {len}");
    }
    // Out of its reach: short, too long, unaligned.
    assert!(!hasher.covers(0, 240));
    assert!(!hasher.covers(0, max + 1));
    assert!(!hasher.covers(4, 4096));
    assert!(hasher.digest_after(&seg, 4, 4096, &written).is_err());
}
