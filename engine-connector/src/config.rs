//! Connector configuration (`[connector]` in the kvfabric config file).
//!
//! Every field has a default; unknown fields are refused.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{ConfigProblem, ConnectorError};

/// How an engine uses the fabric.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectorConfig {
    /// embedded (a fabric node inside the engine process), remote (the node at `node_addr`) or off (local prefix cache only). Default: embedded.
    pub mode: String,
    /// remote mode: gRPC address of the `kvfabric node` to use. Default: 127.0.0.1:50051.
    pub node_addr: String,
    /// Save computed blocks (prompt and generated) into the fabric. Default: true.
    pub save: bool,
    /// Load prefixes other engines computed. Default: true.
    pub load: bool,
    /// Blocks waiting to be saved; beyond this, saves are dropped (counted), never waited for. Default: 64.
    pub max_pending_saves: usize,
    /// Blocks read in parallel by one load. Default: 8.
    pub load_concurrency: usize,
    /// Longest a scheduler-side lookup may take before it counts as a miss, in milliseconds. Default: 500.
    pub lookup_timeout_ms: u64,
    /// Load layer by layer: the forward pass starts once the blocks are leased and waits per layer, so computing overlaps the transfer (embedded mode; blocks saved with per-layer checksums). Default: true.
    pub layerwise: bool,
    /// Longest one forward pass waits for a layer-wise load's layers, in milliseconds; a later load is discarded for that step and finished whole (the scheduler waits on it no more). Default: 250.
    pub layer_wait_ms: u64,
    /// remote mode: API key sent to the node (`authorization: Bearer`), needed when the node has a tenants file; give a trusted tenant's key, so the owner of each saved block (the request's tenant) is honoured. Env: KVFABRIC_NODE_API_KEY. Default: none.
    pub node_api_key: Option<ApiKey>,
}

/// A secret from the config: serialized as it is, never printed
/// (`Debug` shows `<redacted>`).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// The key itself (to put on the wire).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Default for ConnectorConfig {
    fn default() -> Self {
        ConnectorConfig {
            mode: "embedded".into(),
            node_addr: "127.0.0.1:50051".into(),
            save: true,
            load: true,
            max_pending_saves: 64,
            load_concurrency: 8,
            lookup_timeout_ms: 500,
            layerwise: true,
            layer_wait_ms: 250,
            node_api_key: None,
        }
    }
}

impl ConnectorConfig {
    /// Refuse settings the connector cannot run with.
    pub fn validate(&self) -> Result<(), ConnectorError> {
        if !matches!(self.mode.as_str(), "embedded" | "remote" | "off") {
            return Err(ConnectorError::Config(ConfigProblem::Mode {
                mode: self.mode.clone(),
            }));
        }
        if let Some(k) = &self.node_api_key {
            let printable = k.0.bytes().all(|b| b.is_ascii_graphic());
            if k.0.is_empty() || !printable {
                return Err(ConnectorError::Config(ConfigProblem::NodeApiKey));
            }
        }
        for (key, value) in [
            ("max_pending_saves", self.max_pending_saves),
            ("load_concurrency", self.load_concurrency),
        ] {
            if value == 0 {
                return Err(ConnectorError::Config(ConfigProblem::Zero { key }));
            }
        }
        Ok(())
    }

    /// Whether the engine process runs its own fabric node.
    pub fn embedded(&self) -> bool {
        self.mode == "embedded"
    }

    /// The per-step layer wait as a duration.
    pub fn layer_wait(&self) -> Duration {
        Duration::from_millis(self.layer_wait_ms)
    }

    /// The lookup timeout as a duration.
    pub fn lookup_timeout(&self) -> Duration {
        Duration::from_millis(self.lookup_timeout_ms)
    }
}
