//! The connector's one error type.

/// What can go wrong between the engine and the fabric.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    /// The store or cluster refused or failed an operation.
    #[error("store: {0}")]
    Store(#[from] kvfabric_store::StoreError),
    /// The engine's KV memory could not be registered or used.
    #[error("transfer: {0}")]
    Transfer(#[from] kvfabric_transfer::TransferError),
    /// Settings the connector cannot run with.
    #[error("connector config: {0}")]
    Config(String),
    /// Socket or file errors (binding the embedded node's listeners).
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}
