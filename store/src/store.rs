//! `Store`: one node's block cache (RAM arena + optional disk tier) and the
//! local data path the connector uses without gRPC copies.
//!
//! A `Store` is a cheap clone of an `Arc`. Its methods block (disk I/O waits
//! on the io_uring thread), so async callers run them under
//! `tokio::task::spawn_blocking`. Puts are two-phase ([`Store::reserve`] ->
//! [`Reservation::write`] -> [`Reservation::commit`]) or one call
//! ([`Store::put`]); reads take a [`ReadLease`] or copy into a caller buffer.

use std::sync::atomic::AtomicU8;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use kvfabric_transfer::checksum::Checksummer;
use kvfabric_transfer::SharedRegion;
use parking_lot::Mutex;
use prometheus_client::registry::Registry;

use crate::block_info::{BlockInfo, PutOutcome};
use crate::changes::ChangeFeed;
use crate::disk::{DiskTier, DISK_ALIGN};
use crate::keys::{BlockKey, KvLayout};
use crate::lifecycle::{RangeCopy, ReadLease, Reservation};
use crate::metrics::{OpName, StoreMetrics, TierName};
use crate::node_config::NodeConfig;
use crate::planner::CapacityReport;
use crate::state::{Block, Inner, ReservationSlot, RES_CLOSED, RES_IDLE};
use crate::store_core::Shared;
use crate::tenant_shares::{Owner, TierIx};
use crate::tier::Tier;
use crate::{BadArgument, StoreError};

/// Options of a one-call put.
#[derive(Clone, Copy, Debug, Default)]
pub struct PutOptions {
    /// Acknowledge only once on disk with a synced index entry.
    pub durable: bool,
    /// Tokens the block covers (metrics); 0 = the layout's block_tokens.
    pub tokens: u32,
    /// Expected xxh3-64 of the data; a mismatch fails the put.
    pub checksum: Option<u64>,
    /// Who the block counts to in the tiers' shares ([`Store::owner`]).
    pub owner: Owner,
}

/// Result of [`Store::reserve`].
pub enum ReserveOutcome {
    /// The key is already stored: nothing to write (idempotent put).
    Present(PutOutcome),
    /// Room reserved: write the bytes, then commit.
    Reserved(Reservation),
}

/// Handle to one node's store.
#[derive(Clone)]
pub struct Store {
    pub(crate) shared: Arc<Shared>,
}

impl Store {
    /// Open the store: create the RAM arena, open (and recover) the disk tier,
    /// register metrics into `registry`, start the zombie-reservation reaper.
    pub fn open(cfg: NodeConfig, registry: &mut Registry) -> Result<Store, StoreError> {
        cfg.validate()?;
        // Populated now: a put or a promotion into a page nobody touched yet
        // would pay a page fault per 4 KiB on its path.
        let region = Arc::new(SharedRegion::create_populated(
            "kvfabric-ram-tier",
            cfg.ram_capacity.as_u64() as usize,
        )?);
        let metrics = StoreMetrics::register(registry);
        let (disk, records) = match (&cfg.disk_path, cfg.index_path()) {
            (Some(path), Some(index)) => {
                let (d, recs) = DiskTier::open(path, &index, cfg.disk_capacity.as_u64())?;
                (Some(d), recs)
            }
            _ => (None, Vec::new()),
        };
        let ram_cap = region.len() as u64;
        let disk_cap = disk.as_ref().map_or(0, |d| d.capacity());
        let mut inner = Inner::new(&cfg, ram_cap, disk_cap, DISK_ALIGN);
        let mut recovered = 0usize;
        for (key, rec) in records {
            if inner.disk.claim(rec.extent) {
                let owner = rec
                    .owner
                    .as_deref()
                    .map_or(Owner::NONE, |name| inner.shares.owner(name));
                inner.recover(
                    key,
                    Block {
                        layout: rec.layout,
                        len: rec.len,
                        checksum: rec.checksum,
                        tokens: rec.tokens,
                        ram: None,
                        disk: Some(rec.extent),
                        disk_codec: rec.codec,
                        ram_slot: 0,
                        disk_slot: 0,
                        owner,
                        ram_owner_slot: 0,
                        disk_owner_slot: 0,
                        hard_pin: false,
                        soft_pin_until: None,
                        accesses: 0,
                        flushing: false,
                    },
                );
                recovered += 1;
            } else if let Some(d) = &disk {
                tracing::warn!("disk index entry {key:?} overlaps another; dropped");
                d.index_delete(&key)?;
            }
        }
        if disk.is_some() {
            tracing::info!("disk tier recovered {recovered} blocks");
        }
        let frac = |cap: u64, f: f64| ((cap as f64) * f) as u64;
        let shared = Arc::new(Shared {
            ram_high: frac(ram_cap, cfg.high_watermark),
            ram_low: frac(ram_cap, cfg.low_watermark),
            disk_high: frac(disk_cap, cfg.high_watermark),
            disk_low: frac(disk_cap, cfg.low_watermark),
            planner: crate::planner::Planner::register(&cfg, ram_cap, disk_cap, registry),
            cfg,
            region,
            disk,
            metrics,
            inner: Mutex::new(inner),
        });
        spawn_reaper(Arc::downgrade(&shared));
        Ok(Store { shared })
    }

    /// The configuration the store runs with.
    pub fn config(&self) -> &NodeConfig {
        &self.shared.cfg
    }

    /// The RAM arena: register it as a transfer segment; leases and reservations give offsets in it.
    pub fn region(&self) -> &Arc<SharedRegion> {
        &self.shared.region
    }

    /// First phase of a put: validate, and reserve `len` bytes for `key` unless it is stored.
    pub fn reserve(
        &self,
        key: BlockKey,
        layout: KvLayout,
        len: u64,
        tokens: u32,
        durable: bool,
    ) -> Result<ReserveOutcome, StoreError> {
        let started = Instant::now();
        layout.validate()?;
        BadArgument::check_block_size(len, self.shared.cfg.max_block_size.as_u64())?;
        if durable && self.shared.disk.is_none() {
            return Err(StoreError::InvalidArgument(BadArgument::DurableWithoutDisk));
        }
        self.reap_zombies();
        self.shared.planner.on_put(&key, len);
        let present = {
            let g = self.shared.inner.lock();
            g.ram_order.prefetch_insert(&key);
            if let Some(offset) = g.peeked_ram_offset() {
                self.shared.prefetch_ram(offset);
            }
            g.blocks.contains_key(&key)
        };
        if present {
            return self
                .shared
                .already_present(&key, durable)
                .map(ReserveOutcome::Present);
        }
        let extent = self.shared.alloc_ram(len)?;
        let state = Arc::new(AtomicU8::new(RES_IDLE));
        let id = {
            let mut g = self.shared.inner.lock();
            g.next_reservation += 1;
            let id = g.next_reservation;
            g.reservations.insert(
                id,
                ReservationSlot {
                    extent,
                    deadline: Instant::now() + self.shared.cfg.reservation_timeout(),
                    state: state.clone(),
                },
            );
            id
        };
        Ok(ReserveOutcome::Reserved(Reservation {
            shared: self.shared.clone(),
            id,
            key,
            extent,
            len,
            layout,
            tokens: if tokens == 0 {
                layout.block_tokens
            } else {
                tokens
            },
            durable,
            state,
            started,
            hasher: Some(Box::new(Checksummer::new())),
            hashed: 0,
            owner: Owner::NONE,
        }))
    }

    /// One-call put of `data` (reserve, copy, commit). Idempotent.
    pub fn put(
        &self,
        key: BlockKey,
        layout: KvLayout,
        data: &[u8],
        opts: PutOptions,
    ) -> Result<PutOutcome, StoreError> {
        match self.reserve(key, layout, data.len() as u64, opts.tokens, opts.durable)? {
            ReserveOutcome::Present(p) => Ok(p),
            ReserveOutcome::Reserved(mut r) => {
                r.set_owner(opts.owner);
                r.write(0, data)?;
                r.commit(opts.checksum)
            }
        }
    }

    /// Lease `key` for reading from RAM, promoting it from disk if needed.
    /// None = not stored (or its disk copy failed its checksum).
    pub fn lease(&self, key: &BlockKey) -> Result<Option<ReadLease>, StoreError> {
        let started = Instant::now();
        let out = self.lease_inner(key, None);
        self.shared.metrics.observe(OpName::Get, started);
        Ok(out?.map(|(lease, _)| lease))
    }

    /// The lease of [`Store::lease`]; a promotion from disk also fills `copy`
    /// while it verifies the block (then `true` comes back with the lease).
    fn lease_inner(
        &self,
        key: &BlockKey,
        mut copy: Option<&mut RangeCopy<'_>>,
    ) -> Result<Option<(ReadLease, bool)>, StoreError> {
        let m = &self.shared.metrics;
        let mut copied = false;
        for _ in 0..4 {
            let mut g = self.shared.inner.lock();
            let Some(b) = g.blocks.get_mut(key) else {
                // Held only above RAM (VRAM): copied down, leased next round.
                if let Some(up) = g.upper.get() {
                    drop(g);
                    if up.copy_down(key)? {
                        continue;
                    }
                }
                StoreMetrics::tier(&m.misses, TierName::Ram).inc();
                if self.shared.disk.is_some() {
                    StoreMetrics::tier(&m.misses, TierName::Disk).inc();
                }
                return Ok(None);
            };
            if let Some(c) = copy.as_deref() {
                c.check(b.len)?;
            }
            b.accesses = b.accesses.saturating_add(1);
            let info = BlockInfo {
                key: *key,
                layout: b.layout,
                len: b.len,
                checksum: b.checksum,
                tokens: b.tokens,
                tier: Tier::Ram,
            };
            if let Some(ram) = b.ram {
                let at = copy.as_deref().map_or(0, |c| c.offset.min(b.len));
                self.shared.prefetch_ram(ram.offset + at);
                let (slot, owner, owner_slot) = (b.ram_slot, b.owner, b.ram_owner_slot);
                // The order's node arrives while the lease is counted.
                g.ram_order.prefetch(slot);
                g.lease_ram(ram);
                g.ram_order.touch(slot, key);
                g.shares.touch(TierIx::Ram, owner, owner_slot);
                StoreMetrics::tier(&m.hits, TierName::Ram).inc();
                let lease = ReadLease {
                    shared: self.shared.clone(),
                    extent: ram,
                    info,
                };
                return Ok(Some((lease, copied)));
            }
            let Some(dext) = b.disk else { return Ok(None) };
            StoreMetrics::tier(&m.misses, TierName::Ram).inc();
            let (slot, owner, owner_slot) = (b.disk_slot, b.owner, b.disk_owner_slot);
            g.disk_order.touch(slot, key);
            g.shares.touch(TierIx::Disk, owner, owner_slot);
            g.lease_disk(dext);
            drop(g);
            let filling = copy.take();
            let filled = filling.is_some();
            if self.shared.promote(key, dext, filling)?.is_none() {
                return Ok(None);
            }
            copied |= filled;
            // Promoted: take the lease on the RAM copy in the next round.
        }
        Ok(None)
    }

    /// Copy `dst.len()` bytes of `key` starting at `offset` into `dst`.
    /// None = not stored. A range past the block's end is an error. A block
    /// read from disk is copied out in the same pass that verifies it.
    pub fn get_into(
        &self,
        key: &BlockKey,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<Option<BlockInfo>, StoreError> {
        let started = Instant::now();
        let mut want = RangeCopy { offset, dst };
        let out = self.lease_inner(key, Some(&mut want));
        self.shared.metrics.observe(OpName::Get, started);
        let Some((lease, copied)) = out? else {
            return Ok(None);
        };
        if !copied {
            let range = want.check(lease.bytes().len() as u64)?;
            want.dst.copy_from_slice(&lease.bytes()[range]);
        }
        Ok(Some(*lease.info()))
    }

    /// Facts about each key (fastest tier holding it); None = not stored.
    /// No metrics are counted (the cluster directory uses this, not clients).
    pub fn block_infos(&self, keys: &[BlockKey]) -> Vec<Option<BlockInfo>> {
        let g = self.shared.inner.lock();
        keys.iter()
            .map(|k| {
                g.blocks
                    .get(k)
                    .map(|b| block_info(k, b))
                    .or_else(|| g.upper.info(k))
            })
            .collect()
    }

    /// Report every later change of what is stored (puts, tier changes,
    /// removals) to `feed`, and return the keys stored now. One subscriber:
    /// a later call replaces the earlier one. The cluster's directory
    /// announcer subscribes once, at start (the returned keys are what a
    /// recovered disk tier holds), and is then told only of changes.
    pub fn watch_changes(&self, feed: Arc<ChangeFeed>) -> Vec<BlockKey> {
        let mut g = self.shared.inner.lock();
        g.changes = Some(feed);
        g.blocks.keys().copied().collect()
    }

    /// Presence of each key (any tier).
    pub fn exists(&self, keys: &[BlockKey]) -> Vec<bool> {
        let started = Instant::now();
        let g = self.shared.inner.lock();
        let held = |k: &BlockKey| g.blocks.contains_key(k) || g.upper.info(k).is_some();
        let out = keys.iter().map(held).collect();
        drop(g);
        self.shared.metrics.observe(OpName::Exists, started);
        out
    }

    /// Length of the longest stored prefix of `keys` (prefix order), with the info of each.
    pub fn lookup(&self, keys: &[BlockKey]) -> Vec<BlockInfo> {
        let started = Instant::now();
        let mut g = self.shared.inner.lock();
        let mut found = Vec::new();
        for k in keys {
            match g.blocks.get(k).map(|b| block_info(k, b)) {
                Some(info) => found.push(info),
                None => match g.upper.info(k) {
                    Some(info) => found.push(info),
                    None => break,
                },
            }
        }
        g.ram_order.lookup(keys, found.len());
        drop(g);
        self.shared.planner.on_lookup(keys);
        let m = &self.shared.metrics;
        let hit_tokens: u64 = found.iter().map(|i| i.tokens as u64).sum();
        let per_block = found.first().map_or(0, |i| i.tokens as u64);
        let missed = (keys.len() - found.len()) as u64;
        m.lookup_hit_blocks.inc_by(found.len() as u64);
        m.lookup_hit_tokens.inc_by(hit_tokens);
        m.lookup_miss_blocks.inc_by(missed);
        m.lookup_miss_tokens.inc_by(missed * per_block);
        m.observe(OpName::Lookup, started);
        found
    }

    /// A lookup of `keys` answered outside [`Store::lookup`] (a cluster
    /// node's, across the cluster), of which this store held the first
    /// `found`: the RAM tier's order (`adaptive`'s shadows) and the
    /// capacity planner see it as they see `lookup`'s.
    pub fn note_lookup(&self, keys: &[BlockKey], found: usize) {
        self.shared.inner.lock().ram_order.lookup(keys, found);
        self.shared.planner.on_lookup(keys);
    }

    /// Count a cluster lookup's `hit` and `missed` blocks in the node's
    /// lookup counters (the Stats RPC's hit ratio, `kvfabric_lookup_*`).
    pub fn count_lookup(&self, hit: u64, missed: u64) {
        let m = &self.shared.metrics;
        m.lookup_hit_blocks.inc_by(hit);
        m.lookup_miss_blocks.inc_by(missed);
    }

    /// This store is a cluster node's: from now on its directory shard feeds
    /// the RAM tier's `adaptive` shadows ([`Store::note_cluster_lookup`],
    /// [`Store::note_cluster_put`]), its own lookups and puts do not.
    pub fn feed_order_from_cluster(&self) {
        self.shared.inner.lock().ram_order.feed_from_cluster();
    }

    /// A cluster lookup of `keys` (the keys of a looked-up chain this
    /// node's directory shard owns, chain order), the first `found` held
    /// somewhere in the cluster: the RAM tier's `adaptive` shadows replay it.
    pub fn note_cluster_lookup(&self, keys: &[BlockKey], found: usize) {
        self.shared
            .inner
            .lock()
            .ram_order
            .cluster_lookup(keys, found);
    }

    /// Keys of this node's directory shard entered the cluster (announced
    /// by a first holder); `held` keys of the shard are held now.
    pub fn note_cluster_put(&self, keys: &[BlockKey], held: usize) {
        self.shared.inner.lock().ram_order.cluster_put(keys, held);
    }

    /// The RAM tier's `adaptive` order: its mode and its shadows' hits
    /// (None under another order).
    pub fn adaptive_stats(&self) -> Option<crate::policy::AdaptiveStats> {
        self.shared.inner.lock().ram_order.adaptive_stats()
    }

    /// Drop `keys` from every tier; returns how many were stored.
    pub fn remove(&self, keys: &[BlockKey]) -> Result<usize, StoreError> {
        let started = Instant::now();
        let mut dropped_disk = Vec::new();
        let mut n = 0;
        {
            let mut g = self.shared.inner.lock();
            for k in keys {
                if let Some(b) = g.remove_block(k) {
                    n += 1;
                    if b.disk.is_some() {
                        dropped_disk.push(*k);
                    }
                }
            }
        }
        if let Some(d) = &self.shared.disk {
            for k in &dropped_disk {
                d.index_delete(k)?;
            }
        }
        self.shared.metrics.observe(OpName::Remove, started);
        Ok(n)
    }

    /// Pin `keys`: hard (never evicted until unpinned) with `ttl` None, soft otherwise.
    pub fn pin(&self, keys: &[BlockKey], ttl: Option<Duration>) -> usize {
        let now = Instant::now();
        let mut g = self.shared.inner.lock();
        let mut n = 0;
        for k in keys {
            if let Some(b) = g.blocks.get_mut(k) {
                n += 1;
                match ttl {
                    None => b.hard_pin = true,
                    Some(t) => {
                        let until = now + t;
                        b.soft_pin_until = Some(b.soft_pin_until.map_or(until, |u| u.max(until)));
                    }
                }
            }
        }
        n
    }

    /// Remove hard and soft pins of `keys`; returns how many were pinned.
    pub fn unpin(&self, keys: &[BlockKey]) -> usize {
        let now = Instant::now();
        let mut g = self.shared.inner.lock();
        let mut n = 0;
        for k in keys {
            if let Some(b) = g.blocks.get_mut(k) {
                if b.pinned(now) {
                    n += 1;
                }
                b.hard_pin = false;
                b.soft_pin_until = None;
            }
        }
        n
    }

    /// Reclaim reservations older than the timeout; returns how many.
    pub fn reap_zombies(&self) -> usize {
        reap(&self.shared)
    }

    /// The capacity planner's curves (GET /api/v1/capacity, the Capacity RPC).
    pub fn capacity(&self) -> CapacityReport {
        self.shared.planner.report()
    }
}

fn reap(s: &Shared) -> usize {
    let now = Instant::now();
    let mut g = s.inner.lock();
    let expired: Vec<u64> = g
        .reservations
        .iter()
        .filter(|(_, r)| r.deadline <= now)
        .map(|(&id, _)| id)
        .collect();
    let mut n = 0;
    for id in expired {
        let Some(slot) = g.reservations.get(&id) else {
            continue;
        };
        let won = slot
            .state
            .compare_exchange(
                RES_IDLE,
                RES_CLOSED,
                std::sync::atomic::Ordering::AcqRel,
                std::sync::atomic::Ordering::Acquire,
            )
            .is_ok();
        if won {
            if let Some(slot) = g.reservations.remove(&id) {
                g.ram.free(slot.extent);
                n += 1;
            }
        }
    }
    drop(g);
    s.metrics.reservations_reclaimed.inc_by(n as u64);
    if n > 0 {
        tracing::info!("reclaimed {n} zombie reservations");
    }
    n
}

fn spawn_reaper(shared: Weak<Shared>) {
    let period = shared
        .upgrade()
        .map(|s| s.cfg.reservation_timeout() / 4)
        .unwrap_or_default()
        .clamp(Duration::from_millis(10), Duration::from_millis(500));
    let spawned = std::thread::Builder::new()
        .name("kvfabric-reaper".into())
        .spawn(move || loop {
            std::thread::sleep(period);
            match shared.upgrade() {
                Some(s) => {
                    reap(&s);
                }
                None => return,
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("no reaper thread ({e}); zombies are reclaimed on reserve only");
    }
}

fn block_info(key: &BlockKey, b: &crate::state::Block) -> BlockInfo {
    BlockInfo {
        key: *key,
        layout: b.layout,
        len: b.len,
        checksum: b.checksum,
        tokens: b.tokens,
        tier: if b.ram.is_some() {
            Tier::Ram
        } else {
            Tier::Disk
        },
    }
}
