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
    Fabric(#[from] kvfabric_node::NodeError),
    /// The engine's KV memory could not be registered or used (feature `fabric`).
    #[cfg(feature = "fabric")]
    #[error("transfer: {0}")]
    Transfer(#[from] kvfabric_transfer::TransferError),
    /// The node at `node` (remote mode) refused the engine's calls: its
    /// tenants file wants an API key and the engine sent `sent` (`no API
    /// key`, or `an unknown API key`); `reason` is the node's own message
    /// (its gRPC status's text, as the node sent it).
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
    /// Settings (or KV memory, or a runtime) the connector cannot run with.
    #[error("connector config: {0}")]
    Config(ConfigProblem),
    /// The node at `node` (remote mode) failed a `call` (`stats`, `put`)
    /// with `status`.
    #[cfg(feature = "fabric")]
    #[error("{call} at node {node}: {status}")]
    Node {
        node: String,
        call: &'static str,
        #[source]
        status: tonic::Status,
    },
    /// A blocking task of the connector (`task`: `store open`, `save`)
    /// panicked or was cancelled (shared: a failed save task fails each
    /// block of its batch).
    #[error("{task} task: {source}")]
    Task {
        task: &'static str,
        #[source]
        source: std::sync::Arc<tokio::task::JoinError>,
    },
    /// Socket or file errors (binding the embedded node's listeners).
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// What the connector cannot run with ([`ConnectorError::Config`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigProblem {
    /// `[connector] mode` is none of the three.
    #[error("mode {mode:?}: expected embedded, remote or off")]
    Mode { mode: String },
    /// `[connector] node_api_key` is empty or not printable ASCII.
    #[error("node_api_key (KVFABRIC_NODE_API_KEY) must be non-empty printable ASCII")]
    NodeApiKey,
    /// A limit (`key`: `max_pending_saves`, `load_concurrency`) that is 0.
    #[error("{key} must be > 0")]
    Zero { key: &'static str },
    /// KV memory of `bytes` bytes, too small for its `blocks` blocks.
    #[error("KV memory of {bytes} bytes is smaller than {blocks} blocks")]
    KvMemoryTooSmall { bytes: usize, blocks: usize },
    /// The connector was built outside a tokio runtime.
    #[error("the fabric connector needs a tokio runtime")]
    NoRuntime,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ApiKey, ConnectorConfig};

    /// Each refused setting is a typed problem naming the setting, and
    /// reads as "connector config: <what is wrong>".
    #[test]
    fn refused_settings_name_what_is_wrong() {
        let problem = |cfg: ConnectorConfig| match cfg.validate() {
            Err(ConnectorError::Config(p)) => p,
            other => panic!("expected a config error, got {other:?}"),
        };
        let mode = problem(ConnectorConfig {
            mode: "sideways".into(),
            ..ConnectorConfig::default()
        });
        assert_eq!(
            mode,
            ConfigProblem::Mode {
                mode: "sideways".into()
            }
        );
        assert_eq!(
            ConnectorError::Config(mode).to_string(),
            "connector config: mode \"sideways\": expected embedded, remote or off"
        );
        let zero = problem(ConnectorConfig {
            load_concurrency: 0,
            ..ConnectorConfig::default()
        });
        assert_eq!(
            zero,
            ConfigProblem::Zero {
                key: "load_concurrency"
            }
        );
        let key = problem(ConnectorConfig {
            node_api_key: Some(ApiKey::new("with space")),
            ..ConnectorConfig::default()
        });
        assert_eq!(key, ConfigProblem::NodeApiKey);
    }
}
