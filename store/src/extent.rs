//! `ExtentAllocator`: aligned extents inside one linear space (the RAM arena or
//! the disk file).
//!
//! Best-fit over a free list kept twice (by offset, for coalescing with
//! neighbours on free; by size, for the best fit). Blocks are mostly one size,
//! so a freed extent is usually reused exactly and nothing fragments; mixed
//! sizes still work because neighbours coalesce. Every extent is a multiple of
//! `align` (4 KiB), so RAM extents can be handed to O_DIRECT I/O as they are.

use std::collections::{BTreeMap, BTreeSet};

/// Alignment of every disk extent and of every buffer handed to O_DIRECT.
/// Here, below the disk tier, its codec and its staging buffers, so they
/// share it without importing each other.
pub const DISK_ALIGN: u64 = 4096;

/// One allocated range `[offset, offset + len)`; `len` is a multiple of the alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
}

/// Free-list allocator with best fit and coalescing.
#[derive(Debug)]
pub struct ExtentAllocator {
    capacity: u64,
    align: u64,
    used: u64,
    free_by_offset: BTreeMap<u64, u64>,
    free_by_size: BTreeSet<(u64, u64)>,
}

impl ExtentAllocator {
    /// An allocator over `[0, capacity)` (rounded down to `align`), all free.
    pub fn new(capacity: u64, align: u64) -> Self {
        let capacity = capacity / align * align;
        let mut a = ExtentAllocator {
            capacity,
            align,
            used: 0,
            free_by_offset: BTreeMap::new(),
            free_by_size: BTreeSet::new(),
        };
        if capacity > 0 {
            a.insert_free(0, capacity);
        }
        a
    }

    /// Total bytes managed.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes currently allocated.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// `len` rounded up to the alignment.
    pub fn rounded(&self, len: u64) -> u64 {
        len.max(1).div_ceil(self.align) * self.align
    }

    /// Allocate an extent holding `len` bytes, or None when no free range is large enough.
    pub fn alloc(&mut self, len: u64) -> Option<Extent> {
        let want = self.rounded(len);
        let &(size, offset) = self.free_by_size.range((want, 0)..).next()?;
        self.remove_free(offset, size);
        if size > want {
            self.insert_free(offset + want, size - want);
        }
        self.used += want;
        Some(Extent { offset, len: want })
    }

    /// Claim a specific extent (recovery from the disk index). False when any of it is not free.
    pub fn claim(&mut self, ext: Extent) -> bool {
        let Some((&start, &size)) = self.free_by_offset.range(..=ext.offset).next_back() else {
            return false;
        };
        if ext.len == 0 || ext.offset % self.align != 0 || start + size < ext.offset + ext.len {
            return false;
        }
        self.remove_free(start, size);
        if ext.offset > start {
            self.insert_free(start, ext.offset - start);
        }
        let end = ext.offset + ext.len;
        if start + size > end {
            self.insert_free(end, start + size - end);
        }
        self.used += ext.len;
        true
    }

    /// Return an extent; it merges with free neighbours.
    pub fn free(&mut self, ext: Extent) {
        let mut offset = ext.offset;
        let mut len = ext.len;
        if let Some((&prev, &plen)) = self.free_by_offset.range(..offset).next_back() {
            if prev + plen == offset {
                self.remove_free(prev, plen);
                offset = prev;
                len += plen;
            }
        }
        if let Some(&nlen) = self.free_by_offset.get(&(ext.offset + ext.len)) {
            self.remove_free(ext.offset + ext.len, nlen);
            len += nlen;
        }
        self.insert_free(offset, len);
        self.used -= ext.len;
    }

    /// Size of the largest free extent.
    #[cfg(test)]
    pub fn largest_free(&self) -> u64 {
        self.free_by_size.iter().next_back().map_or(0, |&(s, _)| s)
    }

    fn insert_free(&mut self, offset: u64, len: u64) {
        self.free_by_offset.insert(offset, len);
        self.free_by_size.insert((len, offset));
    }

    fn remove_free(&mut self, offset: u64, len: u64) {
        self.free_by_offset.remove(&offset);
        self.free_by_size.remove(&(len, offset));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_blocks_reuse_and_fill_exactly() {
        let mut a = ExtentAllocator::new(10 * 4096, 4096);
        let exts: Vec<_> = (0..10).map(|_| a.alloc(4000).unwrap()).collect();
        assert!(a.alloc(1).is_none());
        assert_eq!(a.used(), 10 * 4096);
        a.free(exts[3]);
        assert_eq!(a.alloc(4096).unwrap(), exts[3]);
    }

    #[test]
    fn mixed_sizes_coalesce() {
        let mut a = ExtentAllocator::new(16 * 4096, 4096);
        let x = a.alloc(3 * 4096).unwrap();
        let y = a.alloc(4096).unwrap();
        let z = a.alloc(5 * 4096).unwrap();
        a.free(x);
        a.free(z);
        a.free(y);
        assert_eq!(a.used(), 0);
        assert_eq!(a.largest_free(), 16 * 4096);
        // No overlap between live extents of mixed sizes.
        let e1 = a.alloc(10_000).unwrap();
        let e2 = a.alloc(50_000).unwrap();
        assert!(e1.offset + e1.len <= e2.offset || e2.offset + e2.len <= e1.offset);
    }

    #[test]
    fn claim_exact_ranges_for_recovery() {
        let mut a = ExtentAllocator::new(8 * 4096, 4096);
        assert!(a.claim(Extent {
            offset: 4096,
            len: 8192
        }));
        assert!(
            !a.claim(Extent {
                offset: 8192,
                len: 4096
            }),
            "overlap refused"
        );
        assert!(
            !a.claim(Extent {
                offset: 100,
                len: 4096
            }),
            "misaligned refused"
        );
        assert_eq!(a.used(), 8192);
        let e = a.alloc(4096).unwrap();
        assert_eq!(e.offset, 0);
    }
}
