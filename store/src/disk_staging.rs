//! `StagingPool`: the few aligned buffers every disk I/O goes through (not
//! `cluster::read_staging`, the registered region remote reads land in).
//!
//! The disk tier never hands a RAM-arena address to O_DIRECT. A write copies
//! the block into a staging buffer and writes from there; a read lands in a
//! staging buffer, is checksummed there, and only verified bytes are copied
//! into the arena (so the arena never holds unverified disk bytes, even
//! briefly).
//!
//! Why pay a copy: measured on the reference machine (a VM whose virtio disk
//! is served by a host process that copies guest memory), 8 threads doing
//! 1.5 MiB O_DIRECT writes ran at 0.69-0.92x fio when each op used a
//! different buffer spread over a 48 MiB arena, and at 0.92-1.15x fio when
//! each thread first copied into its own reused buffer: fio itself cycles
//! through `iodepth` buffers, and a small, reused set stays in the host's
//! caches and TLBs. Reads showed the same gap (0.67-0.86x against
//! 1.03-1.14x). `bench store` (best-of-rounds ratios, same session) went from
//! 0.72-0.77 to 0.86-0.93 for writes and from 0.59-0.74 to 0.94-0.97 for
//! reads with staging. The copy costs ~0.25 ms of one core per 1.5 MiB block.
//!
//! The pool is last-in first-out, so the buffers used are the most recently
//! used ones (the hot set), and keeps at most [`KEEP`] buffers (the disk
//! ring's useful depth); more concurrent I/Os allocate and later drop extras.

use std::alloc::Layout;
use std::ptr::NonNull;

use parking_lot::Mutex;

use crate::extent::DISK_ALIGN;

/// Buffers kept for reuse: enough for the queue depths the disk tier is
/// driven at (8-16) with room for a few more.
const KEEP: usize = 24;

/// A heap buffer aligned to [`DISK_ALIGN`] for O_DIRECT.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is a plain owned heap allocation; `&AlignedBuf` only
// gives out `&[u8]`.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` zeroed bytes (rounded up to the alignment).
    pub fn new(len: usize) -> Self {
        let len = (len.max(1) as u64).div_ceil(DISK_ALIGN) as usize * DISK_ALIGN as usize;
        let layout = Layout::from_size_align(len, DISK_ALIGN as usize)
            .unwrap_or_else(|_| std::alloc::handle_alloc_error(Layout::new::<u8>()));
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: owned allocation of `len` bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: owned allocation of `len` bytes, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this exact layout.
        unsafe {
            std::alloc::dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.len, DISK_ALIGN as usize),
            )
        }
    }
}

/// Reused staging buffers, most recently returned first.
#[derive(Default)]
pub struct StagingPool {
    free: Mutex<Vec<AlignedBuf>>,
}

impl StagingPool {
    /// A buffer of at least `len` bytes (aligned length), returned to the pool
    /// when the guard drops.
    pub fn take(&self, len: usize) -> Staged<'_> {
        let popped = self.free.lock().pop();
        let buf = match popped {
            Some(b) if b.len >= len => b,
            // Too small (a block larger than any before): replace it.
            _ => AlignedBuf::new(len),
        };
        Staged {
            pool: self,
            buf: Some(buf),
            len,
        }
    }

    #[cfg(test)]
    fn kept(&self) -> usize {
        self.free.lock().len()
    }
}

/// A staging buffer on loan; derefs to exactly the `len` bytes asked for.
pub struct Staged<'a> {
    pool: &'a StagingPool,
    buf: Option<AlignedBuf>,
    len: usize,
}

impl std::ops::Deref for Staged<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.buf {
            Some(b) => &b.as_slice()[..self.len],
            None => &[],
        }
    }
}

impl std::ops::DerefMut for Staged<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.buf {
            Some(b) => &mut b.as_mut_slice()[..self.len],
            None => &mut [],
        }
    }
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            let mut free = self.pool.free.lock();
            if free.len() < KEEP {
                free.push(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_reused_last_in_first_out_and_capped() {
        let pool = StagingPool::default();
        let a = pool.take(5000);
        assert_eq!(a.len(), 5000);
        assert_eq!(a.as_ptr() as u64 % DISK_ALIGN, 0);
        let a_ptr = a.as_ptr();
        let b = pool.take(5000);
        let b_ptr = b.as_ptr();
        drop(a);
        drop(b);
        // The last one returned comes back first.
        assert_eq!(pool.take(4096).as_ptr(), b_ptr);
        let again = pool.take(100);
        assert!(again.as_ptr() == a_ptr || again.as_ptr() == b_ptr);
        drop(again);
        // A larger request does not get a short buffer.
        let big = pool.take(3 * 8192);
        assert_eq!(big.len(), 3 * 8192);
        drop(big);
        let many: Vec<_> = (0..KEEP + 5).map(|_| pool.take(4096)).collect();
        drop(many);
        assert_eq!(pool.kept(), KEEP);
    }
}
