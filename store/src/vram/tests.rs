//! The VRAM tier on a real GPU: put and get through staging, eviction into
//! RAM and promotion back (bit-exact), the eviction order, leases, refused
//! corrupt bytes (promotions checked on the GPU and on the host), bad writes, many threads on a small staging pool, and the
//! GPU-side consumer (the NVRTC digest of a leased block). Each test prints
//! why and returns when the host has no CUDA device (CI has none).

use std::sync::Arc;

use bytesize::ByteSize;
use kvfabric_transfer::cuda::device_count;
use kvfabric_transfer::cuda::kernels::{block_digest_host, Kernels};

use super::VramTier;
use crate::keys::{BlockKey, BlockOrder, DType, KvLayout};
use crate::metrics::{StoreMetrics, TierName};
use crate::node_config::{EvictionPolicy, NodeConfig, VramVerify};
use crate::store::{PutOptions, Store};
use crate::{BadArgument, NoRoom, Registry, StoreError};

const BLOCK: usize = 64 << 10;

fn layout() -> KvLayout {
    KvLayout {
        layers: 1,
        kv_heads: 1,
        head_dim: (BLOCK / 4) as u32,
        dtype: DType::F32,
        block_tokens: 1,
        order: BlockOrder::LayerKvTokenHead,
    }
}

fn key(i: u32) -> BlockKey {
    let mut k = [0u8; 32];
    k[..4].copy_from_slice(&i.to_le_bytes());
    k[4] = 0x76;
    BlockKey(k)
}

fn data(i: u32, len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(i);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Whether a GPU is here; prints why not.
fn gpu() -> bool {
    match device_count() {
        Ok(n) if n > 0 => true,
        Ok(_) => {
            eprintln!("skipped: no CUDA device on this host");
            false
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            false
        }
    }
}

/// A tier of `vram_blocks` blocks over a store of `ram_blocks`, LRU order,
/// evicting exactly as much as needed.
fn tier(vram_blocks: u64, ram_blocks: u64, f: impl FnOnce(&mut NodeConfig)) -> VramTier {
    let mut cfg = NodeConfig {
        ram_capacity: ByteSize::b(ram_blocks * BLOCK as u64),
        vram_capacity: ByteSize::b(vram_blocks * BLOCK as u64),
        vram_staging_slots: 8,
        vram_staging_slice: ByteSize::kib(16),
        vram_staging_depth: 3,
        high_watermark: 1.0,
        low_watermark: 1.0,
        max_block_size: ByteSize::b(4 * BLOCK as u64),
        eviction: EvictionPolicy::Lru,
        ..Default::default()
    };
    f(&mut cfg);
    let store = Store::open(cfg, &mut Registry::default()).unwrap();
    VramTier::open(&store).unwrap()
}

fn put(t: &VramTier, i: u32) {
    t.put(key(i), layout(), &data(i, BLOCK), PutOptions::default())
        .unwrap();
}

fn get(t: &VramTier, i: u32) -> Option<Vec<u8>> {
    let mut out = vec![0u8; BLOCK];
    t.get_into(&key(i), &mut out).unwrap().map(|_| out)
}

fn counted(t: &VramTier, f: impl Fn(&StoreMetrics) -> &crate::metrics::TierCounter) -> u64 {
    StoreMetrics::tier(f(&t.shared.metrics), TierName::Vram).get()
}

#[test]
fn put_and_get_are_bit_exact_and_the_gpu_reads_the_leased_block() {
    if !gpu() {
        return;
    }
    let t = tier(16, 16, |_| {});
    for i in 0..8 {
        put(&t, i);
    }
    for i in 0..8 {
        assert_eq!(get(&t, i).unwrap(), data(i, BLOCK), "block {i}");
    }
    assert_eq!(t.stats().blocks, 8);
    // Nothing went to RAM: puts go to VRAM alone, and the store sees them there.
    let info = t.store().block_infos(&[key(0)])[0].unwrap();
    assert_eq!(info.tier, crate::tier::Tier::Vram);
    assert_eq!(t.store().exists(&[key(0)]), vec![true]);
    // The GPU-side consumer: digest the leased block on the device.
    let kernels = Kernels::compile(t.device()).unwrap();
    let stream = t.device().new_stream().unwrap();
    for i in [0, 5] {
        let lease = t.lease(&key(i)).unwrap().unwrap();
        let on_gpu = kernels
            .digest(t.segment(), lease.offset() as usize, BLOCK, &stream)
            .unwrap();
        assert_eq!(on_gpu, block_digest_host(&data(i, BLOCK)), "block {i}");
    }
    // An odd length (not a multiple of the slice or of 8) round-trips too.
    let odd = data(99, 3 * 16 * 1024 + 13);
    t.put(key(99), layout(), &odd, PutOptions::default())
        .unwrap();
    let mut back = vec![0u8; odd.len()];
    t.get_into(&key(99), &mut back).unwrap().unwrap();
    assert_eq!(back, odd);
    let lease = t.lease(&key(99)).unwrap().unwrap();
    let d = kernels
        .digest(t.segment(), lease.offset() as usize, odd.len(), &stream)
        .unwrap();
    assert_eq!(d, block_digest_host(&odd));
}

#[test]
fn eviction_goes_to_ram_and_promotion_brings_it_back_bit_exact() {
    if !gpu() {
        return;
    }
    let t = tier(4, 32, |_| {});
    for i in 0..10 {
        put(&t, i);
    }
    assert_eq!(t.stats().blocks, 4);
    assert_eq!(counted(&t, |m| &m.evictions), 6);
    assert_eq!(counted(&t, |m| &m.demotions), 6);
    for i in 0..6 {
        assert_eq!(t.contains(&[key(i)]), vec![false], "block {i} evicted");
        let mut out = vec![0u8; BLOCK];
        t.store().get_into(&key(i), 0, &mut out).unwrap().unwrap();
        assert_eq!(out, data(i, BLOCK), "RAM copy of {i}");
    }
    // A lease promotes from RAM; the bytes in VRAM are the block's.
    let lease = t.lease(&key(2)).unwrap().unwrap();
    assert_eq!(lease.info().tier, crate::tier::Tier::Vram);
    drop(lease);
    assert_eq!(counted(&t, |m| &m.promotions), 1);
    assert_eq!(t.contains(&[key(2)]), vec![true]);
    assert_eq!(get(&t, 2).unwrap(), data(2, BLOCK));
    // Evicting a promoted block again costs no copy (RAM still has it) and loses nothing.
    for i in 20..24 {
        put(&t, i);
    }
    assert_eq!(t.contains(&[key(2)]), vec![false]);
    assert_eq!(get(&t, 2).unwrap(), data(2, BLOCK), "read from RAM");
}

#[test]
fn a_full_tier_evicts_in_policy_order_and_never_a_leased_block() {
    if !gpu() {
        return;
    }
    let t = tier(4, 32, |_| {});
    for i in 0..4 {
        put(&t, i);
    }
    // LRU: reading 0 makes 1 the oldest.
    drop(t.lease(&key(0)).unwrap().unwrap());
    put(&t, 4);
    assert_eq!(
        t.contains(&[key(0), key(1), key(2)]),
        vec![true, false, true]
    );
    // A leased block is skipped: 2 is the oldest, but leased.
    let held = t.lease(&key(2)).unwrap().unwrap();
    put(&t, 5);
    assert_eq!(t.contains(&[key(2), key(3)]), vec![true, false]);
    // Every block leased: no room, an error, nothing lost.
    let rest: Vec<_> = [0, 4, 5]
        .iter()
        .map(|i| t.lease(&key(*i)).unwrap().unwrap())
        .collect();
    let err = t
        .put(key(6), layout(), &data(6, BLOCK), PutOptions::default())
        .unwrap_err();
    assert!(
        matches!(err, StoreError::ResourceExhausted(NoRoom::VramPinned)),
        "{err}"
    );
    drop(rest);
    drop(held);
    put(&t, 6);
    for i in 0..7 {
        assert_eq!(get(&t, i).unwrap(), data(i, BLOCK), "block {i}");
    }
}

#[test]
fn corrupt_bytes_in_vram_or_ram_are_refused_not_handed_out() {
    if !gpu() {
        return;
    }
    let t = tier(4, 32, |_| {});
    put(&t, 1);
    // Corrupt the VRAM copy: the staged bytes of the next read do not hash
    // to the block's checksum.
    let lease = t.lease(&key(1)).unwrap().unwrap();
    t.segment()
        .copy_in(lease.offset() as usize + 100, &[0xAA; 8])
        .unwrap();
    drop(lease);
    let mut out = vec![0u8; BLOCK];
    assert!(t.get_into(&key(1), &mut out).unwrap().is_none(), "refused");
    assert_eq!(counted(&t, |m| &m.checksum_failures), 1);
    assert_eq!(t.contains(&[key(1)]), vec![false], "dropped from VRAM");
    // Corrupt in VRAM, then evicted: RAM does not take it.
    put(&t, 2);
    let lease = t.lease(&key(2)).unwrap().unwrap();
    t.segment()
        .copy_in(lease.offset() as usize, &[0x55; 8])
        .unwrap();
    drop(lease);
    for i in 10..14 {
        put(&t, i);
    }
    assert_eq!(counted(&t, |m| &m.checksum_failures), 2);
    assert_eq!(t.store().exists(&[key(2)]), vec![false]);
    // Corrupt the RAM copy: the promotion's staged bytes fail, VRAM refuses it.
    let store = t.store();
    store
        .put(key(3), layout(), &data(3, BLOCK), PutOptions::default())
        .unwrap();
    let ram = store.lease(&key(3)).unwrap().unwrap();
    // SAFETY: a test flips one byte of a committed block it leases.
    unsafe {
        store
            .region()
            .slice_mut(ram.region_offset() as usize + 7, 1)
            .unwrap()[0] ^= 1
    };
    drop(ram);
    assert!(t.lease(&key(3)).unwrap().is_none());
    assert_eq!(counted(&t, |m| &m.checksum_failures), 3);
    assert_eq!(t.contains(&[key(3)]), vec![false]);
    // Blocks stored before are untouched.
    for i in 10..14 {
        assert_eq!(get(&t, i).unwrap(), data(i, BLOCK));
    }
}

#[test]
fn promotions_are_checked_alike_on_the_device_and_on_the_host() {
    if !gpu() {
        return;
    }
    // Lengths: a block, odd tails, one just over XXH3's short path and one
    // on it (the device mode hashes that one on the host).
    let lens = [BLOCK, BLOCK - 13, 3 * 1024 + 5, 241, 200];
    for mode in [VramVerify::Device, VramVerify::Host] {
        let t = tier(8, 32, |c| c.vram_verify = mode);
        assert_eq!(t.verifies_on_device(), mode == VramVerify::Device);
        let store = t.store();
        for (i, len) in lens.iter().enumerate() {
            let i = i as u32;
            store
                .put(key(i), layout(), &data(i, *len), PutOptions::default())
                .unwrap();
            let lease = t.lease(&key(i)).unwrap().unwrap();
            assert_eq!(lease.info().tier, crate::tier::Tier::Vram);
            drop(lease);
            let mut back = vec![0u8; *len];
            t.get_into(&key(i), &mut back).unwrap().unwrap();
            assert_eq!(back, data(i, *len), "{mode:?} len {len}");
        }
        assert_eq!(counted(&t, |m| &m.promotions), lens.len() as u64);
        // A RAM copy with one flipped byte is refused, whichever checks it.
        for (i, at) in [(10u32, 7usize), (11, BLOCK - 1)] {
            store
                .put(key(i), layout(), &data(i, BLOCK), PutOptions::default())
                .unwrap();
            let ram = store.lease(&key(i)).unwrap().unwrap();
            // SAFETY: a test flips one byte of a committed block it leases.
            unsafe {
                store
                    .region()
                    .slice_mut(ram.region_offset() as usize + at, 1)
                    .unwrap()[0] ^= 1
            };
            drop(ram);
            assert!(t.lease(&key(i)).unwrap().is_none(), "{mode:?} byte {at}");
            assert_eq!(t.contains(&[key(i)]), vec![false]);
        }
        assert_eq!(counted(&t, |m| &m.checksum_failures), 2, "{mode:?}");
    }
}

#[test]
fn bad_writes_and_checksums_store_nothing_and_free_their_room() {
    if !gpu() {
        return;
    }
    let t = tier(4, 8, |_| {});
    let d = data(1, BLOCK);
    let err = t
        .put(
            key(1),
            layout(),
            &d,
            PutOptions {
                checksum: Some(1),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::InvalidArgument(BadArgument::ChecksumMismatch { .. })
        ),
        "{err}"
    );
    let super::VramReserveOutcome::Reserved(mut r) =
        t.reserve(key(2), layout(), BLOCK as u64, 0).unwrap()
    else {
        panic!("not present yet");
    };
    let err = r.write(4096, &d[..4096]).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::InvalidArgument(BadArgument::OutOfOrderWrite { .. })
        ),
        "{err}"
    );
    r.write(0, &d[..4096]).unwrap();
    let err = r.commit(None).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::InvalidArgument(BadArgument::ShortWrite { .. })
        ),
        "{err}"
    );
    let err = t
        .put(
            key(3),
            layout(),
            &d,
            PutOptions {
                durable: true,
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(err, StoreError::InvalidArgument(BadArgument::DurableVram)),
        "{err}"
    );
    assert_eq!(t.stats().used, 0, "every failed put freed its room");
    assert_eq!(t.stats().blocks, 0);
    // A checksum that matches commits.
    let sum = kvfabric_transfer::checksum::checksum(&d);
    t.put(
        key(1),
        layout(),
        &d,
        PutOptions {
            checksum: Some(sum),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(get(&t, 1).unwrap(), d);
}

#[test]
fn many_threads_on_a_small_staging_pool_stay_bit_exact() {
    if !gpu() {
        return;
    }
    let t = Arc::new(tier(8, 256, |c| c.vram_staging_slots = 4));
    let threads: Vec<_> = (0..8u32)
        .map(|w| {
            let t = t.clone();
            std::thread::spawn(move || {
                for round in 0..12u32 {
                    let i = w * 100 + round;
                    put(&t, i);
                    let back = t.lease(&key(i)).unwrap().map(|_| get(&t, i).unwrap());
                    if let Some(b) = back {
                        assert_eq!(b, data(i, BLOCK));
                    }
                    let earlier = w * 100 + round / 2;
                    assert_eq!(get(&t, earlier).unwrap(), data(earlier, BLOCK));
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    assert_eq!(counted(&t, |m| &m.checksum_failures), 0);
    assert!(t.stats().blocks <= 8);
}

#[test]
fn the_change_feed_follows_blocks_into_and_out_of_vram() {
    use crate::changes::{BlockChange, ChangeFeed};
    if !gpu() {
        return;
    }
    let t = tier(4, 2, |_| {});
    let feed = Arc::new(ChangeFeed::new());
    t.store().watch_changes(feed.clone());
    let mut events = feed.subscribe();
    let next = |events: &mut tokio::sync::broadcast::Receiver<crate::changes::KvEventRecord>| {
        let e = events.try_recv().unwrap();
        (e.key, e.change, e.tier)
    };
    use crate::tier::Tier;
    put(&t, 1);
    assert_eq!(next(&mut events), (key(1), BlockChange::Stored, Tier::Vram));
    // Copied down into RAM by a store reader: still fastest in VRAM.
    let mut out = vec![0u8; BLOCK];
    t.store().get_into(&key(1), 0, &mut out).unwrap().unwrap();
    assert_eq!(out, data(1, BLOCK));
    assert_eq!(next(&mut events), (key(1), BlockChange::Stored, Tier::Vram));
    // RAM (2 blocks) drops it while VRAM holds it: a tier change, not a removal.
    for i in 10..12 {
        t.store()
            .put(key(i), layout(), &data(i, BLOCK), PutOptions::default())
            .unwrap();
    }
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push((e.key, e.change, e.tier));
    }
    assert!(
        seen.contains(&(key(1), BlockChange::Tier, Tier::Vram)),
        "{seen:?}"
    );
    assert!(!seen
        .iter()
        .any(|e| e.0 == key(1) && e.1 == BlockChange::Removed));
    // Dropped from VRAM with no copy below: removed.
    t.remove(&[key(1)]);
    assert_eq!(
        next(&mut events),
        (key(1), BlockChange::Removed, Tier::Absent)
    );
}
