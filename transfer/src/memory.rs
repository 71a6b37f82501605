//! Page-aligned shared memory regions: the backing store of segments.
//!
//! The region type lives in `kvfabric-types` (the engine allocates its KV
//! pool as one without depending on this crate); it is re-exported here so
//! `kvfabric_transfer::SharedRegion` and `memory::page_size` keep their paths.

pub use kvfabric_types::region::{page_size, SharedRegion};
