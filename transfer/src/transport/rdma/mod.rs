//! The rdma transport: one-sided RDMA READ/WRITE over ibverbs (feature
//! `rdma`), with its control plane (queue-pair exchange, range checks that
//! answer rkeys) riding the tcp transport's connections.
//!
//! - `verbs.rs`, `completions.rs`: the raw verbs layer (devices, memory
//!   registration, queue pairs, work requests, waiting for completions);
//! - `nic.rs`: the engine's NIC and its segment registrations;
//! - `link.rs`: links (a control connection plus a queue pair) and the pool
//!   of them per peer;
//! - `control.rs`: the range round trip; `batch.rs`: running a batch.
//!
//! Without the feature `stub.rs` stands in with the same names, so nothing
//! outside this folder is compiled differently; this file is the only place
//! that looks at the feature.

#[cfg(feature = "rdma")]
mod batch;
#[cfg(feature = "rdma")]
mod completions;
#[cfg(feature = "rdma")]
mod control;
#[cfg(feature = "rdma")]
mod link;
#[cfg(feature = "rdma")]
mod nic;
/// The public `kvfabric_transfer::rdma`: the verbs layer.
#[cfg(feature = "rdma")]
pub mod verbs;

#[cfg(feature = "rdma")]
pub(crate) use link::RdmaPeer;
#[cfg(feature = "rdma")]
pub(crate) use nic::{Nic, ServedQps};

#[cfg(not(feature = "rdma"))]
mod stub;
#[cfg(not(feature = "rdma"))]
pub use stub::verbs;
#[cfg(not(feature = "rdma"))]
pub(crate) use stub::{Nic, RdmaPeer, ServedQps};
