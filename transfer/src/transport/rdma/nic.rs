//! The engine's NIC (feature `rdma`): the device opened at start (none on a
//! host without one) and the NIC registration of every segment, whose rkeys
//! go into segment metadata; and the queue pairs a served control connection
//! sets up with it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::verbs::{self, RcQueuePair, RdmaDevice, RdmaEndpoint, RdmaMemory};
use crate::core::lock;
use crate::error::Missing;
use crate::segment::RdmaKey;
use crate::{SegmentId, SharedRegion, TransferError};

/// Queue pairs one control connection may hold on the serving side.
const MAX_SERVED_QPS: usize = 16;

/// The engine's NIC, if this host has a usable one.
pub(crate) struct Nic {
    device: Option<Arc<RdmaDevice>>,
    memory: Mutex<HashMap<SegmentId, Arc<RdmaMemory>>>,
}

impl Nic {
    /// Discover devices (logging once) and open the first; a NIC without a
    /// device when there is none, or it cannot be opened.
    pub fn discover() -> Self {
        verbs::log_devices_once();
        let device = if verbs::device_names().is_empty() {
            None
        } else {
            match RdmaDevice::open(None) {
                Ok(device) => Some(device),
                Err(e) => {
                    tracing::warn!(error = %e, "RDMA device present but unusable; using tcp");
                    None
                }
            }
        };
        Nic {
            device,
            memory: Default::default(),
        }
    }

    /// Whether a device was opened (the hello says so to peers).
    pub fn present(&self) -> bool {
        self.device.is_some()
    }

    /// The opened device; `Unsupported(why)` without one.
    pub(super) fn device(&self, why: &'static str) -> Result<&Arc<RdmaDevice>, TransferError> {
        self.device
            .as_ref()
            .ok_or(TransferError::Unsupported(Missing::RdmaDevice {
                what: why,
            }))
    }

    /// Register a segment with the NIC; failure is logged and leaves the
    /// segment reachable over tcp/shm only. Nothing without a device.
    pub fn register(&self, id: SegmentId, region: Arc<SharedRegion>) {
        let Some(device) = &self.device else {
            return;
        };
        match device.register(region) {
            Ok(mem) => {
                lock(&self.memory).insert(id, Arc::new(mem));
            }
            Err(e) => tracing::warn!(segment = %id, error = %e, "RDMA registration failed"),
        }
    }

    /// Drop a segment's NIC registration (its rkey stops working once no
    /// in-flight batch holds it).
    pub fn unregister(&self, id: SegmentId) {
        lock(&self.memory).remove(&id);
    }

    /// The segment's RDMA key, when registered with the NIC.
    pub fn key(&self, id: SegmentId) -> Option<RdmaKey> {
        lock(&self.memory).get(&id).map(|m| m.key())
    }

    pub(super) fn memory(&self, id: SegmentId) -> Option<Arc<RdmaMemory>> {
        lock(&self.memory).get(&id).cloned()
    }
}

/// The queue pairs a served control connection set up: the peer's one-sided
/// ops land through them until the connection closes.
pub(crate) struct ServedQps(Vec<RcQueuePair>);

impl ServedQps {
    pub fn new() -> Self {
        ServedQps(Vec::new())
    }

    /// Serving side of the exchange: a queue pair connected to `remote`,
    /// kept with the connection; our endpoint.
    pub fn accept(
        &mut self,
        nic: &Nic,
        remote: RdmaEndpoint,
    ) -> Result<RdmaEndpoint, TransferError> {
        if self.0.len() >= MAX_SERVED_QPS {
            return Err(TransferError::Unsupported(Missing::QueuePairs {
                max: MAX_SERVED_QPS,
            }));
        }
        let mut qp = RcQueuePair::create(nic.device("no RDMA device")?)?;
        qp.connect(remote)?;
        let ours = qp.endpoint();
        self.0.push(qp);
        Ok(ours)
    }
}
