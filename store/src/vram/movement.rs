//! Blocks crossing the VRAM / RAM boundary: eviction into RAM (through the
//! d2h staging; verified there before RAM commits it) and promotion from
//! RAM or disk (the store's lease, then the h2d staging; verified before
//! VRAM commits it). Both copy with the tier's lock released; the block
//! (eviction) or the room (promotion) is held by a lease or a reservation
//! meanwhile.

use kvfabric_transfer::checksum::Checksummer;
use parking_lot::MutexGuard;

use super::{VramBlock, VramInner, VramReserveOutcome, VramShared, VramTier};
use crate::keys::BlockKey;
use crate::store::ReserveOutcome;
use crate::StoreError;

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
        let mut sum = Checksummer::new();
        r.with_bytes_mut(|buf| {
            self.staging
                .download(&self.seg, block.extent.offset as usize, buf, &mut sum)
        })??;
        if sum.digest() != block.checksum {
            return Ok(Demoted::Corrupt); // the reservation is revoked on drop
        }
        r.commit(Some(block.checksum))?;
        Ok(Demoted::Held)
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
        r.write(0, lease.bytes())?;
        drop(lease);
        match r.commit(Some(info.checksum)) {
            Ok(_) => {
                s.count(&s.metrics.promotions);
                Ok(true)
            }
            Err(StoreError::InvalidArgument(crate::BadArgument::ChecksumMismatch { .. })) => {
                s.count(&s.metrics.checksum_failures);
                tracing::warn!("promotion of {key:?} to VRAM failed its checksum; refused");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}
