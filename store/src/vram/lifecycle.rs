//! The VRAM tier's handles and its data path: `VramReservation` (a put in
//! progress: room reserved, bytes written in order through staging, checked
//! and published by `commit`, the room freed if dropped uncommitted) and
//! `VramLease` (a block held in VRAM: not evicted or freed while it lives;
//! its device address is what a GPU consumer reads). `put`, `lease` and
//! `get_into` are built from them.

use std::sync::Arc;
use std::time::Instant;

use crate::tier::Tier;
use kvfabric_transfer::checksum::Checksummer;

use super::{VramBlock, VramShared, VramTier};
use crate::block_info::{BlockInfo, PutOutcome};
use crate::extent::Extent;
use crate::keys::{BlockKey, KvLayout};
use crate::metrics::OpName;
use crate::store::PutOptions;
use crate::{BadArgument, StoreError};

/// Result of [`VramTier::reserve`].
pub enum VramReserveOutcome {
    /// The key is already in VRAM: nothing to write.
    Present(PutOutcome),
    /// Room reserved: write the bytes, then commit.
    Reserved(VramReservation),
}

/// Room reserved in VRAM for one block being written.
pub struct VramReservation {
    shared: Arc<VramShared>,
    key: BlockKey,
    extent: Extent,
    len: u64,
    layout: KvLayout,
    tokens: u32,
    /// Bytes written so far (writes come in order, from offset 0).
    written: u64,
    /// XXH3 of the staged bytes written so far (boxed: its state is ~0.5 KB).
    sum: Box<Checksummer>,
    /// XXH3 of the whole block as the GPU computed it in VRAM (a promotion
    /// checked on the device); it stands for `sum` then.
    device_digest: Option<u64>,
    /// Still owns `extent` (false once committed).
    open: bool,
    started: Instant,
}

impl VramReservation {
    /// The reserved block's key.
    pub fn key(&self) -> &BlockKey {
        &self.key
    }

    /// Write the next `data.len()` bytes of the block at `offset`, which
    /// must be where the last write ended (the checksum of the staged bytes
    /// is taken on the way, in order).
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        BadArgument::check_write(offset, data.len() as u64, self.len)?;
        if offset != self.written {
            return Err(StoreError::InvalidArgument(BadArgument::OutOfOrderWrite {
                offset,
                expected: self.written,
            }));
        }
        let s = &self.shared;
        let at = (self.extent.offset + offset) as usize;
        s.staging.upload(&s.seg, at, data, &mut self.sum)?;
        self.written += data.len() as u64;
        Ok(())
    }

    /// Write the whole block from bytes of the store's RAM arena: straight
    /// from them when the arena is registered with the device (checked on
    /// the GPU when the tier has its hash and it covers the block), else
    /// through the staging pool (a promotion).
    pub(super) fn write_from_ram(&mut self, data: &[u8]) -> Result<(), StoreError> {
        let s = &self.shared;
        if s.arena.is_none() || self.written != 0 || data.len() as u64 != self.len {
            return self.write(0, data);
        }
        let at = self.extent.offset as usize;
        let addr = s.seg.addr(at, data.len())?;
        match &s.hasher {
            Some(h) if h.covers(addr, data.len()) => {
                let digest = s.staging.upload_direct_device_hashed(&s.seg, at, data, h)?;
                self.device_digest = Some(digest);
            }
            _ => s.staging.upload_direct(&s.seg, at, data, &mut self.sum)?,
        }
        self.written = self.len;
        Ok(())
    }

    /// Publish the block. Every byte must be written, and with `checksum`
    /// the staged bytes must hash to it (xxh3-64), or nothing is stored.
    pub fn commit(mut self, checksum: Option<u64>) -> Result<PutOutcome, StoreError> {
        if self.written != self.len {
            return Err(StoreError::InvalidArgument(BadArgument::ShortWrite {
                written: self.written,
                len: self.len,
            }));
        }
        let got = self.device_digest.unwrap_or_else(|| self.sum.digest());
        if let Some(want) = checksum.filter(|w| *w != got) {
            return Err(StoreError::InvalidArgument(BadArgument::ChecksumMismatch {
                want,
                got,
            }));
        }
        let s = self.shared.clone();
        let mut g = s.inner.lock();
        self.open = false;
        if g.index.contains_key(&self.key) {
            // Put meanwhile by someone else: theirs stands.
            g.alloc.free(self.extent);
            s.publish(&g);
            return Ok(PutOutcome {
                already_present: true,
                tier: Tier::Vram,
            });
        }
        let block = VramBlock {
            extent: self.extent,
            layout: self.layout,
            len: self.len,
            checksum: got,
            tokens: self.tokens,
            slot: 0,
            evicting: false,
        };
        g.insert(self.key, block);
        s.publish(&g);
        drop(g);
        s.announce(&self.key, true);
        s.metrics.observe(OpName::Put, self.started);
        Ok(PutOutcome {
            already_present: false,
            tier: Tier::Vram,
        })
    }
}

impl Drop for VramReservation {
    fn drop(&mut self) {
        if self.open {
            let mut g = self.shared.inner.lock();
            g.alloc.free(self.extent);
            self.shared.publish(&g);
        }
    }
}

/// A block held in VRAM for reading: not evicted, not freed while this lives.
pub struct VramLease {
    shared: Arc<VramShared>,
    extent: Extent,
    info: BlockInfo,
}

impl VramLease {
    /// Facts about the block (`tier` is `Vram`).
    pub fn info(&self) -> &BlockInfo {
        &self.info
    }

    /// Offset of the block in the tier's segment ([`VramTier::segment`]).
    pub fn offset(&self) -> u64 {
        self.extent.offset
    }

    /// The block's device address (what a kernel reads), `info().len` bytes.
    pub fn device_addr(&self) -> Result<u64, StoreError> {
        Ok(self
            .shared
            .seg
            .addr(self.extent.offset as usize, self.info.len as usize)?)
    }
}

impl Drop for VramLease {
    fn drop(&mut self) {
        let mut g = self.shared.inner.lock();
        g.unlease(self.extent);
        self.shared.publish(&g);
    }
}

impl VramTier {
    /// First phase of a put into VRAM: room for `len` bytes of `key`, unless
    /// VRAM holds it. Evicts into RAM as needed.
    pub fn reserve(
        &self,
        key: BlockKey,
        layout: KvLayout,
        len: u64,
        tokens: u32,
    ) -> Result<VramReserveOutcome, StoreError> {
        let started = Instant::now();
        layout.validate()?;
        let s = &self.shared;
        BadArgument::check_block_size(len, s.max_block)?;
        if s.inner.lock().index.contains_key(&key) {
            return Ok(VramReserveOutcome::Present(PutOutcome {
                already_present: true,
                tier: Tier::Vram,
            }));
        }
        let extent = s.alloc(len)?;
        Ok(VramReserveOutcome::Reserved(VramReservation {
            shared: s.clone(),
            key,
            extent,
            len,
            layout,
            tokens: if tokens == 0 {
                layout.block_tokens
            } else {
                tokens
            },
            written: 0,
            sum: Box::default(),
            device_digest: None,
            open: true,
            started,
        }))
    }

    /// One-call put of `data` into VRAM (reserve, write, commit). Idempotent.
    /// `opts.durable` is refused: VRAM does not outlive the process.
    pub fn put(
        &self,
        key: BlockKey,
        layout: KvLayout,
        data: &[u8],
        opts: PutOptions,
    ) -> Result<PutOutcome, StoreError> {
        if opts.durable {
            return Err(StoreError::InvalidArgument(BadArgument::DurableVram));
        }
        match self.reserve(key, layout, data.len() as u64, opts.tokens)? {
            VramReserveOutcome::Present(p) => Ok(p),
            VramReserveOutcome::Reserved(mut r) => {
                r.write(0, data)?;
                r.commit(opts.checksum)
            }
        }
    }

    /// Lease `key` in VRAM, promoting it from RAM or disk if needed.
    /// None = not stored (or its promotion failed its checksum).
    pub fn lease(&self, key: &BlockKey) -> Result<Option<VramLease>, StoreError> {
        let started = Instant::now();
        let s = &self.shared;
        let mut lease = self.lease_held(key);
        if lease.is_none() {
            s.count(&s.metrics.misses);
            if !self.promote(key)? {
                return Ok(None);
            }
            lease = self.lease_held(key);
        }
        if lease.is_some() {
            s.count(&s.metrics.hits);
            s.metrics.observe(OpName::Get, started);
        }
        Ok(lease)
    }

    /// A lease on `key` if VRAM holds it (touches it in the order).
    fn lease_held(&self, key: &BlockKey) -> Option<VramLease> {
        let s = &self.shared;
        let mut g = s.inner.lock();
        let (_, b) = g.block(key)?;
        let b = *b;
        g.order.touch(b.slot, key);
        g.lease(b.extent);
        Some(VramLease {
            shared: s.clone(),
            extent: b.extent,
            info: b.info(key),
        })
    }

    /// Copy the whole block `key` into `dst` (exactly its length): from VRAM
    /// through staging, checked against its checksum before returning, else
    /// from RAM or disk (no promotion: a host read does not need it on the
    /// GPU). A VRAM copy that fails its checksum is dropped from VRAM and the
    /// read falls through to RAM and disk. None = not stored.
    pub fn get_into(
        &self,
        key: &BlockKey,
        dst: &mut [u8],
    ) -> Result<Option<BlockInfo>, StoreError> {
        let s = &self.shared;
        let Some(lease) = self.lease_held(key) else {
            s.count(&s.metrics.misses);
            return self.store().get_into(key, 0, dst);
        };
        let info = lease.info;
        if dst.len() as u64 != info.len {
            return Err(StoreError::InvalidArgument(
                BadArgument::RangeOutsideBlock {
                    offset: 0,
                    len: dst.len() as u64,
                    block_len: info.len,
                },
            ));
        }
        let mut sum = Checksummer::new();
        s.staging
            .download(&s.seg, lease.extent.offset as usize, dst, &mut sum)?;
        drop(lease);
        if sum.digest() == info.checksum {
            s.count(&s.metrics.hits);
            return Ok(Some(info));
        }
        s.count(&s.metrics.checksum_failures);
        tracing::warn!("VRAM block {key:?} failed its checksum on read; dropped from VRAM");
        s.drop_blocks(&[*key]);
        self.store().get_into(key, 0, dst)
    }
}
