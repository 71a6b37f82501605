//! Page-aligned shared memory regions: the backing store of segments.
//!
//! A [`SharedRegion`] is a memfd mapped into this process. Being a memfd, the
//! same pages can be mapped by a peer process on the same host (the `shm`
//! transport passes the fd over a Unix socket), so a READ between two local
//! processes is one memcpy. The store's RAM tier arena is one such region,
//! registered once as a transfer segment, and so is an engine's KV pool.
//!
//! Here, not in the transfer crate, because the engine allocates its pool as
//! one and needs nothing else of transfer; `kvfabric_transfer` re-exports it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use crate::TypesError;

/// A memfd-backed, page-aligned, zero-initialised memory region mapped read-write.
#[derive(Debug)]
pub struct SharedRegion {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the region is plain memory owned by this value; concurrent access to
// disjoint ranges is coordinated by the owners of the ranges (allocators,
// leases), never by this type.
unsafe impl Send for SharedRegion {}
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// Create a region of `len` bytes (rounded up to whole pages).
    pub fn create(name: &str, len: usize) -> Result<Self, TypesError> {
        if len == 0 {
            return Err(TypesError::InvalidArgument("region length is zero".into()));
        }
        let page = page_size();
        let len = len.div_ceil(page) * page;
        let cname = std::ffi::CString::new(name)
            .map_err(|_| TypesError::InvalidArgument("region name contains NUL".into()))?;
        // SAFETY: plain syscalls on a valid C string; results are checked.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(TypesError::io(
                "memfd_create",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: `raw` is a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: valid fd; length checked above.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(TypesError::io("ftruncate", std::io::Error::last_os_error()));
        }
        Self::map(fd, len)
    }

    /// Map a region received from a peer (its memfd) into this process.
    ///
    /// Refuses an fd whose file is shorter than `len` (touching pages past the
    /// end of a memfd would raise SIGBUS instead of an error).
    pub fn from_fd(fd: OwnedFd, len: usize) -> Result<Self, TypesError> {
        if len == 0 {
            return Err(TypesError::InvalidArgument("region length is zero".into()));
        }
        // SAFETY: fstat on a valid fd into a zeroed stat buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(TypesError::io("fstat", std::io::Error::last_os_error()));
        }
        if (st.st_size as u64) < len as u64 {
            return Err(TypesError::InvalidArgument(format!(
                "fd holds {} bytes, {} requested",
                st.st_size, len
            )));
        }
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> Result<Self, TypesError> {
        // SAFETY: mapping a valid fd of at least `len` bytes, shared, read-write.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(TypesError::io("mmap", std::io::Error::last_os_error()));
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| TypesError::io("mmap", std::io::Error::other("mmap returned null")))?;
        Ok(SharedRegion { ptr, len, fd })
    }

    /// [`Self::create`], with every page backed by memory before the region
    /// is returned, so no later access to it takes a page fault.
    ///
    /// A fresh memfd has no pages: each first touch of a 4 KiB page costs a
    /// fault that allocates and zeroes it. For a region that is filled in
    /// bursts (an engine's KV pool receiving a 94 MB prefix, a RAM tier
    /// taking puts) those faults cost as much as the copy itself, so a region
    /// that will be used whole is populated once, up front (resident from
    /// then on).
    pub fn create_populated(name: &str, len: usize) -> Result<Self, TypesError> {
        let region = Self::create(name, len)?;
        let started = std::time::Instant::now();
        region.populate()?;
        tracing::debug!(
            name,
            bytes = region.len,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "region populated"
        );
        Ok(region)
    }

    /// Back every page with memory (as the first write would). Uses
    /// `MADV_POPULATE_WRITE` (Linux 5.14); on older kernels it rewrites one
    /// byte per page, which is only safe while nobody else can write the
    /// region: hence private, called before the region is handed out.
    fn populate(&self) -> Result<(), TypesError> {
        // SAFETY: the range is this mapping, read-write and `len` bytes long.
        let rc = unsafe {
            libc::madvise(
                self.ptr.as_ptr().cast(),
                self.len,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINVAL) {
            return Err(TypesError::io("madvise", err));
        }
        let page = page_size();
        for off in (0..self.len).step_by(page) {
            // SAFETY: `off < len`; a volatile read-write of one byte leaves
            // the contents as they were, and no one else holds the region yet.
            unsafe {
                let p = self.ptr.as_ptr().add(off);
                std::ptr::write_volatile(p, std::ptr::read_volatile(p));
            }
        }
        Ok(())
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: regions have at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Base address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The memfd, for handing the region to a local peer.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// A bounds-checked view of `len` bytes at `offset`.
    ///
    /// # Safety
    /// The caller must ensure no one writes the range while the slice lives.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> Result<&[u8], TypesError> {
        self.check(offset, len)?;
        Ok(std::slice::from_raw_parts(
            self.ptr.as_ptr().add(offset),
            len,
        ))
    }

    /// A bounds-checked mutable view of `len` bytes at `offset`.
    ///
    /// # Safety
    /// The caller must own the range exclusively while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> Result<&mut [u8], TypesError> {
        self.check(offset, len)?;
        Ok(std::slice::from_raw_parts_mut(
            self.ptr.as_ptr().add(offset),
            len,
        ))
    }

    /// Ok when `[offset, offset+len)` lies inside the region.
    pub fn check(&self, offset: usize, len: usize) -> Result<(), TypesError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(TypesError::OutOfBounds {
                offset: offset as u64,
                len: len as u64,
                segment_len: self.len as u64,
            }),
        }
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_write_read_and_bounds() {
        let r = SharedRegion::create("t", 10_000).unwrap();
        assert_eq!(r.len() % page_size(), 0);
        unsafe {
            r.slice_mut(100, 4).unwrap().copy_from_slice(b"abcd");
            assert_eq!(r.slice(100, 4).unwrap(), b"abcd");
        }
        assert!(r.check(r.len() - 1, 2).is_err());
        assert!(r.check(usize::MAX, 2).is_err());
        assert!(SharedRegion::create("t", 0).is_err());
    }

    /// Pages of the region that are resident (`mincore`).
    fn resident_pages(r: &SharedRegion) -> usize {
        let mut vec = vec![0u8; r.len() / page_size()];
        // SAFETY: the range is the region's mapping; `vec` has one byte per page.
        let rc = unsafe { libc::mincore(r.as_ptr().cast(), r.len(), vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|b| *b & 1 == 1).count()
    }

    #[test]
    fn populate_backs_every_page_and_keeps_the_bytes() {
        let r = SharedRegion::create("t", 64 * page_size()).unwrap();
        unsafe {
            r.slice_mut(5 * page_size() + 7, 4)
                .unwrap()
                .copy_from_slice(b"kvfb")
        };
        assert!(resident_pages(&r) < 64, "a fresh memfd is not all resident");
        r.populate().unwrap();
        assert_eq!(resident_pages(&r), 64);
        let fresh = SharedRegion::create_populated("t", 64 * page_size()).unwrap();
        assert_eq!(resident_pages(&fresh), 64);
        unsafe {
            assert_eq!(r.slice(5 * page_size() + 7, 4).unwrap(), b"kvfb");
            assert!(r.slice(0, r.len()).unwrap()[..5 * page_size()]
                .iter()
                .all(|b| *b == 0));
        }
    }
}
