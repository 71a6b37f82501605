//! Segments: registered memory regions with ids, and the table that resolves
//! `(segment, offset, len)` to memory after a range check.
//!
//! Every byte the engine moves, for a local caller or for a peer, goes through
//! [`SegmentTable::resolve`] first, so a range outside a registered segment is
//! refused before anything is copied.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use crate::{SharedRegion, TransferError};

/// Id of a registered segment, unique for the life of the engine (never reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SegmentId(pub u64);

impl std::fmt::Display for SegmentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seg#{}", self.0)
    }
}

/// Transport-specific keys a peer needs to reach a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportKeys {
    /// Kernel boot id of the owner's host: equal boot ids mean "same host".
    pub boot_id: String,
    /// Owner process id.
    pub pid: u32,
    /// Abstract Unix socket name that hands out the segment's memfd (shm).
    pub shm_socket: String,
    /// RDMA remote key and address, when the segment is registered with a NIC.
    pub rdma: Option<RdmaKey>,
}

/// What a peer needs for one-sided RDMA into a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaKey {
    /// Virtual address of the segment's first byte in the owner.
    pub addr: u64,
    /// Remote key of the memory region.
    pub rkey: u32,
}

/// Metadata of a segment, exchanged between nodes (through the directory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentMeta {
    /// The owner's transfer address (host:port) or configured node name.
    pub node: String,
    /// The segment id on its owner.
    pub id: SegmentId,
    /// Length in bytes.
    pub len: u64,
    /// Transport-specific keys.
    pub keys: TransportKeys,
}

/// The registered segments of one engine.
#[derive(Debug, Default)]
pub struct SegmentTable {
    next_id: AtomicU64,
    segments: RwLock<HashMap<u64, Arc<SharedRegion>>>,
}

impl SegmentTable {
    /// Register a region; returns its new id.
    pub fn register(&self, region: Arc<SharedRegion>) -> SegmentId {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        self.write_lock().insert(id, region);
        SegmentId(id)
    }

    /// Unregister; returns the region if it was registered. In-flight ops keep
    /// their own reference and finish; new ops are refused.
    pub fn unregister(&self, id: SegmentId) -> Option<Arc<SharedRegion>> {
        self.write_lock().remove(&id.0)
    }

    /// The region of a segment, without a range check.
    pub fn get(&self, id: SegmentId) -> Option<Arc<SharedRegion>> {
        self.read_lock().get(&id.0).cloned()
    }

    /// The region of `segment` if `[offset, offset+len)` lies inside it.
    /// `side` names this table in the error ("local" or a peer address).
    pub fn resolve(
        &self,
        side: &str,
        segment: u64,
        offset: u64,
        len: u64,
    ) -> Result<Arc<SharedRegion>, TransferError> {
        let region = self.read_lock().get(&segment).cloned().ok_or_else(|| {
            TransferError::UnknownSegment {
                side: side.to_string(),
                segment,
            }
        })?;
        check_range(&region, offset, len)?;
        Ok(region)
    }

    fn read_lock(&self) -> std::sync::RwLockReadGuard<'_, HashMap<u64, Arc<SharedRegion>>> {
        self.segments.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_lock(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<u64, Arc<SharedRegion>>> {
        self.segments.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// Ok when `[offset, offset+len)` lies inside `region` (u64 arithmetic, no overflow).
pub fn check_range(region: &SharedRegion, offset: u64, len: u64) -> Result<(), TransferError> {
    let out = || TransferError::OutOfBounds {
        offset,
        len,
        segment_len: region.len() as u64,
    };
    let offset_usize = usize::try_from(offset).map_err(|_| out())?;
    let len_usize = usize::try_from(len).map_err(|_| out())?;
    Ok(region.check(offset_usize, len_usize)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_refuses_unknown_unregistered_and_out_of_bounds() {
        let t = SegmentTable::default();
        let r = Arc::new(SharedRegion::create("seg", 8192).unwrap());
        let id = t.register(r);
        assert!(t.resolve("local", id.0, 0, 8192).is_ok());
        assert!(matches!(
            t.resolve("local", id.0, 8000, 193),
            Err(TransferError::OutOfBounds { .. })
        ));
        assert!(matches!(
            t.resolve("local", id.0, u64::MAX, 2),
            Err(TransferError::OutOfBounds { .. })
        ));
        assert!(matches!(
            t.resolve("local", 999, 0, 1),
            Err(TransferError::UnknownSegment { .. })
        ));
        assert!(t.unregister(id).is_some());
        assert!(matches!(
            t.resolve("local", id.0, 0, 1),
            Err(TransferError::UnknownSegment { .. })
        ));
        let id2 = t.register(Arc::new(SharedRegion::create("seg2", 4096).unwrap()));
        assert_ne!(id, id2, "ids are never reused");
    }
}
