//! Store-level tests of the tiers' per-tenant shares (`shares`): one tenant
//! writing three times a tier does not evict another tenant's blocks while
//! that tenant is at or under its share, in RAM (every eviction policy) and
//! on disk.

use std::path::Path;

use bytesize::ByteSize;
use kvfabric_tenants::Tenants;

use crate::keys::{BlockKey, BlockOrder, DType, KvLayout};
use crate::node_config::{DiskAdmission, EvictionPolicy, NodeConfig};
use crate::store::{PutOptions, Store};
use crate::{Owner, Registry};

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

fn key(tenant: u8, i: u32) -> BlockKey {
    let mut k = [tenant; 32];
    k[..4].copy_from_slice(&i.to_le_bytes());
    BlockKey(k)
}

fn data(tenant: u8, i: u32) -> Vec<u8> {
    (0..BLOCK)
        .map(|j| (j as u32).wrapping_mul(31).wrapping_add(i) as u8 ^ tenant)
        .collect()
}

/// A store of `ram_blocks` blocks of RAM (and `disk_blocks` of disk) with
/// the tenants file `tenants` in force.
fn store(
    dir: &tempfile::TempDir,
    policy: EvictionPolicy,
    ram_blocks: u64,
    disk_blocks: u64,
    tenants: &str,
) -> Store {
    let cfg = NodeConfig {
        ram_capacity: ByteSize::b(ram_blocks * BLOCK as u64),
        disk_path: (disk_blocks > 0).then(|| dir.path().join("data")),
        disk_capacity: ByteSize::b(disk_blocks.max(1) * BLOCK as u64),
        disk_admission: DiskAdmission::All,
        high_watermark: 1.0,
        low_watermark: 1.0,
        max_block_size: ByteSize::b(4 * BLOCK as u64),
        eviction: policy,
        // The store reads no file: this turns the shares on.
        tenants_file: Some(dir.path().join("tenants.toml")),
        ..Default::default()
    };
    let s = Store::open(cfg, &mut Registry::default()).expect("open");
    let t = Tenants::parse(tenants, Path::new("tenants.toml")).expect("tenants file");
    s.set_shares(&t);
    s
}

fn put(s: &Store, owner: Owner, tenant: u8, i: u32) {
    put_with(s, owner, tenant, i, false)
}

fn put_with(s: &Store, owner: Owner, tenant: u8, i: u32, durable: bool) {
    let opts = PutOptions {
        owner,
        durable,
        ..Default::default()
    };
    s.put(key(tenant, i), layout(), &data(tenant, i), opts)
        .expect("put");
}

/// How many of `tenant`'s blocks `0..n` read back bit-identical.
fn present(s: &Store, tenant: u8, n: u32) -> u32 {
    let mut buf = vec![0u8; BLOCK];
    (0..n)
        .filter(|&i| {
            let found = s.get_into(&key(tenant, i), 0, &mut buf).expect("read");
            found.is_some() && buf == data(tenant, i)
        })
        .count() as u32
}

const TWO: &str = "[[tenants]]\nname = \"a\"\n[[tenants]]\nname = \"b\"\n";

#[test]
fn a_tenant_filling_ram_keeps_off_another_under_its_share() {
    for policy in [
        EvictionPolicy::Lru,
        EvictionPolicy::S3fifo,
        EvictionPolicy::Lirs,
    ] {
        let dir = tempfile::tempdir().expect("dir");
        // 32 blocks of RAM, 16 each by default.
        let s = store(&dir, policy, 32, 0, TWO);
        let (a, b) = (s.owner("a"), s.owner("b"));
        for i in 0..14 {
            put(&s, b, b'b', i);
        }
        for i in 0..96 {
            put(&s, a, b'a', i);
        }
        assert_eq!(
            present(&s, b'b', 14),
            14,
            "{policy:?}: b under its share lost blocks"
        );
        assert!(present(&s, b'a', 96) >= 16, "{policy:?}: a keeps the rest");
        let u = s.tenant_usage();
        let of = |n: &str| u.iter().find(|x| &*x.owner == n).expect("owner").clone();
        assert_eq!(of("b").ram_used, 14 * BLOCK as u64);
        assert_eq!(of("b").ram_share, 16 * BLOCK as u64);
        assert_eq!(of("a").ram_used, 18 * BLOCK as u64);
    }
}

#[test]
fn a_tenant_over_its_share_keeps_its_share() {
    let dir = tempfile::tempdir().expect("dir");
    let file = "[[tenants]]\nname = \"a\"\n[[tenants]]\nname = \"b\"\nram_share = 0.25\n";
    let s = store(&dir, EvictionPolicy::Lirs, 32, 0, file);
    let (a, b) = (s.owner("a"), s.owner("b"));
    for i in 0..20 {
        put(&s, b, b'b', i);
    }
    for i in 0..96 {
        put(&s, a, b'a', i);
    }
    // b's share is 8 blocks: it keeps them (not more: a's share is 24).
    assert_eq!(present(&s, b'b', 20), 8);
    // Nobody's blocks (a trusted caller naming no owner) have no share.
    for i in 0..4 {
        put(&s, Owner::NONE, b'n', i);
    }
    assert_eq!(present(&s, b'b', 20), 8, "nobody's puts evict a's, not b's");
}

#[test]
fn a_tenant_filling_disk_keeps_off_another_under_its_share() {
    let dir = tempfile::tempdir().expect("dir");
    // 8 blocks of RAM, 64 of disk: 32 of disk each.
    let s = store(&dir, EvictionPolicy::Lru, 8, 64, TWO);
    let (a, b) = (s.owner("a"), s.owner("b"));
    for i in 0..24 {
        put(&s, b, b'b', i);
    }
    for i in 0..192 {
        put(&s, a, b'a', i);
    }
    assert_eq!(
        present(&s, b'b', 24),
        24,
        "b under its disk share lost blocks"
    );
    let u = s.tenant_usage();
    let b_use = u.iter().find(|x| &*x.owner == "b").expect("b");
    assert!(b_use.disk_used >= 20 * BLOCK as u64, "{b_use:?}");
}

#[test]
fn owners_and_shares_survive_a_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let disk_of = |s: &Store, n: &str| {
        s.tenant_usage()
            .iter()
            .find(|x| &*x.owner == n)
            .map_or(0, |x| x.disk_used)
    };
    let before = {
        // 8 blocks of RAM, 64 of disk: 32 of disk each.
        let s = store(&dir, EvictionPolicy::Lru, 8, 64, TWO);
        let (a, b) = (s.owner("a"), s.owner("b"));
        for i in 0..24 {
            put_with(&s, b, b'b', i, true);
        }
        for i in 0..8 {
            put_with(&s, a, b'a', i, true);
        }
        (disk_of(&s, "a"), disk_of(&s, "b"))
    };
    assert!(before.1 > 0 && before.0 > 0, "{before:?}");
    // The reopened store (the node restarted) counts the recovered blocks
    // to their owners, not to nobody.
    let s = store(&dir, EvictionPolicy::Lru, 8, 64, TWO);
    assert_eq!((disk_of(&s, "a"), disk_of(&s, "b")), before);
    assert_eq!(disk_of(&s, "default"), 0, "no block recovered unowned");
    // And the shares hold: a writing three times the disk leaves b's
    // recovered blocks (under its share) in place.
    let a = s.owner("a");
    for i in 8..200 {
        put(&s, a, b'a', i);
    }
    assert_eq!(
        present(&s, b'b', 24),
        24,
        "b's recovered blocks under its disk share were evicted"
    );
}

#[test]
fn without_a_tenants_file_nothing_is_protected() {
    let dir = tempfile::tempdir().expect("dir");
    let cfg = NodeConfig {
        ram_capacity: ByteSize::b(32 * BLOCK as u64),
        high_watermark: 1.0,
        low_watermark: 1.0,
        max_block_size: ByteSize::b(4 * BLOCK as u64),
        eviction: EvictionPolicy::Lru,
        ..Default::default()
    };
    let s = Store::open(cfg, &mut Registry::default()).expect("open");
    let t = Tenants::parse(TWO, Path::new("t.toml")).expect("tenants");
    s.set_shares(&t);
    let (a, b) = (s.owner("a"), s.owner("b"));
    for i in 0..14 {
        put(&s, b, b'b', i);
    }
    for i in 0..96 {
        put(&s, a, b'a', i);
    }
    // Single-tenant store: plain LRU, bytes still counted.
    assert_eq!(present(&s, b'b', 14), 0);
    let _ = dir;
    let u = s.tenant_usage();
    assert_eq!(
        u.iter().find(|x| &*x.owner == "a").map(|x| x.ram_used),
        Some(32 * BLOCK as u64)
    );
}
