//! `StagingPool`: the pinned host slices every copy between host memory and
//! a [`VramSegment`] goes through, and the pipelined copies themselves.
//!
//! Why staging: the copy engines only run asynchronously, at full PCIe
//! speed, from page-locked memory; the RAM arena and callers' buffers are
//! ordinary pages. Why slices: a block is cut into `slice`-byte pieces so
//! the CPU's copy (and checksum) of piece i+1 overlaps the DMA of piece i,
//! and a copy holds only `depth` slices of the pool, so many threads copy at
//! once (the pool is shared; its slices are handed out whole, so two copies
//! never share one).
//!
//! The checksum is always taken of the bytes as staged: an upload hashes
//! each slice after it lands in pinned memory (what the DMA will read), a
//! download hashes each slice as it leaves pinned memory for the caller's
//! buffer (what the caller gets). The caller compares the digest with the
//! block's before it commits or hands anything out, so a block whose staged
//! bytes are not the block's is refused (`kvfabric_store::vram`).
//!
//! `upload_direct` / `download_direct` move a block between VRAM and host
//! memory the device reaches itself (the store's RAM arena, registered with
//! `cuMemHostRegister` when the VRAM tier opens): the same slices, events
//! and checksum, with no copy through the pool's buffers. That is the
//! tier's own traffic (promotion from RAM, eviction and copies into RAM).
//! `upload_direct_device_hashed` leaves the check of a promotion to the GPU
//! (`DeviceXxh3`, the same XXH3 over the bytes as they landed in VRAM), so
//! the CPU does not read the block from DRAM beside the DMA.
//!
//! Each direction has its own stream (`GpuDevice::h2d`, `d2h`), so an upload
//! and a download proceed together on the two copy engines. Each slice has
//! an event recorded after its DMA; a slice goes back to the pool only once
//! its event completed, also when a copy fails half way.

use std::sync::Arc;

use cudarc::driver::result;

use super::pool::SlotPool;
use super::xxh3::DeviceXxh3;
use super::{cuda_err, GpuDevice, GpuEvent, PinnedBuf, VramSegment};
use crate::checksum::Checksummer;
use crate::TransferError;

/// One pinned slice and the event of the last DMA that used it.
struct Slot {
    buf: PinnedBuf,
    done: GpuEvent,
    /// A DMA was queued since the last wait on `done`.
    armed: bool,
}

impl Slot {
    fn settle(&mut self) -> Result<(), TransferError> {
        if self.armed {
            self.armed = false;
            self.done.wait()?;
        }
        Ok(())
    }
}

/// The shared pool of pinned slices (see the module doc).
pub struct StagingPool {
    dev: Arc<GpuDevice>,
    slice: usize,
    depth: usize,
    slots: SlotPool<Slot>,
}

/// Slices taken from the pool by one copy; back (settled) on drop.
struct Taken<'a> {
    pool: &'a StagingPool,
    slots: Vec<Slot>,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        for s in &mut self.slots {
            // A failed wait leaves nothing better to do than to return the
            // slice: its DMA failed with the context, and so will the next use.
            let _ = s.settle();
        }
        self.pool.slots.give_back(std::mem::take(&mut self.slots));
    }
}

impl StagingPool {
    /// `slots` pinned slices of `slice` bytes; one copy uses at most `depth` of them.
    pub fn new(
        dev: &Arc<GpuDevice>,
        slots: usize,
        slice: usize,
        depth: usize,
    ) -> Result<Self, TransferError> {
        let slots = slots.max(1);
        let mut free = Vec::with_capacity(slots);
        for _ in 0..slots {
            free.push(Slot {
                buf: PinnedBuf::new(dev, slice.max(1))?,
                done: GpuEvent::new(dev)?,
                armed: false,
            });
        }
        Ok(StagingPool {
            dev: dev.clone(),
            slice: slice.max(1),
            depth: depth.clamp(1, slots),
            slots: SlotPool::new(free),
        })
    }

    /// Bytes per slice.
    pub fn slice_len(&self) -> usize {
        self.slice
    }

    /// Take up to `want` slices, waiting until at least one is free.
    fn take(&self, want: usize) -> Taken<'_> {
        let slots = self.slots.take(want.clamp(1, self.depth));
        Taken { pool: self, slots }
    }

    /// Copy `src` into `seg` at `offset` through pinned slices on the h2d
    /// stream, feeding `sum` the staged bytes in order. Returns once every
    /// byte is in VRAM.
    pub fn upload(
        &self,
        seg: &VramSegment,
        offset: usize,
        src: &[u8],
        sum: &mut Checksummer,
    ) -> Result<(), TransferError> {
        seg.addr(offset, src.len())?;
        let mut taken = self.take(src.len().div_ceil(self.slice));
        let k = taken.slots.len();
        let stream = self.dev.h2d();
        self.dev.bind()?;
        for (i, piece) in src.chunks(self.slice).enumerate() {
            let slot = &mut taken.slots[i % k];
            slot.settle()?;
            let staged = &mut slot.buf[..piece.len()];
            sum.copy_and_update(staged, piece);
            let dst = seg.addr(offset + i * self.slice, piece.len())?;
            // SAFETY: a checked device range; the pinned slice stays ours and
            // untouched until its event (recorded next) completes.
            unsafe { result::memcpy_htod_async(dst, &*staged, stream.cu_stream()) }
                .map_err(cuda_err)?;
            slot.done.record(stream)?;
            slot.armed = true;
        }
        for slot in &mut taken.slots {
            slot.settle()?;
        }
        Ok(())
    }

    /// Copy `dst.len()` bytes of `seg` at `offset` into `dst` through pinned
    /// slices on the d2h stream, feeding `sum` the bytes in order as they
    /// leave the slices. The DMA of the next `depth - 1` slices runs while
    /// the CPU copies one out.
    pub fn download(
        &self,
        seg: &VramSegment,
        offset: usize,
        dst: &mut [u8],
        sum: &mut Checksummer,
    ) -> Result<(), TransferError> {
        seg.addr(offset, dst.len())?;
        let total = dst.len();
        let pieces = total.div_ceil(self.slice);
        let mut taken = self.take(pieces);
        let k = taken.slots.len();
        self.dev.bind()?;
        for i in 0..k.min(pieces) {
            self.queue_down(seg, offset, total, i, &mut taken.slots[i])?;
        }
        for (i, out) in dst.chunks_mut(self.slice).enumerate() {
            let slot = &mut taken.slots[i % k];
            slot.settle()?;
            sum.copy_and_update(out, &slot.buf[..out.len()]);
            if i + k < pieces {
                self.queue_down(seg, offset, total, i + k, slot)?;
            }
        }
        Ok(())
    }

    /// Copy `src`, host memory the device reaches directly (a
    /// [`super::HostRegistration`]'s, e.g. the store's RAM arena), into `seg`
    /// at `offset` with no staging copy: every slice's DMA is queued first,
    /// then `src` is fed to `sum` while they run (the caller must not change
    /// `src` meanwhile, so the bytes hashed are the bytes copied). Returns
    /// once every byte is in VRAM. (From unregistered memory the driver
    /// stages the copy itself: correct, slower.)
    pub fn upload_direct(
        &self,
        seg: &VramSegment,
        offset: usize,
        src: &[u8],
        sum: &mut Checksummer,
    ) -> Result<(), TransferError> {
        let mut taken = self.take(1);
        let slot = &mut taken.slots[0];
        self.queue_up_direct(seg, offset, src, slot)?;
        sum.update(src);
        slot.settle()
    }

    /// `upload_direct`, with the bytes checked on the device instead of
    /// the host: returns their XXH3 as `hasher` computed it in VRAM once the
    /// DMA completed (`hasher` must cover the range: `DeviceXxh3::covers`).
    /// The CPU never reads `src`, so the copy engine has the host's memory
    /// bandwidth to itself.
    pub fn upload_direct_device_hashed(
        &self,
        seg: &VramSegment,
        offset: usize,
        src: &[u8],
        hasher: &DeviceXxh3,
    ) -> Result<u64, TransferError> {
        let mut taken = self.take(1);
        let slot = &mut taken.slots[0];
        self.queue_up_direct(seg, offset, src, slot)?;
        let digest = hasher.digest_after(seg, offset, src.len(), &slot.done);
        // The DMA is done once the hash is; settle in any case, so `src` is
        // not released while the copy engine may still read it.
        slot.settle()?;
        digest
    }

    /// Queue the DMA of `src` (registered host memory) into `seg` at
    /// `offset` on the h2d stream, in slices, and arm `slot` behind it.
    fn queue_up_direct(
        &self,
        seg: &VramSegment,
        offset: usize,
        src: &[u8],
        slot: &mut Slot,
    ) -> Result<(), TransferError> {
        seg.addr(offset, src.len())?;
        let stream = self.dev.h2d();
        self.dev.bind()?;
        for (i, piece) in src.chunks(self.slice).enumerate() {
            let dst = seg.addr(offset + i * self.slice, piece.len())?;
            // SAFETY: a checked device range; the caller keeps `src` borrowed
            // until the event recorded below completes (`settle`). After a
            // failed enqueue nothing waits, but later copies into the same
            // VRAM queue behind these on this stream.
            unsafe { result::memcpy_htod_async(dst, piece, stream.cu_stream()) }
                .map_err(cuda_err)?;
        }
        slot.done.record(stream)?;
        slot.armed = true;
        Ok(())
    }

    /// Copy `dst.len()` bytes of `seg` at `offset` straight into `dst`, host
    /// memory the device reaches directly (see `upload_direct`), feeding
    /// `sum` each slice as its DMA completes while the next ones run.
    pub fn download_direct(
        &self,
        seg: &VramSegment,
        offset: usize,
        dst: &mut [u8],
        sum: &mut Checksummer,
    ) -> Result<(), TransferError> {
        seg.addr(offset, dst.len())?;
        let (total, base) = (dst.len(), dst.as_mut_ptr());
        let pieces = total.div_ceil(self.slice);
        let mut taken = self.take(pieces);
        let k = taken.slots.len();
        let stream = self.dev.d2h();
        self.dev.bind()?;
        let piece = |i: usize| {
            let at = i * self.slice;
            (at, self.slice.min(total - at))
        };
        let queue = |i: usize, slot: &mut Slot| -> Result<(), TransferError> {
            let (at, len) = piece(i);
            let src = seg.addr(offset + at, len)?;
            // SAFETY: `at..at + len` lies inside `dst`, which this call borrows
            // mutably; no other piece overlaps it, and it is read (hashed)
            // only after its event completes.
            let out = unsafe { std::slice::from_raw_parts_mut(base.add(at), len) };
            unsafe { result::memcpy_dtoh_async(out, src, stream.cu_stream()) }.map_err(cuda_err)?;
            slot.done.record(stream)?;
            slot.armed = true;
            Ok(())
        };
        for i in 0..k.min(pieces) {
            queue(i, &mut taken.slots[i])?;
        }
        for i in 0..pieces {
            let slot = &mut taken.slots[i % k];
            slot.settle()?;
            let (at, len) = piece(i);
            // SAFETY: the DMA into this piece completed (settled above).
            sum.update(unsafe { std::slice::from_raw_parts(base.add(at), len) });
            if i + k < pieces {
                queue(i + k, slot)?;
            }
        }
        Ok(())
    }

    /// Queue the DMA of piece `i` of the `total`-byte range at `offset` into `slot`.
    fn queue_down(
        &self,
        seg: &VramSegment,
        offset: usize,
        total: usize,
        i: usize,
        slot: &mut Slot,
    ) -> Result<(), TransferError> {
        let at = i * self.slice;
        let len = self.slice.min(total - at);
        let src = seg.addr(offset + at, len)?;
        let stream = self.dev.d2h();
        // SAFETY: a checked device range; the pinned slice is read only after
        // its event (recorded next) completes.
        unsafe { result::memcpy_dtoh_async(&mut slot.buf[..len], src, stream.cu_stream()) }
            .map_err(cuda_err)?;
        slot.done.record(stream)?;
        slot.armed = true;
        Ok(())
    }
}
