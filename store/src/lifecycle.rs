//! Block lifecycle handles: `Reservation` (two-phase put: reserve -> write ->
//! commit, revoked on drop or failure, reclaimed by the reaper after the
//! timeout) and `ReadLease` (a RAM block that cannot be evicted or freed
//! while the lease lives).
//!
//! Both are consuming/RAII types: a reservation is gone once committed or
//! dropped; a lease releases on drop. The reservation's state word makes the
//! owner and the zombie reaper race safely: whoever moves it from IDLE first
//! owns the extent's fate, and nobody writes an extent after it is reclaimed.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use kvfabric_transfer::checksum::Checksummer;

use crate::block_info::{BlockInfo, PutOutcome};
use crate::extent::Extent;
use crate::keys::{BlockKey, KvLayout};
use crate::metrics::OpName;
use crate::state::{Block, RES_CLOSED, RES_IDLE, RES_WRITING};
use crate::store_core::Shared;
use crate::tenant_shares::{Owner, TierIx};
use crate::tier::Tier;
use crate::{BadArgument, NoRoom, StoreError};

/// Room reserved in the RAM arena for one block that is being written.
pub struct Reservation {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: u64,
    pub(crate) key: BlockKey,
    pub(crate) extent: Extent,
    pub(crate) len: u64,
    pub(crate) layout: KvLayout,
    pub(crate) tokens: u32,
    pub(crate) durable: bool,
    pub(crate) state: Arc<AtomicU8>,
    pub(crate) started: Instant,
    /// Running xxh3 of the bytes written in order from offset 0 (fused with the copy,
    /// so the checksum costs no second pass over memory); None once writes go out of order.
    pub(crate) hasher: Option<Box<Checksummer>>,
    /// How many leading bytes `hasher` has seen.
    pub(crate) hashed: u64,
    /// Who the block counts to in the tiers' shares.
    pub(crate) owner: Owner,
}

impl Reservation {
    /// Count the block to `owner` (see [`crate::Store::owner`]; default:
    /// [`Owner::NONE`]).
    pub fn set_owner(&mut self, owner: Owner) {
        self.owner = owner;
    }

    /// The block's key.
    pub fn key(&self) -> &BlockKey {
        &self.key
    }

    /// Exact number of bytes the block must have.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: reservations hold at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset of the reserved bytes inside the RAM arena (the transfer segment).
    pub fn region_offset(&self) -> u64 {
        self.extent.offset
    }

    /// Write `data` at `offset` inside the block.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        BadArgument::check_write(offset, data.len() as u64, self.len)?;
        let mut hasher = self.hasher.take().filter(|_| self.hashed == offset);
        let out = self.raw_bytes_mut(|buf| {
            let dst = &mut buf[offset as usize..offset as usize + data.len()];
            match hasher.as_mut() {
                Some(h) => h.copy_and_update(dst, data),
                None => dst.copy_from_slice(data),
            }
        });
        if out.is_ok() && hasher.is_some() {
            self.hashed += data.len() as u64;
            self.hasher = hasher;
        }
        out
    }

    /// Run `f` on the reserved bytes (exactly `len()` of them), e.g. to receive into them.
    pub fn with_bytes_mut<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Result<R, StoreError> {
        self.hasher = None; // arbitrary writes: hash the whole block at commit
        self.raw_bytes_mut(f)
    }

    /// Fill the whole block with `f`, which feeds every byte of it, in
    /// order, to the checksummer it is handed (e.g. a DMA that hashes each
    /// slice as it lands), so `commit` needs no second pass over the block.
    /// If `f` fails, drop the reservation: the hash is taken as complete.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the VRAM tier's evictions
    pub(crate) fn fill_hashed<R>(
        &mut self,
        f: impl FnOnce(&mut [u8], &mut Checksummer) -> R,
    ) -> Result<R, StoreError> {
        let mut sum = Box::new(Checksummer::new());
        let out = self.raw_bytes_mut(|buf| f(buf, &mut sum))?;
        self.hasher = Some(sum);
        self.hashed = self.len;
        Ok(out)
    }

    fn raw_bytes_mut<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Result<R, StoreError> {
        if self
            .state
            .compare_exchange(RES_IDLE, RES_WRITING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(StoreError::ReservationExpired { key: self.key });
        }
        // SAFETY: the extent belongs to this reservation and the WRITING state keeps the
        // reaper from reclaiming it until we are done.
        let buf = unsafe {
            self.shared
                .region
                .slice_mut(self.extent.offset as usize, self.len as usize)
        };
        let out = buf.map(f).map_err(StoreError::from);
        self.state.store(RES_IDLE, Ordering::Release);
        out
    }

    /// Publish the block. With `checksum`, the bytes must hash to it (xxh3-64) or the
    /// put fails and nothing is stored. A key stored meanwhile makes this a no-op success.
    pub fn commit(self, checksum: Option<u64>) -> Result<PutOutcome, StoreError> {
        if self
            .state
            .compare_exchange(RES_IDLE, RES_CLOSED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(StoreError::ReservationExpired { key: self.key });
        }
        // From here on this value alone owns the extent; Drop sees CLOSED and does nothing.
        let shared = self.shared.clone();
        let running = self
            .hasher
            .as_ref()
            .filter(|_| self.hashed == self.len)
            .map(|h| h.digest());
        let result = shared.commit_reservation(&self, checksum, running);
        shared.metrics.observe(OpName::Put, self.started);
        result
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self
            .state
            .compare_exchange(RES_IDLE, RES_CLOSED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let mut g = self.shared.inner.lock();
            g.reservations.remove(&self.id);
            g.ram.free(self.extent);
        }
    }
}

impl Shared {
    fn commit_reservation(
        &self,
        r: &Reservation,
        checksum: Option<u64>,
        running: Option<u64>,
    ) -> Result<PutOutcome, StoreError> {
        let sum = match running {
            Some(sum) => sum,
            None => {
                // SAFETY: the reservation is CLOSED by its owner: nobody else touches the extent.
                let bytes = unsafe { self.region.slice(r.extent.offset as usize, r.len as usize) }?;
                kvfabric_transfer::checksum::checksum(bytes)
            }
        };
        let mut g = self.inner.lock();
        g.reservations.remove(&r.id);
        if let Some(want) = checksum.filter(|&c| c != sum) {
            g.ram.free(r.extent);
            return Err(StoreError::InvalidArgument(BadArgument::ChecksumMismatch {
                want,
                got: sum,
            }));
        }
        if g.blocks.contains_key(&r.key) {
            g.ram.free(r.extent);
            drop(g);
            return self.already_present(&r.key, r.durable);
        }
        let block = Block {
            layout: r.layout,
            len: r.len,
            checksum: sum,
            tokens: r.tokens,
            ram: Some(r.extent),
            disk: None,
            disk_codec: Default::default(),
            ram_slot: 0,
            disk_slot: 0,
            owner: r.owner,
            ram_owner_slot: 0,
            disk_owner_slot: 0,
            hard_pin: false,
            soft_pin_until: None,
            accesses: 1,
            flushing: false,
        };
        let to_disk = r.durable || self.write_through(&g, &r.key, &block);
        // Not stored (checked above): a new record.
        let (rec, _) = g.blocks.insert(r.key, block);
        let slot = g.ram_order.insert(r.key, rec);
        let owner_slot = g
            .shares
            .enter(TierIx::Ram, r.owner, r.key, rec, r.extent.len);
        if let Some(b) = g.blocks.at_mut(rec) {
            b.ram_slot = slot;
            b.ram_owner_slot = owner_slot;
        }
        g.note(&r.key, crate::changes::BlockChange::Stored, r.owner);
        if g.ram.used() + r.len > self.ram_high {
            // The next put evicts: its victim's record loads meanwhile.
            g.prefetch_ram_victim();
        }
        if !to_disk {
            return Ok(PutOutcome {
                already_present: false,
                tier: Tier::Ram,
            });
        }
        drop(g);
        self.flush_block(&r.key, r.durable)?;
        Ok(PutOutcome {
            already_present: false,
            tier: Tier::Ram,
        })
    }

    /// A put of a stored key: count the access and, for a durable put, make sure
    /// the block is on disk with a synced index entry.
    pub(crate) fn already_present(
        &self,
        key: &BlockKey,
        durable: bool,
    ) -> Result<PutOutcome, StoreError> {
        let tier = {
            let mut g = self.inner.lock();
            match g.blocks.get_mut(key) {
                Some(b) => {
                    b.accesses = b.accesses.saturating_add(1);
                    if b.ram.is_some() {
                        Tier::Ram
                    } else {
                        Tier::Disk
                    }
                }
                None => Tier::Absent,
            }
        };
        if durable {
            self.flush_block(key, true)?;
        }
        Ok(PutOutcome {
            already_present: true,
            tier,
        })
    }

    /// Put `key` on disk if it is not there (synced when `durable`). Waits for a
    /// disk write of the same block already in flight.
    pub(crate) fn flush_block(&self, key: &BlockKey, durable: bool) -> Result<(), StoreError> {
        let Some(disk) = self.disk.as_ref() else {
            return Ok(());
        };
        loop {
            let mut g = self.inner.lock();
            let Some(b) = g.blocks.get_mut(key) else {
                return Ok(());
            };
            if b.flushing {
                drop(g);
                std::thread::sleep(std::time::Duration::from_micros(200));
                continue;
            }
            if b.disk.is_some() {
                if durable {
                    let Some(extent) = b.disk else { return Ok(()) };
                    let (checksum, owner) = (b.checksum, b.owner);
                    let mut rec = crate::disk::DiskRecord {
                        extent,
                        len: b.len,
                        checksum,
                        tokens: b.tokens,
                        layout: b.layout,
                        codec: b.disk_codec,
                        owner: None,
                    };
                    rec.owner = g.shares.name_of(owner);
                    drop(g);
                    disk.sync_data()?;
                    disk.index_put(key, &rec, true)?;
                }
                return Ok(());
            }
            let Some(ram) = b.ram else { return Ok(()) };
            b.flushing = true;
            g.lease_ram(ram);
            drop(g);
            let written = self.write_to_disk(key, ram, durable);
            let mut g = self.inner.lock();
            g.unlease_ram(ram);
            if let Some(b) = g.blocks.get_mut(key) {
                b.flushing = false;
            }
            return match written {
                Ok(true) => Ok(()),
                Ok(false) if durable => Err(StoreError::ResourceExhausted(NoRoom::DiskFull)),
                Ok(false) => Ok(()),
                Err(e) => Err(e),
            };
        }
    }
}

/// A RAM-resident block held for reading: not evicted, not freed while this lives.
pub struct ReadLease {
    pub(crate) shared: Arc<Shared>,
    pub(crate) extent: Extent,
    pub(crate) info: BlockInfo,
}

impl ReadLease {
    /// The block's bytes (exactly `info().len`).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: committed block bytes are never written, and the lease keeps the
        // extent allocated; bounds were checked when the block was stored.
        unsafe {
            self.shared
                .region
                .slice(self.extent.offset as usize, self.info.len as usize)
                .unwrap_or(&[])
        }
    }

    /// The block's xxh3-64.
    pub fn checksum(&self) -> u64 {
        self.info.checksum
    }

    /// Facts about the block.
    pub fn info(&self) -> &BlockInfo {
        &self.info
    }

    /// Offset of the block inside the RAM arena (the transfer segment).
    pub fn region_offset(&self) -> u64 {
        self.extent.offset
    }
}

impl Drop for ReadLease {
    fn drop(&mut self) {
        self.shared.inner.lock().unlease_ram(self.extent);
    }
}

/// A byte range of a block wanted in a caller's buffer (`get_into`).
pub(crate) struct RangeCopy<'a> {
    pub(crate) offset: u64,
    pub(crate) dst: &'a mut [u8],
}

impl RangeCopy<'_> {
    /// The range inside a block of `block_len` bytes, or why it is not.
    pub(crate) fn check(&self, block_len: u64) -> Result<std::ops::Range<usize>, StoreError> {
        let len = self.dst.len() as u64;
        match self.offset.checked_add(len) {
            Some(end) if end <= block_len => Ok(self.offset as usize..end as usize),
            _ => Err(StoreError::InvalidArgument(
                BadArgument::RangeOutsideBlock {
                    offset: self.offset,
                    len,
                    block_len,
                },
            )),
        }
    }

    /// Check `block` against `checksum` and copy the range out of it in the
    /// same pass (the copy's bytes are hashed from L1 as they land). The
    /// range must have passed [`RangeCopy::check`]; on a mismatch `dst`
    /// holds bytes nobody may use.
    pub(crate) fn verify_and_copy(&mut self, block: &[u8], checksum: u64) -> bool {
        let (start, end) = (self.offset as usize, self.offset as usize + self.dst.len());
        let mut h = Checksummer::new();
        h.update(&block[..start]);
        h.copy_and_update(self.dst, &block[start..end]);
        h.update(&block[end..]);
        h.digest() == checksum
    }
}
