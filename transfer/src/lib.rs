//! kvfabric-transfer: moves bytes between registered memory of nodes.
//!
//! Owns segments (registered memory regions with ids), batches of one-sided
//! READ/WRITE ops against peers' segments, and the transports that carry them
//! (tcp, shm, rdma). See docs/ARCHITECTURE.md, "Transfer engine".
//!
//! ```text
//! let engine = TransferEngine::start(TransferConfig::default(), &mut registry).await?;
//! let seg = engine.register(Arc::new(SharedRegion::create("arena", 1 << 30)?));
//! let results = engine.batch("10.0.0.2:7400", vec![TransferOp::read(seg, 0, remote, 0, 4096)]).await;
//! ```

pub mod checksum;
mod config;
mod engine;
mod error;
mod io_util;
pub mod memory;
mod metrics;
mod op;
mod peer;
mod protocol;
mod segment;
mod shm;
mod tcp_client;
mod tcp_server;
#[doc(hidden)]
pub mod testdata;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "rdma")]
pub mod rdma;
#[cfg(feature = "rdma")]
mod rdma_batch;
#[cfg(feature = "rdma")]
mod rdma_link;

pub use config::{TransferConfig, TransportChoice};
pub use engine::{TransferEngine, Transport};
pub use error::TransferError;
pub use memory::SharedRegion;
pub use metrics::TransferMetrics;
pub use op::{BatchReport, Notification, OpKind, TransferOp};
pub use segment::{RdmaKey, SegmentId, SegmentMeta, TransportKeys};
