//! The transports that carry batches, behind one contract.
//!
//! - `contract.rs`: the [`Transport`] names and what a transport's per-peer
//!   links do with a batch;
//! - `select.rs`: the one place that picks a transport for a peer and
//!   dispatches its batches, and starts every transport's server;
//! - `tcp/`, `shm/`, `rdma/`: one folder per transport (`rdma/` compiles to
//!   a stub without the `rdma` feature);
//! - `io.rs`: deadline-bounded I/O helpers the transports share.
//!
//! The shared core (`crate::core`) imports none of this.

mod contract;
mod idle;
mod io;
pub mod rdma;
mod select;
mod shm;
mod tcp;

pub use contract::Transport;
pub(crate) use select::{Listeners, Transports};
