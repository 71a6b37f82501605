//! Tiering: making room in a tier (high/low watermarks, eviction order),
//! demotion RAM -> disk (write-back), writes to disk at put time
//! (write-through, durable puts), promotion disk -> RAM on read, and the
//! checksum check on every disk read.
//!
//! Disk I/O always happens with the store lock released; the extents involved
//! are leased so nothing frees or reuses them meanwhile, and the block is
//! marked `flushing` so only one disk write of it is in flight.

use std::time::Instant;

use parking_lot::MutexGuard;

use crate::disk::DiskRecord;
use crate::disk_codec::{self, Compressed, DiskCodec};
use crate::extent::Extent;
use crate::keys::BlockKey;
use crate::lifecycle::RangeCopy;
use crate::metrics::{OpName, StoreMetrics, TierName};
use crate::node_config::{DiskAdmission, DiskCompression, WritePolicy};
use crate::state::{Block, Inner};
use crate::store_core::Shared;
use crate::tenant_shares::TierIx;
use crate::{NoRoom, StoreError};

impl Shared {
    /// Allocate `len` bytes of RAM arena, evicting (and demoting) down to the
    /// low watermark when the high one would be crossed.
    pub(crate) fn alloc_ram(&self, len: u64) -> Result<Extent, StoreError> {
        let mut evicting = false;
        loop {
            let mut g = self.inner.lock();
            let want = g.ram.rounded(len);
            if want > g.ram.capacity() {
                return Err(StoreError::ResourceExhausted(NoRoom::LargerThanRam { len }));
            }
            let limit = if evicting {
                self.ram_low
            } else {
                self.ram_high
            };
            if g.ram.used() + want <= limit {
                if let Some(e) = g.ram.alloc(want) {
                    return Ok(e);
                }
            }
            evicting = true;
            match g.ram_victim(Instant::now()) {
                Some(victim) => self.evict_from_ram(g, victim),
                None => {
                    if let Some(e) = g.ram.alloc(want) {
                        return Ok(e);
                    }
                    let flushing = g.blocks.values().any(|b| b.flushing);
                    drop(g);
                    if flushing {
                        // A demotion in flight will free room soon.
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        continue;
                    }
                    return Err(StoreError::ResourceExhausted(NoRoom::RamPinned));
                }
            }
        }
    }

    fn admitted(&self, g: &Inner, key: &BlockKey, b: &Block) -> bool {
        match self.cfg.disk_admission {
            DiskAdmission::All => true,
            DiskAdmission::SeenTwice => b.accesses >= 2 || g.seen.contains(key),
        }
    }

    /// Whether a freshly committed block goes to disk at put time.
    pub(crate) fn write_through(&self, g: &Inner, key: &BlockKey, b: &Block) -> bool {
        self.disk.is_some()
            && self.cfg.write_policy == WritePolicy::WriteThrough
            && self.admitted(g, key, b)
    }

    /// Start loading the arena's cache line at `offset` (a hint: nothing
    /// happens where the target has no prefetch instruction).
    ///
    /// A tier of many blocks is mostly out of cache, so the first touch of
    /// a block's bytes is a DRAM miss (and a TLB miss: the arena is a memfd,
    /// on 4 KiB pages). Where the store knows which bytes come next (an
    /// evicted block's extent is the one the put that evicted it writes; a
    /// read's block) it asks for them first, and the metadata work that is
    /// left runs while the line arrives.
    pub(crate) fn prefetch_ram(&self, offset: u64) {
        if offset as usize >= self.region.len() {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let p = self.region.as_ptr().wrapping_add(offset as usize);
            // SAFETY: a prefetch never faults and changes no memory (the
            // address is inside the mapping anyway: checked above); SSE is
            // part of x86_64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast_const().cast()) };
        }
    }

    /// Drop `victim` from RAM, writing it to disk first when it has no disk copy and is admitted.
    fn evict_from_ram(&self, mut g: MutexGuard<'_, Inner>, victim: BlockKey) {
        let Some(b) = g.blocks.get(&victim) else {
            return;
        };
        let Some(ram) = b.ram else { return };
        let demote = self.disk.is_some() && b.disk.is_none() && self.admitted(&g, &victim, b);
        if !demote {
            // The put that evicts it writes this extent next (best fit
            // reuses a freed extent of the same size first).
            self.prefetch_ram(ram.offset);
            if self.disk.is_some() && b.disk.is_none() {
                g.seen.insert(victim);
            }
            g.drop_ram_copy(&victim);
            StoreMetrics::tier(&self.metrics.evictions, TierName::Ram).inc();
            return;
        }
        if let Some(b) = g.blocks.get_mut(&victim) {
            b.flushing = true;
        }
        g.lease_ram(ram);
        drop(g);
        let written = self.write_to_disk(&victim, ram, false);
        let mut g = self.inner.lock();
        g.unlease_ram(ram);
        if let Some(b) = g.blocks.get_mut(&victim) {
            b.flushing = false;
            if b.ram == Some(ram) {
                g.drop_ram_copy(&victim);
            }
        }
        StoreMetrics::tier(&self.metrics.evictions, TierName::Ram).inc();
        match written {
            Ok(true) => StoreMetrics::tier(&self.metrics.demotions, TierName::Ram).inc(),
            Ok(false) => 0,
            Err(e) => {
                tracing::warn!("demotion of {victim:?} failed, block dropped: {e}");
                0
            }
        };
    }

    /// Allocate a disk extent, dropping disk copies down to the low watermark when needed.
    fn alloc_disk(&self, g: &mut Inner, len: u64) -> Option<Extent> {
        let disk = self.disk.as_ref()?;
        let want = g.disk.rounded(len);
        let mut evicting = false;
        loop {
            let limit = if evicting {
                self.disk_low
            } else {
                self.disk_high
            };
            if g.disk.used() + want <= limit {
                if let Some(e) = g.disk.alloc(want) {
                    return Some(e);
                }
            }
            evicting = true;
            match g.disk_victim(Instant::now()) {
                Some(v) => {
                    g.drop_disk_copy(&v);
                    if let Err(e) = disk.index_delete(&v) {
                        tracing::warn!("index delete of evicted {v:?} failed: {e}");
                    }
                    StoreMetrics::tier(&self.metrics.evictions, TierName::Disk).inc();
                }
                None => return g.disk.alloc(want),
            }
        }
    }

    /// Write the RAM copy `ram` of `key` to disk (compressed when that pays,
    /// see `disk_codec`) and index it (synced when `durable`).
    /// The caller has marked the block `flushing` and leased `ram`.
    /// Ok(false): no disk tier or no disk room.
    pub(crate) fn write_to_disk(
        &self,
        key: &BlockKey,
        ram: Extent,
        durable: bool,
    ) -> Result<bool, StoreError> {
        let Some(disk) = self.disk.as_ref() else {
            return Ok(false);
        };
        let started = Instant::now();
        let Some((layout, len)) = self.inner.lock().blocks.get(key).map(|b| (b.layout, b.len))
        else {
            return Ok(false);
        };
        // SAFETY: `ram` is leased by the caller: allocated, committed and not written by anyone.
        let data = unsafe { self.region.slice(ram.offset as usize, ram.len as usize) }?;
        let data = data.get(..len as usize).unwrap_or(data);
        let encoded = match self.cfg.disk_compression {
            DiskCompression::Auto => disk_codec::compress(data, &layout),
            DiskCompression::Off => Compressed::Skipped,
        };
        let (bytes, codec) = match &encoded {
            Compressed::Encoded(e) => (e.as_slice(), DiskCodec::Planes),
            Compressed::Skipped | Compressed::NoGain => (data, DiskCodec::Raw),
        };
        let (dext, rec) = {
            let mut g = self.inner.lock();
            let Some(b) = g.blocks.get(key) else {
                return Ok(false);
            };
            let (checksum, tokens, owner) = (b.checksum, b.tokens, b.owner);
            let Some(dext) = self.alloc_disk(&mut g, bytes.len() as u64) else {
                return Ok(false);
            };
            let rec = DiskRecord {
                extent: dext,
                len,
                checksum,
                tokens,
                layout,
                codec,
                owner: g.shares.name_of(owner),
            };
            (dext, rec)
        };
        let io = disk.write(dext, bytes).and_then(|()| {
            if durable {
                disk.sync_data()?;
            }
            disk.index_put(key, &rec, durable)
        });
        let mut g = self.inner.lock();
        if let Err(e) = io {
            g.disk.free(dext);
            return Err(e);
        }
        self.metrics.observe(OpName::DiskWrite, started);
        let Inner {
            blocks,
            disk_order,
            shares,
            ..
        } = &mut *g;
        match blocks.get_mut_rec(key) {
            Some((rec, b)) if b.ram == Some(ram) && b.disk.is_none() => {
                b.disk = Some(dext);
                b.disk_codec = codec;
                b.disk_slot = disk_order.insert(*key, rec);
                b.disk_owner_slot = shares.enter(TierIx::Disk, b.owner, *key, rec, dext.len);
                Ok(true)
            }
            _ => {
                // Removed (or replaced) while we wrote: undo.
                g.disk.free(dext);
                drop(g);
                disk.index_delete(key)?;
                Ok(false)
            }
        }
    }

    /// Read the disk copy `dext` of `key` into RAM and verify it; on success the block
    /// has a RAM copy (returned). A checksum failure drops the disk copy and is a miss.
    /// With `copy`, its range is copied out in the verifying pass (range checked by
    /// the caller): one read of the block from memory instead of two.
    pub(crate) fn promote(
        &self,
        key: &BlockKey,
        dext: Extent,
        copy: Option<&mut RangeCopy<'_>>,
    ) -> Result<Option<Extent>, StoreError> {
        let Some(disk) = self.disk.as_ref() else {
            return Ok(None);
        };
        let (len, checksum, codec) = {
            let g = self.inner.lock();
            match g.blocks.get(key) {
                Some(b) => (b.len, b.checksum, b.disk_codec),
                None => return Ok(None),
            }
        };
        let ram = match self.alloc_ram(len) {
            Ok(e) => e,
            Err(e) => {
                self.inner.lock().unlease_disk(dext);
                return Err(e);
            }
        };
        let started = Instant::now();
        // The disk bytes land in a staging buffer and are decoded (when
        // compressed) and checksummed there; only verified bytes are copied
        // into the arena. A block that does not decode is a checksum failure.
        // SAFETY: `ram` was just allocated and is owned by this call alone.
        let read = unsafe { self.region.slice_mut(ram.offset as usize, ram.len as usize) }
            .map_err(StoreError::from)
            .and_then(|arena| {
                disk.read(dext, |staged| {
                    let Some(block) = disk_codec::block_bytes(codec, staged, len) else {
                        return false;
                    };
                    let block = &block[..];
                    let ok = match copy {
                        Some(c) => c.verify_and_copy(block, checksum),
                        None => kvfabric_transfer::checksum::checksum(block) == checksum,
                    };
                    if ok {
                        arena[..block.len()].copy_from_slice(block);
                    }
                    ok
                })
            });
        let verified = read.unwrap_or_else(|e| {
            tracing::warn!("disk read of {key:?} failed: {e}");
            false
        });
        self.metrics.observe(OpName::DiskRead, started);
        let mut g = self.inner.lock();
        g.unlease_disk(dext);
        if !verified {
            g.ram.free(ram);
            StoreMetrics::tier(&self.metrics.checksum_failures, TierName::Disk).inc();
            StoreMetrics::tier(&self.metrics.misses, TierName::Disk).inc();
            tracing::warn!("checksum mismatch on disk for {key:?}: dropping its slot");
            if g.blocks.get(key).is_some_and(|b| b.disk == Some(dext)) {
                g.drop_disk_copy(key);
                drop(g);
                disk.index_delete(key)?;
            }
            return Ok(None);
        }
        StoreMetrics::tier(&self.metrics.hits, TierName::Disk).inc();
        let Inner {
            blocks,
            ram_order,
            shares,
            ..
        } = &mut *g;
        match blocks.get_mut_rec(key) {
            Some((rec, b)) if b.ram.is_none() && b.disk == Some(dext) => {
                b.ram = Some(ram);
                b.ram_slot = ram_order.insert(*key, rec);
                b.ram_owner_slot = shares.enter(TierIx::Ram, b.owner, *key, rec, ram.len);
                let owner = b.owner;
                g.note(key, crate::changes::BlockChange::Tier, owner);
                StoreMetrics::tier(&self.metrics.promotions, TierName::Ram).inc();
                Ok(Some(ram))
            }
            Some((_, b)) if b.ram.is_some() => {
                let theirs = b.ram;
                g.ram.free(ram);
                Ok(theirs)
            }
            _ => {
                g.ram.free(ram);
                Ok(None)
            }
        }
    }
}
