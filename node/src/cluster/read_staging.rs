//! The staging region remote reads land in: one registered transfer segment
//! and a first-fit allocator over it (page-aligned ranges, coalesced on free).
//!
//! A [`StagingSlot`] frees its range on drop, so a failed or timed-out read
//! never leaks staging room.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::NodeError;
use kvfabric_store::{NoRoom, StoreError};
use kvfabric_transfer::{SegmentId, SharedRegion};
use parking_lot::Mutex;

const ALIGN: u64 = 4096;

/// A registered region with a free list.
pub struct Staging {
    region: Arc<SharedRegion>,
    segment: SegmentId,
    free: Mutex<BTreeMap<u64, u64>>,
}

/// One allocated range of the staging region.
pub struct StagingSlot {
    staging: Arc<Staging>,
    offset: u64,
    len: u64,
    alloc_len: u64,
}

impl Staging {
    /// Wrap `region`, registered as `segment`.
    pub fn new(region: Arc<SharedRegion>, segment: SegmentId) -> Arc<Self> {
        let mut free = BTreeMap::new();
        free.insert(0, region.len() as u64);
        Arc::new(Staging {
            region,
            segment,
            free: Mutex::new(free),
        })
    }

    /// The registered region.
    pub fn region(&self) -> &SharedRegion {
        &self.region
    }

    /// The transfer segment of the region.
    pub fn segment(&self) -> SegmentId {
        self.segment
    }

    /// Take `len` bytes; fails when no free range is large enough.
    pub fn alloc(self: &Arc<Self>, len: u64) -> Result<StagingSlot, NodeError> {
        let alloc_len = len.div_ceil(ALIGN).max(1) * ALIGN;
        let mut free = self.free.lock();
        let found = free
            .iter()
            .find(|(_, &l)| l >= alloc_len)
            .map(|(&o, &l)| (o, l));
        let Some((offset, l)) = found else {
            return Err(NodeError::Store(StoreError::ResourceExhausted(
                NoRoom::Staging {
                    len,
                    capacity: self.region.len() as u64,
                },
            )));
        };
        free.remove(&offset);
        if l > alloc_len {
            free.insert(offset + alloc_len, l - alloc_len);
        }
        Ok(StagingSlot {
            staging: self.clone(),
            offset,
            len,
            alloc_len,
        })
    }

    fn release(&self, offset: u64, len: u64) {
        let mut free = self.free.lock();
        let (mut start, mut size) = (offset, len);
        if let Some((&o, &l)) = free.range(..offset).next_back() {
            if o + l == offset {
                free.remove(&o);
                start = o;
                size += l;
            }
        }
        if let Some(&l) = free.get(&(offset + len)) {
            free.remove(&(offset + len));
            size += l;
        }
        free.insert(start, size);
    }
}

impl StagingSlot {
    /// Offset of the slot in the staging segment.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The bytes a transfer wrote into the slot.
    pub fn bytes(&self) -> Result<&[u8], NodeError> {
        // SAFETY: the range belongs to this slot alone until it drops, and the
        // transfer that filled it has completed before the caller reads.
        unsafe {
            self.staging
                .region
                .slice(self.offset as usize, self.len as usize)
        }
        .map_err(NodeError::from)
    }
}

impl Drop for StagingSlot {
    fn drop(&mut self) {
        self.staging.release(self.offset, self.alloc_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_coalesce_and_exhaustion() {
        let region = Arc::new(SharedRegion::create("staging-test", 4 * 4096).unwrap());
        let s = Staging::new(region, SegmentId(1));
        let a = s.alloc(100).unwrap();
        let b = s.alloc(4096 * 2).unwrap();
        assert_eq!(b.offset(), 4096);
        assert!(s.alloc(4096 * 2).is_err(), "only one page is left");
        drop(a);
        drop(b);
        let whole = s.alloc(4 * 4096).unwrap();
        assert_eq!(whole.offset(), 0, "freed ranges coalesce");
        assert_eq!(whole.bytes().unwrap().len(), 4 * 4096);
    }
}
