//! `HugeAlloc`: the allocator of the store's large metadata tables (the
//! block index, the eviction orders' slabs and ghost sets), which backs every
//! allocation of 2 MiB or more with transparent huge pages.
//!
//! Why: at a million resident blocks these tables take hundreds of MB, and
//! every put, eviction and read touches a few random entries of them. With
//! 4 KiB pages each of those touches is also a TLB miss whose page walk
//! reads page-table entries that are themselves out of cache (the tables'
//! page tables alone are MBs), so an op cost grows with the number of
//! blocks even where the cache-miss count does not. With 2 MiB pages the
//! tables' translations fit the TLB (a 360 MB index is 180 entries).
//!
//! The kernel's THP mode is usually `madvise`: an anonymous mapping gets huge
//! pages only when asked. So a large allocation is its own mapping (a
//! multiple of 2 MiB, which Linux >= 6.7 places 2 MiB-aligned; on older
//! kernels only its aligned 2 MiB stretches get huge pages), advised with
//! `MADV_HUGEPAGE` before its first touch; a small one goes to the global
//! allocator. Where THP is off (`never`), the advice is ignored and the
//! mapping is ordinary memory: nothing fails, only the gain is lost.

use std::alloc::Layout;
use std::ptr::NonNull;

use allocator_api2::alloc::{AllocError, Allocator, Global};

/// The size of one huge page, and the smallest allocation that gets its own
/// mapping.
const HUGE: usize = 2 << 20;

/// The smallest page size: every mapping is aligned at least to it.
const PAGE: usize = 4096;

/// Allocations of [`HUGE`] bytes or more on huge pages; the rest on the heap.
#[derive(Clone, Copy, Debug, Default)]
pub struct HugeAlloc;

impl HugeAlloc {
    /// Whether `layout` gets its own (huge-page) mapping (a mapping is
    /// page-aligned, which covers every table's alignment).
    fn mapped(layout: &Layout) -> bool {
        layout.size() >= HUGE && layout.align() <= PAGE
    }

    /// The mapping's length for `layout` (whole huge pages).
    fn map_len(layout: &Layout) -> usize {
        layout.size().div_ceil(HUGE) * HUGE
    }
}

// SAFETY: a mapped block is `map_len` bytes of fresh read-write anonymous
// memory, aligned to at least a page (`mapped` admits no larger alignment),
// valid until `deallocate` unmaps exactly that range, and `deallocate`
// tells the two kinds apart by the same `mapped(layout)`; the rest is `Global`.
unsafe impl Allocator for HugeAlloc {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if !Self::mapped(&layout) {
            return Global.allocate(layout);
        }
        let len = Self::map_len(&layout);
        // SAFETY: a fresh private anonymous mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(AllocError);
        }
        // SAFETY: advice on the mapping just made; failure (THP compiled out)
        // leaves ordinary pages, which is still correct.
        unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
        let p = NonNull::new(p.cast::<u8>()).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, len))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if !Self::mapped(&layout) {
            // SAFETY: allocated by `Global` with this layout (see `allocate`).
            unsafe { Global.deallocate(ptr, layout) };
            return;
        }
        // SAFETY: `ptr` is the start of a mapping of `map_len(layout)` bytes
        // made by `allocate`, and nothing uses it any more.
        unsafe { libc::munmap(ptr.as_ptr().cast(), Self::map_len(&layout)) };
    }
}

/// Start loading the cache lines of `value` (a hint: the caller reads it
/// soon). The metadata tables' entries are DRAM misses at a million blocks;
/// where the store knows an entry it will need before it needs it, the load
/// overlaps with the work between. Nothing happens where the target has no
/// prefetch instruction.
#[inline]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p: *const T = value;
        let p = p.cast::<i8>();
        let last = std::mem::size_of::<T>().saturating_sub(1);
        // One prefetch per line the value touches, by address (a value need
        // not start on a line).
        let (first_line, last_line) = (p as usize / 64, (p as usize + last) / 64);
        for l in 0..=(last_line - first_line) {
            // SAFETY: a prefetch never faults and changes no memory; the
            // addresses are in (or on the lines of) `value`, which is live.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(l * 64)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small and large allocations are usable, aligned and freed; a large
    /// table (a hash map of a few MB) works through growth and shrinking.
    #[test]
    fn small_and_large_allocations_round_trip() {
        for (size, align) in [(64, 8), (HUGE - 1, 64), (HUGE, 8), (3 * HUGE + 5, 4096)] {
            let layout = Layout::from_size_align(size, align).unwrap();
            let p = HugeAlloc.allocate(layout).unwrap();
            assert!(p.len() >= size);
            let base = p.cast::<u8>().as_ptr();
            assert_eq!(base as usize % align, 0);
            // SAFETY: `size` bytes were allocated at `base`.
            unsafe {
                base.write_bytes(0xa5, size);
                assert_eq!(*base.add(size - 1), 0xa5);
                HugeAlloc.deallocate(p.cast(), layout);
            }
        }
        let mut m = hashbrown::HashMap::with_hasher_in(std::hash::RandomState::new(), HugeAlloc);
        for i in 0..200_000u64 {
            m.insert(i, [i; 4]);
        }
        assert!((0..200_000u64).all(|i| m[&i] == [i; 4]));
        m.retain(|k, _| k % 100 == 0);
        m.shrink_to_fit();
        assert_eq!(m.len(), 2000);
    }
}
