//! Transfer engine configuration: what a node operator may tune.
//!
//! Deserialized from the node's layered config (figment); every field has a
//! default so an empty section is a working engine.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::security::NodeIdentity;

/// Which transport carries a peer's batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TransportChoice {
    /// shm when the peer is on this host; else rdma when both ends have a
    /// device (feature `rdma`) and the queue-pair exchange works; tcp otherwise.
    #[default]
    Auto,
    /// Always tcp, even to a peer on this host.
    Tcp,
    /// Always shm; batches to a peer on another host fail with `Unsupported`.
    Shm,
    /// Always rdma; batches fail with `Unsupported` when this build lacks the
    /// `rdma` feature, either end has no device, or the queue-pair exchange fails.
    Rdma,
}

/// Whether READ replies of KV blocks travel encoded with the block codec
/// (tcp only; shm and rdma always move raw bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum WireCompression {
    /// Per peer, when the measured link is slow enough that encoding,
    /// sending fewer bytes and decoding beats sending raw bytes (the
    /// default).
    #[default]
    Auto,
    /// Never.
    Off,
    /// Always (for ops that name their element width, to peers that support it).
    Always,
}

/// Configuration of a [`crate::TransferEngine`].
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TransferConfig {
    /// Address the transfer server listens on (host:port). Default
    /// `127.0.0.1:0` (an ephemeral loopback port; use the node's address in a cluster).
    pub listen: String,
    /// TCP connections opened per peer; slices of a batch are sprayed over
    /// them. Default 4.
    pub connections_per_peer: usize,
    /// Most idle links (tcp, shm, rdma) kept per peer between batches;
    /// concurrent batches open more, and what they return beyond this is
    /// closed. Default 32: eight concurrent batches of `connections_per_peer`
    /// (an engine's load keeps 3 layers in flight per request).
    pub idle_connections_per_peer: usize,
    /// An idle link unused for this long is closed when its pool is next
    /// used, so a burst's extra links do not stay open. Default 30000 ms.
    pub idle_timeout_ms: u64,
    /// Ops larger than this are cut into slices of this size, each carried
    /// and checked independently. Default 1 MiB (measured with `kvfabric
    /// bench transfer --slice-bytes`: on loopback tcp, 64 KiB slices reached
    /// ~0.8x iperf3 and 256 KiB ~1.0x, 1 MiB ~1.5x; shm ignores it).
    pub slice_bytes: usize,
    /// Slices in flight per connection (requests sent before their replies
    /// arrive). Default 4.
    pub pipeline_depth: usize,
    /// A peer that makes no progress for this long fails every unfinished op
    /// of the batch. Default 5000 ms.
    pub op_timeout_ms: u64,
    /// Transport override: `auto`, `tcp`, `shm` or `rdma`. Default `auto`.
    pub transport: TransportChoice,
    /// Lossless compression of KV blocks on the tcp wire: `auto`, `off` or
    /// `always`. Default `auto`. Only READs whose op names an element width
    /// (`TransferOp::with_element_width`) are ever compressed.
    pub wire_compression: WireCompression,
    /// Node name reported in segment metadata. Default: the listen address
    /// actually bound.
    pub node_name: Option<String>,
    /// This node's identity and security mode (loaded by the node from its
    /// `[cluster.security]` files; not a config key). None: mode `none`.
    #[serde(skip)]
    pub identity: Option<Arc<NodeIdentity>>,
}

impl Default for TransferConfig {
    fn default() -> Self {
        TransferConfig {
            listen: "127.0.0.1:0".into(),
            connections_per_peer: 4,
            idle_connections_per_peer: 32,
            idle_timeout_ms: 30_000,
            slice_bytes: 1 << 20,
            pipeline_depth: 4,
            op_timeout_ms: 5000,
            transport: TransportChoice::Auto,
            wire_compression: WireCompression::Auto,
            node_name: None,
            identity: None,
        }
    }
}

impl TransferConfig {
    /// The op timeout as a duration.
    pub fn op_timeout(&self) -> Duration {
        Duration::from_millis(self.op_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_section_is_default_and_fields_parse() {
        let c: TransferConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c.connections_per_peer, 4);
        assert_eq!(c.op_timeout(), Duration::from_secs(5));
        let c: TransferConfig =
            serde_json::from_str(r#"{"transport":"shm","slice_bytes":65536}"#).unwrap();
        assert_eq!(c.transport, TransportChoice::Shm);
        assert_eq!(c.slice_bytes, 65536);
        let c: TransferConfig = serde_json::from_str(r#"{"transport":"rdma"}"#).unwrap();
        assert_eq!(c.transport, TransportChoice::Rdma);
        assert_eq!(c.wire_compression, WireCompression::Auto);
        for (text, want) in [
            ("off", WireCompression::Off),
            ("always", WireCompression::Always),
            ("auto", WireCompression::Auto),
        ] {
            let json = format!(r#"{{"wire_compression":"{text}"}}"#);
            let c: TransferConfig = serde_json::from_str(&json).unwrap();
            assert_eq!(c.wire_compression, want);
        }
        assert!(serde_json::from_str::<TransferConfig>(r#"{"wire_compression":"gzip"}"#).is_err());
        assert!(serde_json::from_str::<TransferConfig>(r#"{"bogus":1}"#).is_err());
    }
}
