//! The connector's one error type.

/// What can go wrong between the engine and the fabric.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    /// A malformed layout, or KV memory that cannot be used.
    #[error("kv memory: {0}")]
    Types(#[from] kvfabric_types::TypesError),
    /// The local store refused or failed an operation (feature `fabric`).
    #[cfg(feature = "fabric")]
    #[error("store: {0}")]
    Store(#[from] kvfabric_store::StoreError),
    /// The fabric node or the cluster refused or failed an operation
    /// (feature `fabric`).
    #[cfg(feature = "fabric")]
    #[error("node: {0}")]
    Node(#[from] kvfabric_node::NodeError),
    /// The engine's KV memory could not be registered or used (feature `fabric`).
    #[cfg(feature = "fabric")]
    #[error("transfer: {0}")]
    Transfer(#[from] kvfabric_transfer::TransferError),
    /// The node at `node` (remote mode) refused the engine's calls: its
    /// tenants file wants an API key and the engine sent `sent` (`no API
    /// key`, or `an unknown API key`); `reason` is the node's.
    #[error(
        "the fabric node at {node} refused this engine's calls, which carry {sent} ({reason}): \
         set [connector] node_api_key (env KVFABRIC_NODE_API_KEY) to a key of a trusted tenant \
         in the node's tenants file; see docs/SECURITY.md"
    )]
    NodeApiKey {
        node: String,
        sent: &'static str,
        reason: String,
    },
    /// Settings the connector cannot run with.
    #[error("connector config: {0}")]
    Config(String),
    /// Socket or file errors (binding the embedded node's listeners).
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}
