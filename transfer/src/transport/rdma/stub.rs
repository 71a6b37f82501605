//! The rdma transport in a build without the `rdma` feature: the same names
//! as the real one, so callers never `cfg`. There is no NIC, so rdma is never
//! chosen under `auto`; asked for explicitly, it is `Unsupported`.

use std::sync::Arc;

use crate::core::{Inner, OpResult, PreparedOp};
use crate::error::Missing;
use crate::hello::Hello;
use crate::segment::RdmaKey;
use crate::transport::contract::BatchTransport;
use crate::transport::tcp::protocol::RdmaEndpoint;
use crate::{SegmentId, SharedRegion, TransferError};

fn unsupported() -> TransferError {
    TransferError::Unsupported(Missing::RdmaFeature)
}

/// No NIC: nothing registers, no segment has a key.
pub(crate) struct Nic;

impl Nic {
    pub fn discover() -> Self {
        Nic
    }

    pub fn present(&self) -> bool {
        false
    }

    pub fn register(&self, _id: SegmentId, _region: Arc<SharedRegion>) {}

    pub fn unregister(&self, _id: SegmentId) {}

    pub fn key(&self, _id: SegmentId) -> Option<RdmaKey> {
        None
    }
}

/// No queue pair is ever set up.
pub(crate) struct ServedQps;

impl ServedQps {
    pub fn new() -> Self {
        ServedQps
    }

    pub fn accept(
        &mut self,
        _nic: &Nic,
        _remote: RdmaEndpoint,
    ) -> Result<RdmaEndpoint, TransferError> {
        Err(unsupported())
    }
}

/// No rdma links to any peer.
pub(crate) struct RdmaPeer;

impl RdmaPeer {
    pub fn new(_nic: Arc<Nic>) -> Self {
        RdmaPeer
    }

    pub fn ready(&self) -> bool {
        false
    }

    pub async fn open(
        &self,
        _inner: &Inner,
        _peer: &str,
        _hello: &Hello,
    ) -> Result<(), TransferError> {
        Err(unsupported())
    }
}

impl BatchTransport for RdmaPeer {
    async fn run_batch(
        &self,
        _inner: &Arc<Inner>,
        _peer: &str,
        ops: Vec<PreparedOp>,
    ) -> Vec<Option<OpResult>> {
        vec![Some(Err(unsupported())); ops.len()]
    }
}

/// The public `kvfabric_transfer::rdma` without the feature.
pub mod verbs {
    /// Names of the RDMA devices this build can use: none.
    pub fn device_names() -> Vec<String> {
        Vec::new()
    }
}
