//! Behaviour tests of [`Store`]: tiers, eviction, demotion/promotion, pins,
//! leases, two-phase puts, zombies, idempotence, corruption on disk.

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use crate::tier::Tier;
use bytesize::ByteSize;

use crate::keys::{BlockKey, BlockOrder, DType, KvLayout};
use crate::node_config::{DiskAdmission, EvictionPolicy, NodeConfig, WritePolicy};
use crate::store::{PutOptions, ReserveOutcome, Store};
use crate::{Registry, StoreError};

const BLOCK: usize = 8192;

fn layout() -> KvLayout {
    KvLayout {
        layers: 1,
        kv_heads: 1,
        head_dim: 1024,
        dtype: DType::F32,
        block_tokens: 1,
        order: BlockOrder::LayerKvTokenHead,
    }
}

fn key(i: u32) -> BlockKey {
    let mut k = [0u8; 32];
    k[..4].copy_from_slice(&i.to_le_bytes());
    BlockKey(k)
}

fn data(i: u32) -> Vec<u8> {
    (0..BLOCK)
        .map(|j| (j as u32).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}

/// A store with `ram_blocks` blocks of RAM and, with `disk`, a 64-block disk tier.
fn store(
    dir: &tempfile::TempDir,
    ram_blocks: u64,
    disk: bool,
    f: impl FnOnce(&mut NodeConfig),
) -> Store {
    let mut cfg = NodeConfig {
        ram_capacity: ByteSize::b(ram_blocks * BLOCK as u64),
        disk_path: disk.then(|| dir.path().join("data")),
        disk_capacity: ByteSize::b(64 * BLOCK as u64),
        high_watermark: 1.0,
        low_watermark: 1.0,
        max_block_size: ByteSize::b(4 * BLOCK as u64),
        // These tests name LRU victims; policy::lirs_tests run the default (LIRS) in a store.
        eviction: EvictionPolicy::Lru,
        ..Default::default()
    };
    f(&mut cfg);
    Store::open(cfg, &mut Registry::default()).unwrap()
}

fn put(s: &Store, i: u32) -> crate::PutOutcome {
    s.put(key(i), layout(), &data(i), PutOptions::default())
        .unwrap()
}

fn read(s: &Store, i: u32) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; BLOCK];
    s.get_into(&key(i), 0, &mut buf).unwrap().map(|_| buf)
}

fn tier(s: &Store, t: Tier) -> crate::TierStats {
    s.stats().tiers.into_iter().find(|x| x.tier == t).unwrap()
}

#[test]
fn filling_past_ram_demotes_to_disk_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir, 4, true, |_| {});
    for i in 0..12 {
        put(&s, i);
    }
    let (ram, disk) = (tier(&s, Tier::Ram), tier(&s, Tier::Disk));
    assert!(ram.blocks <= 4);
    assert!(ram.demotions >= 8, "demotions {}", ram.demotions);
    assert!(disk.blocks >= 8);
    for i in 0..12 {
        assert_eq!(read(&s, i).unwrap(), data(i), "block {i}");
    }
    assert!(tier(&s, Tier::Ram).promotions >= 8);
    assert!(tier(&s, Tier::Disk).hits >= 8);
}

#[test]
fn without_disk_eviction_drops_lru_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir, 4, false, |_| {});
    for i in 0..4 {
        put(&s, i);
    }
    read(&s, 0).unwrap(); // 0 becomes most recent: 1 is the LRU victim
    put(&s, 4);
    assert!(read(&s, 1).is_none());
    assert!(read(&s, 0).is_some());
    assert_eq!(tier(&s, Tier::Ram).evictions, 1);
}

#[test]
fn watermarks_evict_down_to_low() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir, 10, false, |c| {
        c.high_watermark = 0.8;
        c.low_watermark = 0.5;
    });
    for i in 0..8 {
        put(&s, i);
    }
    assert_eq!(tier(&s, Tier::Ram).blocks, 8);
    put(&s, 8); // crosses 80%: evict until the new block fits under 50%
    assert_eq!(tier(&s, Tier::Ram).blocks, 5);
}

#[test]
fn flipped_bytes_on_disk_are_a_miss_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = store(&dir, 4, true, |_| {});
        s.put(
            key(1),
            layout(),
            &data(1),
            PutOptions {
                durable: true,
                ..Default::default()
            },
        )
        .unwrap();
    }
    // Damage every byte of the first data extent (where block 1 lives).
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("data"))
        .unwrap();
    f.write_all_at(&vec![0x5a; BLOCK], 0).unwrap();
    f.sync_all().unwrap();
    let s = store(&dir, 4, true, |_| {});
    assert_eq!(s.exists(&[key(1)]), vec![true]);
    assert!(
        read(&s, 1).is_none(),
        "corrupt bytes must never be returned"
    );
    let disk = tier(&s, Tier::Disk);
    assert_eq!(disk.checksum_failures, 1);
    assert_eq!(disk.blocks, 0, "slot dropped");
    assert_eq!(s.exists(&[key(1)]), vec![false]);
}

#[test]
fn a_range_read_from_disk_is_verified_over_the_whole_block() {
    let dir = tempfile::tempdir().unwrap();
    let durable = PutOptions {
        durable: true,
        ..Default::default()
    };
    {
        let s = store(&dir, 4, true, |_| {});
        s.put(key(1), layout(), &data(1), durable).unwrap();
    }
    {
        // Cold: the range comes out of the promotion's verifying pass.
        let s = store(&dir, 4, true, |_| {});
        let mut part = vec![0u8; 1000];
        assert!(s.get_into(&key(1), 100, &mut part).unwrap().is_some());
        assert_eq!(part, data(1)[100..1100]);
        let mut over = vec![0u8; 100];
        let err = s.get_into(&key(1), (BLOCK - 10) as u64, &mut over);
        assert!(matches!(err, Err(crate::StoreError::InvalidArgument(_))));
        assert_eq!(read(&s, 1).unwrap(), data(1), "a bad range damages nothing");
    }
    {
        // A bad range on a cold block is refused before any disk read.
        let s = store(&dir, 4, true, |_| {});
        let mut over = vec![0u8; 100];
        let err = s.get_into(&key(1), (BLOCK - 10) as u64, &mut over);
        assert!(matches!(err, Err(crate::StoreError::InvalidArgument(_))));
        assert_eq!(tier(&s, Tier::Ram).blocks, 0, "nothing promoted");
    }
    // One flipped byte outside the range wanted: still a miss.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("data"))
        .unwrap();
    f.write_all_at(&[data(1)[BLOCK - 1] ^ 1], (BLOCK - 1) as u64)
        .unwrap();
    f.sync_all().unwrap();
    let s = store(&dir, 4, true, |_| {});
    let mut part = vec![0u8; 100];
    assert!(s.get_into(&key(1), 0, &mut part).unwrap().is_none());
    assert_eq!(tier(&s, Tier::Disk).checksum_failures, 1);
}

#[test]
fn hard_and_soft_pins_survive_pressure_until_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir, 4, false, |_| {});
    put(&s, 0);
    put(&s, 1);
    assert_eq!(s.pin(&[key(0)], None), 1);
    assert_eq!(s.pin(&[key(1)], Some(Duration::from_millis(150))), 1);
    for i in 2..20 {
        put(&s, i);
    }
    assert_eq!(read(&s, 0).unwrap(), data(0));
    assert_eq!(read(&s, 1).unwrap(), data(1));
    std::thread::sleep(Duration::from_millis(200));
    for i in 20..30 {
        put(&s, i);
    }
    assert!(read(&s, 1).is_none(), "soft pin expired");
    assert_eq!(read(&s, 0).unwrap(), data(0), "hard pin holds");
    assert_eq!(s.unpin(&[key(0), key(1)]), 1);
}

#[test]
fn all_pinned_and_no_room_is_resource_exhausted_and_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir, 2, false, |_| {});
    put(&s, 0);
    put(&s, 1);
    s.pin(&[key(0), key(1)], None);
    let err = s
        .put(key(2), layout(), &data(2), PutOptions::default())
        .unwrap_err();
    assert!(matches!(err, StoreError::ResourceExhausted(_)), "{err}");
    assert_eq!(read(&s, 0).unwrap(), data(0));
    assert_eq!(read(&s, 1).unwrap(), data(1));
}

#[test]
fn a_lease_blocks_eviction_during_a_slow_read() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir, 2, false, |_| {});
    put(&s, 0);
    put(&s, 1);
    let lease = s.lease(&key(0)).unwrap().unwrap();
    // Pressure while the (slow) reader holds block 0: block 1 goes, block 0 stays.
    let s2 = s.clone();
    let writer = std::thread::spawn(move || put(&s2, 2));
    writer.join().unwrap();
    assert_eq!(lease.bytes(), &data(0)[..]);
    assert!(s.exists(&[key(1)]) == vec![false]);
    // Every block leased: no room while the leases live.
    let lease2 = s.lease(&key(2)).unwrap().unwrap();
    let err = s
        .put(key(3), layout(), &data(3), PutOptions::default())
        .unwrap_err();
    assert!(matches!(err, StoreError::ResourceExhausted(_)));
    // Removal while leased defers the free: the reader still sees its bytes.
    assert_eq!(s.remove(&[key(0)]).unwrap(), 1);
    assert_eq!(lease.bytes(), &data(0)[..]);
    drop(lease);
    put(&s, 3);
    assert_eq!(lease2.bytes(), &data(2)[..]);
    assert_eq!(read(&s, 3).unwrap(), data(3));
}

#[test]
fn zombie_reservations_are_reclaimed_and_cannot_commit() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir, 2, false, |c| c.reservation_timeout_ms = 50);
    let ReserveOutcome::Reserved(mut zombie) =
        s.reserve(key(9), layout(), BLOCK as u64, 0, false).unwrap()
    else {
        panic!("not reserved")
    };
    zombie.write(0, &data(9)).unwrap();
    assert_eq!(tier(&s, Tier::Ram).used_bytes, BLOCK as u64);
    std::thread::sleep(Duration::from_millis(120));
    s.reap_zombies(); // the background reaper may have done it already
    assert_eq!(tier(&s, Tier::Ram).used_bytes, 0, "room reclaimed");
    assert!(matches!(
        zombie.write(0, &data(9)),
        Err(StoreError::ReservationExpired { .. })
    ));
    assert!(matches!(
        zombie.commit(None),
        Err(StoreError::ReservationExpired { .. })
    ));
    assert_eq!(s.exists(&[key(9)]), vec![false]);
    // The room is usable again.
    put(&s, 0);
    put(&s, 1);
}

#[test]
fn dropped_or_failed_reservations_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir, 4, false, |_| {});
    if let ReserveOutcome::Reserved(r) =
        s.reserve(key(1), layout(), BLOCK as u64, 0, false).unwrap()
    {
        drop(r);
    }
    assert_eq!(tier(&s, Tier::Ram).used_bytes, 0);
    let bad = s.put(
        key(1),
        layout(),
        &data(1),
        PutOptions {
            checksum: Some(1),
            ..Default::default()
        },
    );
    assert!(matches!(bad, Err(StoreError::InvalidArgument(_))));
    assert_eq!(s.exists(&[key(1)]), vec![false]);
    assert_eq!(tier(&s, Tier::Ram).used_bytes, 0);
    let sum = kvfabric_transfer::checksum::checksum(&data(1));
    s.put(
        key(1),
        layout(),
        &data(1),
        PutOptions {
            checksum: Some(sum),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(
        s.put(
            key(2),
            layout(),
            &vec![0u8; 5 * BLOCK],
            PutOptions::default()
        ),
        Err(StoreError::InvalidArgument(_))
    ));
}

#[test]
fn puts_are_idempotent_and_concurrent_puts_store_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir, 16, false, |_| {});
    assert!(!put(&s, 1).already_present);
    // A second put with different bytes changes nothing.
    let again = s
        .put(key(1), layout(), &data(2), PutOptions::default())
        .unwrap();
    assert!(again.already_present);
    assert_eq!(read(&s, 1).unwrap(), data(1));
    let s = Arc::new(s);
    let fresh: usize = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..8)
            .map(|_| sc.spawn(|| !put(&s, 7).already_present))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap() as usize).sum()
    });
    assert_eq!(fresh, 1, "exactly one put stored it");
    let ram = tier(&s, Tier::Ram);
    assert_eq!((ram.blocks, ram.used_bytes), (2, 2 * BLOCK as u64));
    assert_eq!(read(&s, 7).unwrap(), data(7));
}

#[test]
fn write_through_and_seen_twice_admission() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir, 8, true, |c| {
        c.write_policy = WritePolicy::WriteThrough
    });
    put(&s, 1);
    assert_eq!(
        tier(&s, Tier::Disk).blocks,
        1,
        "written through at put time"
    );

    let dir2 = tempfile::tempdir().unwrap();
    let s = store(&dir2, 2, true, |c| {
        c.disk_admission = DiskAdmission::SeenTwice
    });
    put(&s, 0);
    read(&s, 0).unwrap(); // seen twice: admitted on eviction
    put(&s, 1); // seen once: dropped on eviction
    put(&s, 2);
    put(&s, 3);
    assert_eq!(read(&s, 0).unwrap(), data(0));
    assert!(read(&s, 1).is_none());
}

#[test]
fn s3fifo_store_keeps_hot_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir, 8, false, |c| c.eviction = EvictionPolicy::S3fifo);
    for i in 0..8 {
        put(&s, i);
    }
    read(&s, 0).unwrap();
    read(&s, 1).unwrap();
    for i in 8..30 {
        put(&s, i);
    }
    assert!(read(&s, 0).is_some() && read(&s, 1).is_some());
}

#[test]
fn lookup_counts_the_present_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir, 8, false, |_| {});
    put(&s, 0);
    put(&s, 1);
    put(&s, 3);
    let found = s.lookup(&[key(0), key(1), key(2), key(3)]);
    assert_eq!(found.len(), 2);
    let st = s.stats();
    assert_eq!((st.hit_blocks, st.miss_blocks, st.hit_tokens), (2, 2, 2));
}

#[test]
fn checksum_is_right_for_in_order_and_out_of_order_writes() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir, 4, false, |_| {});
    let sum = |i| kvfabric_transfer::checksum::checksum(&data(i));
    for (i, order) in [(1u32, [0usize, 1]), (2, [1, 0])] {
        let ReserveOutcome::Reserved(mut r) =
            s.reserve(key(i), layout(), BLOCK as u64, 0, false).unwrap()
        else {
            panic!("not reserved")
        };
        let d = data(i);
        for half in order {
            let at = half * BLOCK / 2;
            r.write(at as u64, &d[at..at + BLOCK / 2]).unwrap();
        }
        r.commit(Some(sum(i))).unwrap();
        assert_eq!(s.lease(&key(i)).unwrap().unwrap().checksum(), sum(i));
    }
}
