//! kvfabric-transfer: moves bytes between registered memory of nodes.
//!
//! Owns segments (registered memory regions with ids), batches of one-sided
//! READ/WRITE ops against peers' segments, and the transports that carry them
//! (tcp, shm, rdma). See docs/ARCHITECTURE.md, "Transfer engine".
//!
//! The handle is `fabric.rs`; the state every transport shares is `core/`,
//! which knows no transport; each transport is a folder under `transport/`,
//! behind one contract, and `transport/select.rs` picks one per peer.
//!
//! ```text
//! let engine = TransferEngine::start(TransferConfig::default(), &mut registry).await?;
//! let seg = engine.register(Arc::new(SharedRegion::create("arena", 1 << 30)?));
//! let results = engine.batch("10.0.0.2:7400", vec![TransferOp::read(seg, 0, remote, 0, 4096)]).await;
//! ```

pub mod checksum;
mod config;
mod core;
mod error;
mod fabric;
mod hello;
pub mod memory;
mod metrics;
mod op;
pub mod security;
mod segment;
mod transport;

#[cfg(feature = "cuda")]
pub mod cuda;

pub use config::{TransferConfig, TransportChoice, WireCompression};
pub use error::{
    vocabulary_message, BadInput, ConnectionFault, ForbiddenReason, Missing, RefusalReason,
    TransferError,
};
pub use fabric::TransferEngine;
pub use kvfabric_types::IoError;
pub use memory::SharedRegion;
pub use metrics::{TransferMetrics, WireFlow, WireTotals};
pub use op::{BatchReport, Notification, OpKind, TransferOp};
pub use segment::{RdmaKey, SegmentId, SegmentMeta, TransportKeys};
/// The rdma verbs layer (feature `rdma`); without the feature only
/// `device_names`, which finds none.
pub use transport::rdma::verbs as rdma;
pub use transport::Transport;
