//! The transfer crate's one error type.
//!
//! Every op of a batch reports its own `Result<(), TransferError>`, so the
//! variants name what went wrong with that op precisely enough for a caller to
//! decide between "retry elsewhere" (peer faults) and "bug" (bad ranges).

/// Everything that can go wrong moving bytes.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum TransferError {
    /// A caller passed something unusable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A range that does not lie inside its segment.
    #[error("range {offset}+{len} is outside the segment ({segment_len} bytes)")]
    OutOfBounds {
        offset: u64,
        len: u64,
        segment_len: u64,
    },
    /// The named segment is not registered (never was, or was unregistered).
    #[error("unknown segment {segment} on {side}")]
    UnknownSegment {
        /// `local` or the peer's address.
        side: String,
        segment: u64,
    },
    /// The peer refused an op (its own range check) with this reason.
    #[error("peer {peer} refused the op: {reason}")]
    Refused { peer: String, reason: String },
    /// The peer refused an op its caller has no right to (no or a wrong
    /// capability, a WRITE outside the ranges it granted).
    #[error("peer {peer} forbade the op: {reason}")]
    Forbidden { peer: String, reason: String },
    /// A payload did not match the checksum its sender computed.
    #[error("checksum mismatch on {segment}@{offset}+{len}")]
    Checksum { segment: u64, offset: u64, len: u64 },
    /// The peer did not answer within the op timeout.
    #[error("peer {peer} timed out after {timeout_ms} ms")]
    Timeout { peer: String, timeout_ms: u64 },
    /// The connection to the peer broke (peer died, reset, protocol error).
    #[error("connection to {peer} failed: {reason}")]
    Connection { peer: String, reason: String },
    /// A transport or device this build or host does not have.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// An OS call failed.
    #[error("i/o error: {0}")]
    Io(String),
}

impl From<std::io::Error> for TransferError {
    fn from(e: std::io::Error) -> Self {
        TransferError::Io(e.to_string())
    }
}

/// Regions (`kvfabric-types`) report the variants this crate reported when
/// it owned them.
impl From<kvfabric_types::TypesError> for TransferError {
    fn from(e: kvfabric_types::TypesError) -> Self {
        use kvfabric_types::TypesError as T;
        match e {
            T::InvalidArgument(msg) => TransferError::InvalidArgument(msg),
            T::OutOfBounds {
                offset,
                len,
                segment_len,
            } => TransferError::OutOfBounds {
                offset,
                len,
                segment_len,
            },
            T::Io(msg) => TransferError::Io(msg),
        }
    }
}
