//! VRAM segments (feature `cuda`): device memory that the fabric fills or
//! drains through a registered host staging region (tcp and shm move host
//! bytes; a GPU-direct path would register the VRAM with the NIC instead).
//!
//! The CUDA driver is loaded at run time (cudarc `dynamic-loading`), so this
//! builds without a toolkit, and on a host without the driver every call
//! returns `Unsupported("no CUDA device ...")` instead of panicking.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

use crate::error::Missing;
use crate::{SharedRegion, TransferError};

fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

fn cuda_err(e: impl std::fmt::Display) -> TransferError {
    TransferError::io_other("cuda", e)
}

/// Number of CUDA devices, or `Unsupported` when there is no driver.
pub fn device_count() -> Result<usize, TransferError> {
    if !driver_present() {
        return Err(TransferError::Unsupported(Missing::CudaDriver));
    }
    CudaContext::device_count()
        .map(|n| n as usize)
        .map_err(cuda_err)
}

/// A region of device memory usable as a transfer endpoint via staging.
pub struct VramSegment {
    stream: Arc<CudaStream>,
    buf: CudaSlice<u8>,
}

impl VramSegment {
    /// Allocate `len` zeroed bytes on device `ordinal`.
    pub fn allocate(ordinal: usize, len: usize) -> Result<Self, TransferError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(TransferError::Unsupported(Missing::CudaDevice {
                ordinal,
                count,
            }));
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda_err)?;
        let stream = ctx.default_stream();
        let buf = stream.alloc_zeros::<u8>(len).map_err(cuda_err)?;
        Ok(VramSegment { stream, buf })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Always false for an allocated segment.
    pub fn is_empty(&self) -> bool {
        self.buf.len() == 0
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), TransferError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.buf.len() => Ok(()),
            _ => Err(TransferError::OutOfBounds {
                offset: offset as u64,
                len: len as u64,
                segment_len: self.buf.len() as u64,
            }),
        }
    }

    /// Copy `len` bytes at `offset` of VRAM into `host` at `host_offset`
    /// (after which a peer can READ them from the host segment).
    pub fn stage_out(
        &self,
        offset: usize,
        len: usize,
        host: &SharedRegion,
        host_offset: usize,
    ) -> Result<(), TransferError> {
        self.check(offset, len)?;
        // SAFETY: range checked; the caller owns the host range.
        let dst = unsafe { host.slice_mut(host_offset, len)? };
        let src = self.buf.slice(offset..offset + len);
        self.stream.memcpy_dtoh(&src, dst).map_err(cuda_err)?;
        self.stream.synchronize().map_err(cuda_err)
    }

    /// Copy `len` bytes of `host` at `host_offset` (e.g. just written by a
    /// peer) into VRAM at `offset`.
    pub fn stage_in(
        &mut self,
        offset: usize,
        len: usize,
        host: &SharedRegion,
        host_offset: usize,
    ) -> Result<(), TransferError> {
        self.check(offset, len)?;
        // SAFETY: range checked; the caller owns the host range.
        let src = unsafe { host.slice(host_offset, len)? };
        let mut dst = self.buf.slice_mut(offset..offset + len);
        self.stream.memcpy_htod(src, &mut dst).map_err(cuda_err)?;
        self.stream.synchronize().map_err(cuda_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_is_reported_not_a_panic() {
        match VramSegment::allocate(0, 4096) {
            Ok(mut v) => {
                // A real device: round-trip through staging.
                let host = SharedRegion::create("stage", 4096).unwrap();
                unsafe { host.slice_mut(0, 4).unwrap().copy_from_slice(b"vram") };
                v.stage_in(0, 4, &host, 0).unwrap();
                v.stage_out(0, 4, &host, 100).unwrap();
                assert_eq!(unsafe { host.slice(100, 4).unwrap() }, b"vram");
                assert!(v.stage_out(4090, 10, &host, 0).is_err());
            }
            Err(e) => assert!(
                matches!(e, TransferError::Unsupported(_) | TransferError::Io { .. }),
                "{e}"
            ),
        }
    }
}
