//! Page-locked host memory, the only host memory the copy engines read and
//! write asynchronously at full speed: `PinnedBuf` (allocated by the driver,
//! `cuMemHostAlloc`, freed on drop) and `HostRegistration` (memory someone
//! else owns, registered with the driver until drop).

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::{cuda_err, GpuDevice};
use crate::TransferError;

/// `len` bytes of pinned host memory, zeroed at allocation.
pub struct PinnedBuf {
    dev: Arc<GpuDevice>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain host memory owned by this value; `&`/`&mut`
// access follows Rust's rules through Deref/DerefMut.
unsafe impl Send for PinnedBuf {}
unsafe impl Sync for PinnedBuf {}

impl PinnedBuf {
    /// Allocate `len` (> 0) pinned bytes in `dev`'s context.
    pub fn new(dev: &Arc<GpuDevice>, len: usize) -> Result<Self, TransferError> {
        dev.bind()?;
        // SAFETY: a plain allocation; zeroed below before any read.
        let ptr = unsafe { result::malloc_host(len.max(1), 0) }.map_err(cuda_err)? as *mut u8;
        // SAFETY: `ptr` points at `len` writable bytes we own.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(PinnedBuf {
            dev: dev.clone(),
            ptr,
            len,
        })
    }
}

impl Deref for PinnedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for PinnedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: allocated by malloc_host, freed once; no copy into or
            // out of it is in flight (its users wait for their events).
            let _ = unsafe { result::free_host(self.ptr.cast()) };
        }
    }
}

/// Host memory someone else owns (the store's RAM arena), page-locked and
/// known to the device while this lives (`cuMemHostRegister`): copies to and
/// from it run as DMA straight from and into it, with no staging copy.
pub struct HostRegistration {
    dev: Arc<GpuDevice>,
    ptr: *mut u8,
}

// SAFETY: only the address is kept, to unregister it; the memory is the owner's.
unsafe impl Send for HostRegistration {}
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Register `len` bytes at `ptr` with the device.
    ///
    /// # Safety
    /// `ptr .. ptr + len` must stay mapped until the registration is dropped.
    pub unsafe fn new(
        dev: &Arc<GpuDevice>,
        ptr: *mut u8,
        len: usize,
    ) -> Result<Self, TransferError> {
        dev.bind()?;
        sys::cuMemHostRegister_v2(ptr.cast(), len, sys::CU_MEMHOSTREGISTER_PORTABLE)
            .result()
            .map_err(cuda_err)?;
        Ok(HostRegistration {
            dev: dev.clone(),
            ptr,
        })
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: registered by `new`, unregistered once; still mapped (its contract).
            let _ = unsafe { sys::cuMemHostUnregister(self.ptr.cast()) };
        }
    }
}
