//! The transfer crate's one error type.

/// Everything that can go wrong moving bytes.
#[derive(Debug, thiserror::Error)]
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
    /// An OS call failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}
