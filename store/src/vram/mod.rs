//! `VramTier`: the store's first tier, GPU device memory (feature `cuda`).
//!
//! One device allocation ([`VramSegment`]) made at open, split into blocks by
//! the same extent allocator as the RAM arena, with the RAM tier's
//! lifecycle: [`VramTier::reserve`] -> [`VramReservation::write`] ->
//! [`VramReservation::commit`] (dropped uncommitted: the room is freed), and
//! [`VramLease`] (a block that cannot be evicted or freed while leased; its
//! device address is what a GPU consumer reads). Tier order is VRAM > RAM >
//! disk: the tier sits on a [`Store`] (RAM and disk), evicts into it in the
//! configured eviction order (`eviction`, the same `EvictionOrder` the RAM
//! tier uses) and promotes from it on a lease that misses VRAM.
//!
//! Bytes move on one stream per direction, in slices, through the transfer
//! crate's [`StagingPool`]: a client's (pageable) buffers through its pinned
//! slices; blocks between VRAM and RAM straight from and into the RAM arena,
//! which the tier registers with the driver at open (through the slices if
//! the driver refused). The checksum is taken of the bytes the DMA read or
//! wrote: a put commits only when they hash to the block's checksum (the
//! client's, or the RAM copy's on a promotion), and a read or an eviction
//! hands bytes on only when they do. The host hashes them, except a
//! promotion from the registered arena with `vram_verify = device`: the GPU
//! hashes the bytes as they landed in VRAM (`DeviceXxh3`, the same XXH3),
//! so the CPU does not read the block from DRAM beside its DMA. A block whose bytes do not
//! match is refused, counted in `kvfabric_store_checksum_failures{tier="Vram"}`
//! and dropped from VRAM (the same answer as a disk copy that fails its
//! checksum: not stored here).
//!
//! Blocks move between VRAM and RAM whole (exclusive on put, inclusive after
//! a promotion: the RAM copy stays until RAM evicts it, so evicting a
//! promoted block again costs no copy). Metrics are the store's per-tier
//! families with `tier="Vram"`.
//!
//! Layout: this file (the tier, its index, room and eviction), `lifecycle`
//! (reservations, leases, put and get), `movement` (eviction into RAM,
//! promotion from RAM and disk), `link` (the store's view of the tier:
//! its readers see VRAM blocks, its change feed hears of them).

mod lifecycle;
mod link;
mod movement;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;

use kvfabric_transfer::cuda::{DeviceXxh3, GpuDevice, HostRegistration, StagingPool, VramSegment};
use parking_lot::Mutex;

use crate::block_info::BlockInfo;
use crate::extent::{Extent, ExtentAllocator};
use crate::keys::{BlockKey, KvLayout};
use crate::metrics::{StoreMetrics, TierCounter, TierLabel, TierName};
use crate::node_config::{NodeConfig, VramVerify};
use crate::policy::{EvictionOrder, Slot};
use crate::rec::Rec;
use crate::{BadConfig, NoRoom, Store, StoreError};

pub use lifecycle::{VramLease, VramReservation, VramReserveOutcome};

/// Alignment of VRAM extents (the digest kernel reads 8-byte words; 256 B
/// keeps each block on its own DMA-friendly boundary).
const VRAM_ALIGN: u64 = 256;

/// Promotions the GPU checks at once (`vram_verify = device`): each slot is
/// a stream and scratch of 64 bytes per KiB of `max_block_size`.
const HASH_SLOTS: usize = 8;

/// One block held in VRAM.
#[derive(Clone, Copy, Debug)]
struct VramBlock {
    extent: Extent,
    layout: KvLayout,
    len: u64,
    checksum: u64,
    tokens: u32,
    slot: Slot,
    /// An eviction of it is copying it to RAM.
    evicting: bool,
}

impl VramBlock {
    /// Facts about the block, stored under `key` (tier `Vram`).
    fn info(&self, key: &BlockKey) -> BlockInfo {
        BlockInfo {
            key: *key,
            layout: self.layout,
            len: self.len,
            checksum: self.checksum,
            tokens: self.tokens,
            tier: crate::tier::Tier::Vram,
        }
    }
}

/// Leases on one extent; `doomed`: the block left the tier while leased, so
/// the extent is freed by the last lease.
#[derive(Debug, Default)]
struct Leased {
    count: u32,
    doomed: bool,
}

/// The locked part of the tier.
struct VramInner {
    alloc: ExtentAllocator,
    order: EvictionOrder,
    index: HashMap<BlockKey, Rec>,
    slab: Vec<Option<(BlockKey, VramBlock)>>,
    free_recs: Vec<Rec>,
    leases: HashMap<u64, Leased>,
    evictions_in_flight: usize,
}

impl VramInner {
    fn block(&self, key: &BlockKey) -> Option<(Rec, &VramBlock)> {
        let rec = *self.index.get(key)?;
        let (_, b) = self.slab.get(rec as usize)?.as_ref()?;
        Some((rec, b))
    }

    fn block_mut(&mut self, key: &BlockKey) -> Option<&mut VramBlock> {
        let rec = *self.index.get(key)?;
        self.slab.get_mut(rec as usize)?.as_mut().map(|(_, b)| b)
    }

    fn insert(&mut self, key: BlockKey, mut block: VramBlock) {
        let rec = match self.free_recs.pop() {
            Some(r) => r,
            None => {
                self.slab.push(None);
                (self.slab.len() - 1) as Rec
            }
        };
        block.slot = self.order.insert(key, rec);
        self.slab[rec as usize] = Some((key, block));
        self.index.insert(key, rec);
    }

    /// Take `key` out of the index and the order; its extent is freed now, or
    /// by its last lease.
    fn remove(&mut self, key: &BlockKey) -> Option<VramBlock> {
        let rec = self.index.remove(key)?;
        let (_, block) = self.slab.get_mut(rec as usize)?.take()?;
        self.free_recs.push(rec);
        self.order.remove(block.slot, key);
        self.release_extent(block.extent);
        Some(block)
    }

    /// Free `ext` unless leased (then its last lease frees it).
    fn release_extent(&mut self, ext: Extent) {
        match self.leases.get_mut(&ext.offset) {
            Some(l) => l.doomed = true,
            None => self.alloc.free(ext),
        }
    }

    fn lease(&mut self, ext: Extent) {
        self.leases.entry(ext.offset).or_default().count += 1;
    }

    fn unlease(&mut self, ext: Extent) {
        if let Some(l) = self.leases.get_mut(&ext.offset) {
            l.count -= 1;
            if l.count == 0 {
                let doomed = l.doomed;
                self.leases.remove(&ext.offset);
                if doomed {
                    self.alloc.free(ext);
                }
            }
        }
    }
}

/// State every handle, lease and reservation of the tier holds.
pub(crate) struct VramShared {
    /// The store's RAM arena registered with the device (dropped, so
    /// unregistered, before `store`); None if the driver refused it.
    arena: Option<HostRegistration>,
    /// Checks promotions from the arena on the GPU (`vram_verify = device`
    /// and the arena registered); None: the host hashes them.
    hasher: Option<DeviceXxh3>,
    dev: Arc<GpuDevice>,
    seg: VramSegment,
    staging: StagingPool,
    store: Store,
    metrics: StoreMetrics,
    high: u64,
    low: u64,
    max_block: u64,
    inner: Mutex<VramInner>,
}

/// Facts about the tier's room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VramStats {
    pub capacity: u64,
    pub used: u64,
    pub blocks: u64,
}

/// Handle to the VRAM tier of one store (a cheap clone of an `Arc`).
#[derive(Clone)]
pub struct VramTier {
    pub(crate) shared: Arc<VramShared>,
}

impl VramTier {
    /// Open the tier on `store`: `vram_capacity` bytes of device memory on
    /// GPU `vram_device`, and the pinned staging pool. `vram_capacity` 0 is
    /// a configuration error here (the caller opens no tier then).
    pub fn open(store: &Store) -> Result<VramTier, StoreError> {
        let cfg: &NodeConfig = store.config();
        let capacity = cfg.vram_capacity.as_u64();
        if capacity < VRAM_ALIGN {
            return Err(StoreError::Config(BadConfig::Zero {
                key: "vram_capacity",
            }));
        }
        let dev = GpuDevice::open(cfg.vram_device as usize)?;
        let seg = VramSegment::allocate(&dev, capacity as usize)?;
        let staging = StagingPool::new(
            &dev,
            cfg.vram_staging_slots as usize,
            cfg.vram_staging_slice.as_u64() as usize,
            cfg.vram_staging_depth as usize,
        )?;
        let arena = register_arena(&dev, store);
        let hasher = match (&arena, cfg.vram_verify) {
            (Some(_), VramVerify::Device) => device_hasher(&dev, cfg.max_block_size.as_u64()),
            _ => None,
        };
        let metrics = store.shared.metrics.clone();
        let frac = |f: f64| ((capacity as f64) * f) as u64;
        let inner = VramInner {
            alloc: ExtentAllocator::new(capacity, VRAM_ALIGN),
            order: EvictionOrder::new(cfg),
            index: HashMap::new(),
            slab: Vec::new(),
            free_recs: Vec::new(),
            leases: HashMap::new(),
            evictions_in_flight: 0,
        };
        tracing::info!(
            device = %dev.name(),
            capacity,
            "VRAM tier open on GPU {}",
            cfg.vram_device
        );
        let tier = VramTier {
            shared: Arc::new(VramShared {
                high: frac(cfg.high_watermark),
                low: frac(cfg.low_watermark),
                max_block: cfg.max_block_size.as_u64(),
                arena,
                hasher,
                dev,
                seg,
                staging,
                store: store.clone(),
                metrics,
                inner: Mutex::new(inner),
            }),
        };
        tier.shared.publish(&tier.shared.inner.lock());
        tier.link();
        Ok(tier)
    }

    /// The GPU the tier lives on.
    pub fn device(&self) -> &Arc<GpuDevice> {
        &self.shared.dev
    }

    /// The device segment blocks live in (leases give offsets in it).
    pub fn segment(&self) -> &VramSegment {
        &self.shared.seg
    }

    /// Whether promotions from RAM are checked on the GPU (`vram_verify =
    /// device`, the arena registered and the kernels compiled).
    pub fn verifies_on_device(&self) -> bool {
        self.shared.hasher.is_some()
    }

    /// The store under the tier (RAM and disk).
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// Capacity, bytes used (reserved included) and blocks held.
    pub fn stats(&self) -> VramStats {
        let g = self.shared.inner.lock();
        VramStats {
            capacity: g.alloc.capacity(),
            used: g.alloc.used(),
            blocks: g.index.len() as u64,
        }
    }

    /// Whether each key is in VRAM.
    pub fn contains(&self, keys: &[BlockKey]) -> Vec<bool> {
        let g = self.shared.inner.lock();
        keys.iter().map(|k| g.index.contains_key(k)).collect()
    }

    /// Drop `keys` from VRAM (not from RAM or disk); how many were there.
    /// A leased block's room is freed when its last lease goes.
    pub fn remove(&self, keys: &[BlockKey]) -> usize {
        self.shared.drop_blocks(keys)
    }
}

/// Register `store`'s RAM arena with the device, so blocks move between RAM
/// and VRAM as DMA with no staging copy. A refusal is logged, not fatal: the
/// copies then go through the staging pool.
fn register_arena(dev: &Arc<GpuDevice>, store: &Store) -> Option<HostRegistration> {
    let region = store.region();
    let started = std::time::Instant::now();
    // SAFETY: the arena stays mapped while the store lives, and the tier
    // holds the store (and drops the registration first).
    match unsafe { HostRegistration::new(dev, region.as_ptr(), region.len()) } {
        Ok(r) => {
            tracing::info!(
                bytes = region.len(),
                ms = started.elapsed().as_millis() as u64,
                "RAM arena registered with the GPU"
            );
            Some(r)
        }
        Err(e) => {
            tracing::warn!("RAM arena not registered with the GPU ({e}); RAM <-> VRAM copies go through the staging pool");
            None
        }
    }
}

/// The GPU's XXH3 for promotions; a failure (no NVRTC on the host) is
/// logged, not fatal: the host hashes them then.
fn device_hasher(dev: &Arc<GpuDevice>, max_block: u64) -> Option<DeviceXxh3> {
    match DeviceXxh3::new(dev, max_block as usize, HASH_SLOTS) {
        Ok(h) => {
            tracing::info!("promotions into VRAM are checked on the GPU");
            Some(h)
        }
        Err(e) => {
            tracing::warn!(
                "promotions into VRAM are checked on the host: the GPU's hash is unavailable ({e})"
            );
            None
        }
    }
}

impl VramShared {
    /// Set the tier's gauges from its state.
    fn publish(&self, g: &VramInner) {
        let label = TierLabel {
            tier: TierName::Vram,
        };
        let m = &self.metrics;
        m.capacity_bytes
            .get_or_create(&label)
            .set(g.alloc.capacity() as i64);
        m.used_bytes
            .get_or_create(&label)
            .set(g.alloc.used() as i64);
        m.blocks.get_or_create(&label).set(g.index.len() as i64);
    }

    fn count(&self, family: &TierCounter) {
        StoreMetrics::tier(family, TierName::Vram).inc();
    }

    /// Allocate `len` bytes of VRAM, evicting into RAM (in the tier's order)
    /// down to the low watermark when the high one would be crossed.
    fn alloc(&self, len: u64) -> Result<Extent, StoreError> {
        let mut evicting = false;
        loop {
            let mut g = self.inner.lock();
            let want = g.alloc.rounded(len);
            if want > g.alloc.capacity() {
                return Err(StoreError::ResourceExhausted(NoRoom::LargerThanVram {
                    len,
                }));
            }
            let limit = if evicting { self.low } else { self.high };
            if g.alloc.used() + want <= limit {
                if let Some(e) = g.alloc.alloc(want) {
                    self.publish(&g);
                    return Ok(e);
                }
            }
            evicting = true;
            let VramInner {
                order,
                slab,
                index,
                leases,
                ..
            } = &mut *g;
            let victim = order.victim(|k| {
                index
                    .get(k)
                    .and_then(|r| slab[*r as usize].as_ref())
                    .is_some_and(|(_, b)| !b.evicting && !leases.contains_key(&b.extent.offset))
            });
            match victim {
                Some(key) => {
                    self.evict(g, key)?;
                }
                None => {
                    if let Some(e) = g.alloc.alloc(want) {
                        self.publish(&g);
                        return Ok(e);
                    }
                    let in_flight = g.evictions_in_flight > 0;
                    drop(g);
                    if in_flight {
                        // An eviction copying to RAM will free room soon.
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        continue;
                    }
                    return Err(StoreError::ResourceExhausted(NoRoom::VramPinned));
                }
            }
        }
    }
}
