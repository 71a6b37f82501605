//! The shared core of the transfer engine: the state every transport and
//! server works against ([`Inner`]: configuration, segment table, metrics,
//! this engine's hello, notifications, the corruption test hook), ops whose
//! local side has been checked ([`PreparedOp`]), and the assembly of a
//! batch's per-op results from the parts that ran ([`BatchResults`]).
//!
//! It knows no transport: transports import it, never the other way, so a new
//! transport is a folder under `transport/` and a line in its selection.

mod results;

#[cfg(feature = "fault-injection")]
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

pub(crate) use results::{BatchResults, OpResult};

use crate::config::TransferConfig;
use crate::error::BadInput;
use crate::hello::Hello;
use crate::metrics::TransferMetrics;
use crate::op::{Notification, TransferOp};
use crate::security::{CapabilityKey, WriteGrants};
use crate::segment::{check_range, SegmentTable};
use crate::{SharedRegion, TransferError};

/// An op whose local range has been checked, holding its local region.
#[derive(Debug, Clone)]
pub(crate) struct PreparedOp {
    pub op: TransferOp,
    pub local: Arc<SharedRegion>,
}

/// How many connections (or links) a batch can keep busy: one per slice of
/// `slice_bytes`, at least one, at most `max`.
pub(crate) fn connections_for(ops: &[PreparedOp], slice_bytes: u64, max: usize) -> usize {
    let slices: u64 = ops.iter().map(|p| p.op.len.div_ceil(slice_bytes)).sum();
    (slices as usize).clamp(1, max)
}

/// State shared by the engine handle, its servers and its batches.
pub(crate) struct Inner {
    pub config: TransferConfig,
    pub segments: SegmentTable,
    pub metrics: TransferMetrics,
    pub hello: Hello,
    pub node: String,
    /// Armed payload corruptions (feature `fault-injection`, tests only).
    #[cfg(feature = "fault-injection")]
    pub corrupt: AtomicU32,
    pub notify_tx: broadcast::Sender<Notification>,
    /// The key this engine MACs the read capabilities it issues with.
    pub caps: CapabilityKey,
    /// Ids of the capabilities issued and not yet revoked (their leases live).
    pub live_caps: Mutex<std::collections::HashSet<u64>>,
    /// The ranges peers may WRITE into (secured modes).
    pub grants: WriteGrants,
    /// The node each peer address is meant to be ([`Inner::expect_node`]).
    expected: Mutex<std::collections::HashMap<String, String>>,
}

impl Inner {
    pub fn new(
        config: TransferConfig,
        metrics: TransferMetrics,
        hello: Hello,
        node: String,
        caps: CapabilityKey,
    ) -> Self {
        let (notify_tx, _) = broadcast::channel(1024);
        Inner {
            config,
            segments: SegmentTable::default(),
            metrics,
            hello,
            node,
            #[cfg(feature = "fault-injection")]
            corrupt: AtomicU32::new(0),
            notify_tx,
            caps,
            live_caps: Mutex::new(Default::default()),
            grants: WriteGrants::default(),
            expected: Mutex::default(),
        }
    }

    /// Connections to `addr` must reach node `node_id` from now on
    /// (secured modes: its certificate's own name is verified, and its id
    /// compared); idle ones that reached another are dropped at checkout.
    pub fn expect_node(&self, addr: &str, node_id: &str) {
        let mut m = lock(&self.expected);
        if m.get(addr).map(String::as_str) != Some(node_id) {
            m.insert(addr.to_string(), node_id.to_string());
        }
    }

    /// The node `addr` is meant to be, if the user said.
    pub fn expected_node(&self, addr: &str) -> Option<String> {
        lock(&self.expected).get(addr).cloned()
    }

    /// Whether a link to `addr` that reached `peer_id` may carry ops now.
    pub fn reaches_expected(&self, addr: &str, peer_id: Option<&str>) -> bool {
        match (lock(&self.expected).get(addr), peer_id) {
            (Some(want), Some(got)) => want == got,
            _ => true,
        }
    }

    /// Consume one armed payload corruption (feature `fault-injection`,
    /// which only tests enable), if any; always false in what users deploy.
    #[cfg(feature = "fault-injection")]
    pub fn take_corruption(&self) -> bool {
        self.corrupt
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }

    /// No corruption is ever armed without the `fault-injection` feature.
    #[cfg(not(feature = "fault-injection"))]
    #[inline(always)]
    pub fn take_corruption(&self) -> bool {
        false
    }

    /// Check the local side of an op before anything moves.
    pub fn prepare(&self, op: TransferOp) -> Result<PreparedOp, TransferError> {
        if op.len == 0 {
            return Err(TransferError::InvalidArgument(BadInput::ZeroLengthOp));
        }
        let local = self
            .segments
            .resolve("local", op.local.0, op.local_offset, op.len)?;
        check_range(&local, op.local_offset, op.len)?;
        Ok(PreparedOp { op, local })
    }

    /// Prepare every op of a batch: the refused ones settle their results
    /// now; the others are returned with their positions, to run.
    pub fn prepare_batch(
        &self,
        ops: Vec<TransferOp>,
    ) -> (BatchResults, Vec<usize>, Vec<PreparedOp>) {
        let mut results = BatchResults::new(ops.len());
        let mut prepared = Vec::with_capacity(ops.len());
        let mut index = Vec::with_capacity(ops.len());
        for (i, op) in ops.into_iter().enumerate() {
            match self.prepare(op) {
                Ok(p) => {
                    prepared.push(p);
                    index.push(i);
                }
                Err(e) => results.set(i, Err(e)),
            }
        }
        (results, index, prepared)
    }
}

/// Lock a mutex, recovering it from a poisoning panic (the data it guards
/// stays consistent between statements).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
