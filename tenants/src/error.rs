//! The crate's one error type.

use std::path::PathBuf;

/// Why a tenants file could not be loaded, or a key could not be parsed.
#[derive(Debug, thiserror::Error)]
pub enum TenantsError {
    /// The file could not be read.
    #[error("reading tenants file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("parsing tenants file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// The file parsed but says something inconsistent.
    #[error("invalid tenants file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    /// A stored key hash is not `blake3:<64 hex digits>`.
    #[error("invalid key hash {found:?}: expected blake3:<64 hex digits>")]
    KeyHash { found: String },
}
