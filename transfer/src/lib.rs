//! kvfabric-transfer: moves bytes between registered memory of nodes.
//!
//! Owns segments (registered memory regions with ids), batches of one-sided
//! READ/WRITE ops against peers' segments, and the transports that carry them
//! (tcp, shm, rdma). See docs/ARCHITECTURE.md, "Transfer engine".

mod error;
pub mod memory;

pub use error::TransferError;
pub use memory::SharedRegion;
