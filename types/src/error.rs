//! The vocabulary crate's one error type.
//!
//! The crates that use these types each have their own error and convert
//! this one into it (`From`), keeping the variant they reported before.

/// A malformed key or layout, or a shared region that could not be made or used.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum TypesError {
    /// A caller passed something unusable (a short key, a zero-sized layout).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A range that does not lie inside its region.
    #[error("range {offset}+{len} is outside the segment ({segment_len} bytes)")]
    OutOfBounds {
        offset: u64,
        len: u64,
        segment_len: u64,
    },
    /// An OS call failed (memfd, mmap).
    #[error("i/o error: {0}")]
    Io(String),
}

impl From<std::io::Error> for TypesError {
    fn from(e: std::io::Error) -> Self {
        TypesError::Io(e.to_string())
    }
}
