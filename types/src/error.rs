//! The vocabulary crate's one error type.
//!
//! The crates that use these types each have their own error and convert
//! this one into it (`From`), keeping the variant they reported before.

use std::sync::Arc;

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
    /// An OS call on a region failed: `op` names the call (`memfd_create`,
    /// `ftruncate`, `fstat`, `mmap`, `madvise`), `source` is its error.
    #[error("i/o error: {op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: IoError,
    },
}

impl TypesError {
    /// [`TypesError::Io`] of `op` from the error `e`.
    pub fn io(op: &'static str, e: std::io::Error) -> Self {
        TypesError::Io {
            op,
            source: e.into(),
        }
    }
}

/// A [`std::io::Error`] that can be cloned and compared, so that errors that
/// are `Clone + Eq` (this crate's, the transfer crate's: one connection's
/// failure is every op's of its batch) can hold it as their source.
///
/// It reads as the error it holds and hands on that error's own source. Two
/// are equal when they have the same kind and read alike: the same failure,
/// as far as a caller can tell.
#[derive(Debug, Clone)]
pub struct IoError(Arc<std::io::Error>);

impl IoError {
    /// The error's kind.
    pub fn kind(&self) -> std::io::ErrorKind {
        self.0.kind()
    }

    /// The OS error code, when the error came from the OS.
    pub fn raw_os_error(&self) -> Option<i32> {
        self.0.raw_os_error()
    }

    /// The error itself.
    pub fn get_ref(&self) -> &std::io::Error {
        &self.0
    }
}

impl From<std::io::Error> for IoError {
    fn from(e: std::io::Error) -> Self {
        IoError(Arc::new(e))
    }
}

impl std::fmt::Display for IoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for IoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for IoError {
    fn eq(&self, other: &Self) -> bool {
        self.kind() == other.kind() && self.0.to_string() == other.0.to_string()
    }
}

impl Eq for IoError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed OS call names the call, keeps the OS error as its source,
    /// and reads as "i/o error: <call>: <OS message>".
    #[test]
    fn io_errors_name_the_call_and_keep_the_os_error() {
        let os = std::io::Error::from_raw_os_error(libc::ENOMEM);
        let msg = os.to_string();
        let e = TypesError::io("mmap", os);
        assert_eq!(e.to_string(), format!("i/o error: mmap: {msg}"));
        let source = std::error::Error::source(&e).expect("a source");
        assert_eq!(source.to_string(), msg);
        match &e {
            TypesError::Io { op, source } => {
                assert_eq!(*op, "mmap");
                assert_eq!(source.raw_os_error(), Some(libc::ENOMEM));
                assert_eq!(source.kind(), std::io::ErrorKind::OutOfMemory);
            }
            other => panic!("expected Io, got {other:?}"),
        }
        assert_eq!(e.clone(), e);
        assert_ne!(
            e,
            TypesError::io("mmap", std::io::Error::from_raw_os_error(libc::EINVAL))
        );
    }
}
