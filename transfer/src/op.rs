//! The ops a batch is made of, and what a batch reports.

use crate::security::Capability;
use crate::{SegmentId, TransferError};

/// Largest notification payload accepted (by every transport).
pub const MAX_NOTIFY_BYTES: u64 = 1 << 20;

/// READ pulls remote bytes into local memory; WRITE pushes local bytes to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
}

/// One one-sided op: `(local segment, offset, len) <-> (remote segment, offset)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferOp {
    pub kind: OpKind,
    pub local: SegmentId,
    pub local_offset: u64,
    pub remote: SegmentId,
    pub remote_offset: u64,
    pub len: u64,
    /// The sender computes an xxh3 checksum of every slice and the receiver
    /// verifies it before the op can succeed.
    pub checksum: bool,
    /// READ in a secured mode: the holder's grant for the remote range,
    /// shown with every slice.
    pub capability: Option<Capability>,
    /// Bytes per element of the data (2 for f16/bf16 KV blocks, 4 for f32),
    /// or 0 when unknown. Only a READ that names its width may travel
    /// encoded with the block codec on tcp (`wire_compression`).
    pub element_width: u8,
}

impl TransferOp {
    /// READ `len` bytes at `remote_offset` of the peer's `remote` segment into
    /// `local` at `local_offset`.
    pub fn read(
        local: SegmentId,
        local_offset: u64,
        remote: SegmentId,
        remote_offset: u64,
        len: u64,
    ) -> Self {
        TransferOp {
            kind: OpKind::Read,
            local,
            local_offset,
            remote,
            remote_offset,
            len,
            checksum: false,
            capability: None,
            element_width: 0,
        }
    }

    /// WRITE `len` bytes of `local` at `local_offset` into the peer's `remote`
    /// segment at `remote_offset`.
    pub fn write(
        local: SegmentId,
        local_offset: u64,
        remote: SegmentId,
        remote_offset: u64,
        len: u64,
    ) -> Self {
        TransferOp {
            kind: OpKind::Write,
            ..Self::read(local, local_offset, remote, remote_offset, len)
        }
    }

    /// The same op carrying the holder's capability for its remote range.
    pub fn with_capability(self, capability: Capability) -> Self {
        TransferOp {
            capability: Some(capability),
            ..self
        }
    }

    /// The same op naming its data's element width (2 or 4 bytes; other
    /// widths are never compressed), so tcp may carry it encoded.
    pub fn with_element_width(self, width: u8) -> Self {
        TransferOp {
            element_width: width,
            ..self
        }
    }

    /// The same op with payload checksums on.
    pub fn with_checksum(self) -> Self {
        TransferOp {
            checksum: true,
            ..self
        }
    }
}

/// A notification a peer delivered after a batch (e.g. "your blocks are in").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// Process id of the sender, as it said at hello.
    pub from_pid: u32,
    pub payload: Vec<u8>,
}

/// Outcome of [`crate::TransferEngine::batch_then_notify`].
#[derive(Debug)]
pub struct BatchReport {
    /// One result per op, in submission order.
    pub ops: Vec<Result<(), TransferError>>,
    /// Whether the notification was delivered; it is sent only when every op
    /// succeeded (otherwise `Err(InvalidArgument)` says it was withheld).
    pub notified: Result<(), TransferError>,
}
