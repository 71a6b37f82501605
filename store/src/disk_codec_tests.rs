//! The disk tier with compression: more f16 blocks in the same bytes,
//! corrupt compressed blocks are misses, raw blocks stay readable.

use std::os::unix::fs::FileExt;

use crate::tier::Tier;
use bytesize::ByteSize;

use crate::keys::{BlockKey, BlockOrder, DType, KvLayout};
use crate::node_config::{DiskCompression, NodeConfig};
use crate::store::{PutOptions, Store};
use crate::Registry;

/// SmolLM2's block shape (64 tokens x 3 KV heads x 64 dims, K and V) in f16,
/// with 12 layers instead of 30: 576 KiB (144 disk units: rounding a
/// compressed block up to whole units costs under 1%).
fn layout() -> KvLayout {
    KvLayout {
        layers: 12,
        kv_heads: 3,
        head_dim: 64,
        dtype: DType::F16,
        block_tokens: 64,
        order: BlockOrder::LayerKvTokenHead,
    }
}

const BLOCK: usize = 12 * 2 * 64 * 3 * 64 * 2;

fn key(i: u32) -> BlockKey {
    let mut k = [0u8; 32];
    k[..4].copy_from_slice(&i.to_le_bytes());
    BlockKey(k)
}

/// f16 K/V-like values: normal per channel, channel scales 2^-0.5..2^0.5, so
/// that the sign/exponent byte of a layer's K or V carries ~5.5 bits: the
/// low end of the engine's real blocks (5.53-5.73 bits, 10th-90th
/// percentile, 5.61 mean; the codec gets 1.163 on them in `bench kv`).
fn f16_block(i: u32) -> Vec<u8> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ (i as u64) << 20;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let scales: Vec<f64> = (0..192).map(|_| (2f64).powf(-0.5 + next())).collect();
    (0..BLOCK / 2)
        .flat_map(|j| {
            let (u, v) = (next(), next());
            let x = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos() * scales[j % 192];
            half_bits(x as f32).to_le_bytes()
        })
        .collect()
}

/// f32 -> f16 bits by truncation (normal range only; enough for test data).
fn half_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    if exp <= 0 {
        return sign;
    }
    sign | ((exp.min(30) as u16) << 10) | ((b >> 13) & 0x3ff) as u16
}

fn store(dir: &tempfile::TempDir, disk_blocks: u64, compression: DiskCompression) -> Store {
    let cfg = NodeConfig {
        ram_capacity: ByteSize::b(2 * BLOCK as u64),
        disk_path: Some(dir.path().join("data")),
        disk_capacity: ByteSize::b(disk_blocks * BLOCK as u64),
        high_watermark: 1.0,
        low_watermark: 1.0,
        max_block_size: ByteSize::b(BLOCK as u64),
        disk_compression: compression,
        ..Default::default()
    };
    Store::open(cfg, &mut Registry::default()).unwrap()
}

fn put(s: &Store, i: u32, durable: bool) {
    let opts = PutOptions {
        durable,
        ..Default::default()
    };
    s.put(key(i), layout(), &f16_block(i), opts).unwrap();
}

fn read(s: &Store, i: u32) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; BLOCK];
    s.get_into(&key(i), 0, &mut buf).unwrap().map(|_| buf)
}

fn disk(s: &Store) -> crate::TierStats {
    s.stats()
        .tiers
        .into_iter()
        .find(|x| x.tier == Tier::Disk)
        .unwrap()
}

/// Blocks put until the disk tier first evicts: how many fit in its bytes.
/// (In steady state variable-size extents fragment a little: with LRU
/// eviction this data then holds 34 compressed blocks against 30 raw.)
#[test]
fn compressed_disk_holds_more_f16_blocks_in_the_same_bytes() {
    let mut held = Vec::new();
    for compression in [DiskCompression::Off, DiskCompression::Auto] {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir, 30, compression);
        let mut fitted = 0;
        for i in 0..60 {
            put(&s, i, false);
            let d = disk(&s);
            if d.evictions > 0 {
                break;
            }
            fitted = d.blocks;
        }
        // Blocks read back bit-exact (promoted from disk and decoded; reads
        // move blocks between the tiers, so not all of them stay held).
        let mut present = 0;
        for i in 0..=fitted as u32 {
            if let Some(b) = read(&s, i) {
                assert_eq!(b, f16_block(i), "block {i}");
                present += 1;
            }
        }
        assert!(present >= fitted / 2, "{present} of {fitted} read back");
        assert_eq!(disk(&s).checksum_failures, 0);
        held.push(fitted);
    }
    let (raw, compressed) = (held[0] as f64, held[1] as f64);
    assert_eq!(raw, 30.0);
    assert!(
        compressed >= 1.15 * raw,
        "{compressed} compressed blocks vs {raw} raw in the same bytes"
    );
}

/// Damage `len` bytes at `at` of the data file.
fn damage(dir: &tempfile::TempDir, at: u64, len: usize) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("data"))
        .unwrap();
    f.write_all_at(&vec![0x5a; len], at).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn a_corrupt_compressed_block_is_a_miss() {
    // Damage in the header (does not decode), and in the body (decodes to
    // wrong bytes, which the checksum of the decoded block catches).
    for (at, len) in [(0u64, 16usize), (100_000, 64)] {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = store(&dir, 8, DiskCompression::Auto);
            put(&s, 1, true);
            let used = disk(&s).used_bytes;
            assert!(used < BLOCK as u64, "stored compressed: {used} bytes");
        }
        damage(&dir, at, len);
        let s = store(&dir, 8, DiskCompression::Auto);
        assert_eq!(s.exists(&[key(1)]), vec![true]);
        assert!(
            read(&s, 1).is_none(),
            "corrupt bytes must never be returned"
        );
        let d = disk(&s);
        assert_eq!(d.checksum_failures, 1);
        assert_eq!(d.blocks, 0, "slot dropped");
    }
}

#[test]
fn blocks_read_back_whatever_codec_wrote_them() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = store(&dir, 8, DiskCompression::Off);
        put(&s, 1, true);
        assert_eq!(disk(&s).used_bytes, BLOCK as u64, "raw");
    }
    {
        let s = store(&dir, 8, DiskCompression::Auto);
        assert_eq!(read(&s, 1).unwrap(), f16_block(1));
        put(&s, 2, true);
    }
    let s = store(&dir, 8, DiskCompression::Off);
    assert_eq!(read(&s, 2).unwrap(), f16_block(2));
    assert_eq!(read(&s, 1).unwrap(), f16_block(1));
    assert_eq!(disk(&s).checksum_failures, 0);
}

/// The demotion path's pre-check: random bytes (nothing to spare) are not
/// encoded at all, f16 K/V-like blocks are, and random blocks still go to
/// disk raw and read back.
#[test]
fn incompressible_blocks_are_not_encoded() {
    use crate::disk_codec::{compress, Compressed};
    let mut s = 0x0123_4567_89AB_CDEFu64;
    let random: Vec<u8> = (0..BLOCK)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect();
    assert_eq!(compress(&random, &layout()), Compressed::Skipped);
    assert!(matches!(
        compress(&f16_block(3), &layout()),
        Compressed::Encoded(_)
    ));
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir, 8, DiskCompression::Auto);
    st.put(key(9), layout(), &random, PutOptions::default())
        .unwrap();
    for i in 0..3 {
        put(&st, i, false);
    }
    let mut buf = vec![0u8; BLOCK];
    assert!(st.get_into(&key(9), 0, &mut buf).unwrap().is_some());
    assert_eq!(buf, random);
}

/// f16 blocks take the codec's fast profile where it is no larger, the
/// compact one where Huffman saves a unit more; both read back bit-exact.
#[test]
fn f16_blocks_take_the_smaller_of_the_fast_and_compact_encodings() {
    use crate::disk_codec::{block_bytes, compress, Compressed, DiskCodec};
    use kvfabric_codec::{Header, VERSION, VERSION_FAST};
    // KV-like values in a narrow band per channel (the window code's case)
    // and the wider synthetic block above (Huffman's).
    let narrow = kvfabric_codec::sample::kv_like(2, BLOCK, 7);
    for (data, version) in [(narrow, VERSION_FAST), (f16_block(5), VERSION)] {
        let Compressed::Encoded(enc) = compress(&data, &layout()) else {
            panic!("f16 block not encoded");
        };
        assert_eq!(Header::parse(&enc).unwrap().version, version);
        let back = block_bytes(DiskCodec::Planes, &enc, data.len() as u64).unwrap();
        assert_eq!(&back[..], &data[..]);
    }
}
