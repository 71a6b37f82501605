//! The connector's one error type.

/// What can go wrong between the engine and the fabric.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    /// A malformed layout, or KV memory that cannot be used.
    #[error("kv memory: {0}")]
    Types(#[from] kvfabric_types::TypesError),
    /// The store or cluster refused or failed an operation (feature `fabric`).
    #[cfg(feature = "fabric")]
    #[error("store: {0}")]
    Store(#[from] kvfabric_store::StoreError),
    /// The engine's KV memory could not be registered or used (feature `fabric`).
    #[cfg(feature = "fabric")]
    #[error("transfer: {0}")]
    Transfer(#[from] kvfabric_transfer::TransferError),
    /// Settings the connector cannot run with.
    #[error("connector config: {0}")]
    Config(String),
    /// Socket or file errors (binding the embedded node's listeners).
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}
