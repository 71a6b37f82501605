//! Blocks crossing the VRAM / RAM boundary: eviction into RAM (d2h DMA
//! into a RAM reservation, hashed slice by slice as it lands; RAM commits it
//! only if the hash is the block's) and promotion from RAM or disk (the
//! store's lease, hashed by the GPU in VRAM once its h2d DMA landed, or by
//! the host while the DMA runs; VRAM commits it only if the hash is the
//! block's). The DMA runs straight from and into the RAM arena, which the
//! tier registers with the device at open; if that registration failed,
//! through the staging pool. Both copy with the tier's lock released; the
//! block (eviction) or the room (promotion) is held by a lease or a
//! reservation meanwhile.

use kvfabric_transfer::checksum::Checksummer;
use parking_lot::MutexGuard;

use super::{VramBlock, VramInner, VramReserveOutcome, VramShared, VramTier};
use crate::keys::BlockKey;
use crate::store::ReserveOutcome;
use crate::{BadArgument, StoreError};

/// How a copy of a block to RAM ended.
pub(super) enum Demoted {
    /// RAM (or disk) holds the block now.
    Held,
    /// The staged bytes did not hash to the block's checksum.
    Corrupt,
}

impl VramShared {
    /// Evict `key` (picked by the order; `g` is the tier's lock) into RAM,
    /// then out of VRAM. A copy that fails its checksum drops the block
    /// (corrupt in VRAM); one RAM cannot take keeps it and reports why.
    pub(super) fn evict(
        &self,
        mut g: MutexGuard<'_, VramInner>,
        key: BlockKey,
    ) -> Result<(), StoreError> {
        let Some(b) = g.block_mut(&key) else {
            return Ok(());
        };
        b.evicting = true;
        let block = *b;
        g.lease(block.extent);
        g.evictions_in_flight += 1;
        drop(g);
        let copied = self.copy_to_ram(&key, &block);
        let mut g = self.inner.lock();
        g.evictions_in_flight -= 1;
        g.unlease(block.extent);
        match copied {
            Ok(how) => {
                g.remove(&key);
                self.publish(&g);
                drop(g);
                self.announce(&key, false);
                self.count(&self.metrics.evictions);
                match how {
                    Demoted::Held => self.count(&self.metrics.demotions),
                    Demoted::Corrupt => {
                        self.count(&self.metrics.checksum_failures);
                        tracing::warn!(
                            "VRAM block {key:?} failed its checksum on eviction; dropped"
                        );
                    }
                }
                Ok(())
            }
            Err(e) => {
                if let Some(b) = g.block_mut(&key) {
                    b.evicting = false;
                }
                Err(e)
            }
        }
    }

    /// Copy `block` into a RAM reservation through staging and commit it
    /// there if the staged bytes are the block's.
    pub(super) fn copy_to_ram(
        &self,
        key: &BlockKey,
        block: &VramBlock,
    ) -> Result<Demoted, StoreError> {
        let store = &self.store;
        let mut r = match store.reserve(*key, block.layout, block.len, block.tokens, false)? {
            ReserveOutcome::Present(_) => return Ok(Demoted::Held),
            ReserveOutcome::Reserved(r) => r,
        };
        let at = block.extent.offset as usize;
        r.fill_hashed(|buf, sum| self.to_ram(at, buf, sum))??;
        match r.commit(Some(block.checksum)) {
            Ok(_) => Ok(Demoted::Held),
            // Nothing stored: the reservation was revoked.
            Err(StoreError::InvalidArgument(BadArgument::ChecksumMismatch { .. })) => {
                Ok(Demoted::Corrupt)
            }
            Err(e) => Err(e),
        }
    }

    /// Copy `buf.len()` bytes at `at` of the segment into `buf`, RAM arena
    /// bytes: straight into them when the arena is registered with the
    /// device, else through the staging pool.
    fn to_ram(
        &self,
        at: usize,
        buf: &mut [u8],
        sum: &mut Checksummer,
    ) -> Result<(), kvfabric_transfer::TransferError> {
        match self.arena {
            Some(_) => self.staging.download_direct(&self.seg, at, buf, sum),
            None => self.staging.download(&self.seg, at, buf, sum),
        }
    }
}

impl VramTier {
    /// Promote `key` from RAM (or disk, through RAM) into VRAM. False: the
    /// store does not hold it, or its staged bytes failed the checksum.
    pub(super) fn promote(&self, key: &BlockKey) -> Result<bool, StoreError> {
        let s = &self.shared;
        let Some(lease) = s.store.lease(key)? else {
            return Ok(false);
        };
        let info = *lease.info();
        let mut r = match self.reserve(*key, info.layout, info.len, info.tokens)? {
            VramReserveOutcome::Present(_) => return Ok(true),
            VramReserveOutcome::Reserved(r) => r,
        };
        r.write_from_ram(lease.bytes())?;
        drop(lease);
        match r.commit(Some(info.checksum)) {
            Ok(_) => {
                s.count(&s.metrics.promotions);
                Ok(true)
            }
            Err(StoreError::InvalidArgument(BadArgument::ChecksumMismatch { .. })) => {
                s.count(&s.metrics.checksum_failures);
                tracing::warn!("promotion of {key:?} to VRAM failed its checksum; refused");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}
