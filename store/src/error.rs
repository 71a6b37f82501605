//! The store crate's one error type.

/// Everything that can go wrong in a node's store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Bad input from a client (maps to gRPC INVALID_ARGUMENT).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}
