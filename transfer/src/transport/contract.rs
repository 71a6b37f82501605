//! The contract between the transfer engine and its transports: the
//! [`Transport`] names, and [`BatchTransport`], what every transport's
//! per-peer link pool does with a batch.
//!
//! Which transport runs a batch is decided in one place (`select.rs`); a
//! transport only runs what it is given.

use std::sync::Arc;

use crate::core::{Inner, OpResult, PreparedOp};

/// The transport that carries a peer's batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Shm,
    /// Only with the `rdma` feature, a device on both ends and a working
    /// queue-pair exchange.
    Rdma,
}

/// What a transport's links to one peer do with a batch.
///
/// `run_batch` checks links out of the peer's pool (opening what is missing),
/// runs `ops` (their local ranges already checked) and returns the healthy
/// links; a broken link drops the pool, so the selection is made again on the
/// next batch. It counts its ops in the transport's metrics.
pub(crate) trait BatchTransport {
    /// Whether this transport may hand ops back (`None` slots) to run over
    /// tcp; only then does the caller keep a copy of the batch for that.
    const HANDS_BACK: bool = false;

    /// One slot per op, in order: its result, or `None` when this transport
    /// cannot carry it (only when [`Self::HANDS_BACK`]).
    async fn run_batch(
        &self,
        inner: &Arc<Inner>,
        peer: &str,
        ops: Vec<PreparedOp>,
    ) -> Vec<Option<OpResult>>;
}
