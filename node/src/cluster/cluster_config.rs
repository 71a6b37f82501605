//! `ClusterConfig`: how a node joins a cluster (`[cluster]` section).
//!
//! Membership is etcd when `etcd` lists endpoints, a static peer list when
//! `peers` is set, and a single embedded node otherwise. The transfer engine
//! listens on `transfer_listen`; what peers are told (`advertise_*`) defaults
//! to the addresses actually bound. Unknown keys are refused, like `[node]`.

use std::time::Duration;

use bytesize::ByteSize;
use kvfabric_transfer::security::{NodeIdentity, SecurityConfig};
use kvfabric_transfer::{TransferConfig, WireCompression};
use serde::{Deserialize, Serialize};

use crate::cluster::membership::{MembershipSource, NodeInfo};
use crate::{BadNodeConfig, NodeError};
use kvfabric_store::{BadConfig, StoreError};

/// Configuration of a node's cluster side (`[cluster]` section).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd endpoints (`http://host:port`); non-empty = etcd membership. Default: none.
    pub etcd: Vec<String>,
    /// Key prefix of this cluster in etcd. Default: "/kvfabric".
    pub etcd_prefix: String,
    /// etcd lease TTL in milliseconds (rounded up to whole seconds). Default: 5000.
    pub lease_ttl_ms: u64,
    /// Static peers, each `node_id=grpc_host:port=transfer_host:port`. Default: none.
    pub peers: Vec<String>,
    /// Static peers: liveness probe period in milliseconds. Default: 500.
    pub probe_interval_ms: u64,
    /// Static peers: a peer silent this long leaves the view. Default: 2000.
    pub failure_timeout_ms: u64,
    /// Transfer engine listen address. Default: 127.0.0.1:0 (an ephemeral port).
    pub transfer_listen: String,
    /// Transfer transport: auto, tcp, shm or rdma. Default: auto.
    pub transfer_transport: String,
    /// Transfer connections opened per peer (slices of a batch are sprayed
    /// over them). Default: 4.
    pub transfer_connections_per_peer: usize,
    /// Most idle transfer links kept per peer between batches (concurrent
    /// batches open more; what they return beyond this is closed). Default: 32.
    pub transfer_idle_connections_per_peer: usize,
    /// An idle transfer link unused this long is closed. Default: 30000.
    pub transfer_idle_timeout_ms: u64,
    /// Transfer ops larger than this are cut into slices of this size, each
    /// carried and checked independently (shm ignores it). Default: 1MiB.
    pub transfer_slice_bytes: ByteSize,
    /// Transfer slices in flight per connection. Default: 4.
    pub transfer_pipeline_depth: usize,
    /// Lossless compression of KV blocks on the tcp wire: auto (per peer,
    /// where the measured link is slower than the codec), off or always.
    /// Never on shm or rdma. Default: auto (docs/CONFIG.md).
    pub transfer_wire_compression: WireCompression,
    /// gRPC address peers use for this node. Default: the bound gRPC address.
    pub advertise_grpc: Option<String>,
    /// Transfer address peers use for this node. Default: the bound transfer address.
    pub advertise_transfer: Option<String>,
    /// Timeout of one node-to-node RPC (Locate, Announce, Stats, ...). Default: 1000.
    pub rpc_timeout_ms: u64,
    /// Timeout of one remote block read (lease + transfer). Default: 3000.
    pub remote_read_timeout_ms: u64,
    /// Period of the directory sync's periodic part (retry failed
    /// announcements, check owners' directory epochs) and the unit the full
    /// refresh is paced in. Changes themselves are announced as they happen. Default: 1000.
    pub reconcile_interval_ms: u64,
    /// Blocks per chunk of a full refresh (the store's lock is held to read one chunk). Default: 4096.
    pub refresh_chunk_blocks: usize,
    /// Chunks of a full refresh per `reconcile_interval_ms`. Default: 16.
    pub refresh_chunks_per_period: usize,
    /// Size of the staging region remote reads land in. Default: 64MiB.
    pub staging_capacity: ByteSize,
    /// Node identity and the data plane (`[cluster.security]`: mode, cert,
    /// key, ca; see docs/CONFIG.md and docs/SECURITY.md). Default: mode none.
    pub security: SecurityConfig,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            etcd: Vec::new(),
            etcd_prefix: "/kvfabric".into(),
            lease_ttl_ms: 5000,
            peers: Vec::new(),
            probe_interval_ms: 500,
            failure_timeout_ms: 2000,
            transfer_listen: "127.0.0.1:0".into(),
            transfer_transport: "auto".into(),
            transfer_connections_per_peer: 4,
            transfer_idle_connections_per_peer: 32,
            transfer_idle_timeout_ms: 30_000,
            transfer_slice_bytes: ByteSize::mib(1),
            transfer_pipeline_depth: 4,
            transfer_wire_compression: WireCompression::Auto,
            advertise_grpc: None,
            advertise_transfer: None,
            rpc_timeout_ms: 1000,
            remote_read_timeout_ms: 3000,
            reconcile_interval_ms: 1000,
            refresh_chunk_blocks: 4096,
            refresh_chunks_per_period: 16,
            staging_capacity: ByteSize::mib(64),
            security: SecurityConfig::default(),
        }
    }
}

impl ClusterConfig {
    /// Refuse settings that cannot work.
    pub fn validate(&self) -> Result<(), NodeError> {
        let bad = |b: BadConfig| Err(NodeError::Store(StoreError::Config(b)));
        if !self.etcd.is_empty() && !self.peers.is_empty() {
            return Err(NodeError::Config(BadNodeConfig::EtcdAndPeers));
        }
        for p in &self.peers {
            parse_peer(p)?;
        }
        for (name, v) in [
            ("lease_ttl_ms", self.lease_ttl_ms),
            ("probe_interval_ms", self.probe_interval_ms),
            ("failure_timeout_ms", self.failure_timeout_ms),
            ("rpc_timeout_ms", self.rpc_timeout_ms),
            ("remote_read_timeout_ms", self.remote_read_timeout_ms),
            ("reconcile_interval_ms", self.reconcile_interval_ms),
            ("refresh_chunk_blocks", self.refresh_chunk_blocks as u64),
            (
                "transfer_connections_per_peer",
                self.transfer_connections_per_peer as u64,
            ),
            (
                "transfer_idle_connections_per_peer",
                self.transfer_idle_connections_per_peer as u64,
            ),
            ("transfer_slice_bytes", self.transfer_slice_bytes.as_u64()),
            (
                "transfer_pipeline_depth",
                self.transfer_pipeline_depth as u64,
            ),
            (
                "refresh_chunks_per_period",
                self.refresh_chunks_per_period as u64,
            ),
        ] {
            if v == 0 {
                return bad(BadConfig::Zero { key: name });
            }
        }
        self.transport()?;
        self.security
            .validate()
            .map_err(|e| NodeError::Config(BadNodeConfig::Security(e)))?;
        if self.staging_capacity.as_u64() < 4096 {
            return bad(BadConfig::BelowOnePage {
                key: "staging_capacity",
            });
        }
        Ok(())
    }

    /// The transfer transport to use.
    pub fn transport(&self) -> Result<kvfabric_transfer::TransportChoice, NodeError> {
        use kvfabric_transfer::TransportChoice;
        match self.transfer_transport.as_str() {
            "auto" => Ok(TransportChoice::Auto),
            "tcp" => Ok(TransportChoice::Tcp),
            "shm" => Ok(TransportChoice::Shm),
            "rdma" => Ok(TransportChoice::Rdma),
            other => Err(NodeError::Config(BadNodeConfig::Transport {
                got: other.to_string(),
            })),
        }
    }

    /// The transfer engine settings of node `node_id`: listen address,
    /// transport, per-peer connections, slice size and pipeline depth from
    /// this section; the op timeout is the remote read timeout; `identity`
    /// as loaded from `security` (see [`crate::cluster::security::load`]).
    pub fn transfer_config(
        &self,
        node_id: &str,
        identity: Option<std::sync::Arc<NodeIdentity>>,
    ) -> Result<TransferConfig, NodeError> {
        Ok(TransferConfig {
            listen: self.transfer_listen.clone(),
            transport: self.transport()?,
            node_name: Some(node_id.to_string()),
            op_timeout_ms: self.remote_read_timeout_ms,
            connections_per_peer: self.transfer_connections_per_peer,
            idle_connections_per_peer: self.transfer_idle_connections_per_peer,
            idle_timeout_ms: self.transfer_idle_timeout_ms,
            slice_bytes: self.transfer_slice_bytes.as_u64() as usize,
            pipeline_depth: self.transfer_pipeline_depth,
            wire_compression: self.transfer_wire_compression,
            identity,
        })
    }

    /// The membership source these settings describe.
    pub fn membership_source(&self) -> Result<MembershipSource, NodeError> {
        if !self.etcd.is_empty() {
            return Ok(MembershipSource::Etcd {
                endpoints: self.etcd.clone(),
                prefix: self.etcd_prefix.clone(),
                ttl: Duration::from_millis(self.lease_ttl_ms),
            });
        }
        if !self.peers.is_empty() {
            let peers = self
                .peers
                .iter()
                .map(|p| parse_peer(p))
                .collect::<Result<_, _>>()?;
            return Ok(MembershipSource::Static {
                peers,
                probe_interval: Duration::from_millis(self.probe_interval_ms),
                failure_timeout: Duration::from_millis(self.failure_timeout_ms),
            });
        }
        Ok(MembershipSource::Single)
    }

    /// RPC timeout as a duration.
    pub fn rpc_timeout(&self) -> Duration {
        Duration::from_millis(self.rpc_timeout_ms)
    }

    /// Remote read timeout as a duration.
    pub fn remote_read_timeout(&self) -> Duration {
        Duration::from_millis(self.remote_read_timeout_ms)
    }
}

/// Parse one static peer, `node_id=grpc_host:port=transfer_host:port`.
pub fn parse_peer(s: &str) -> Result<NodeInfo, NodeError> {
    let parts: Vec<&str> = s.split('=').collect();
    match parts.as_slice() {
        [id, grpc, transfer] if !id.is_empty() && !grpc.is_empty() && !transfer.is_empty() => {
            Ok(NodeInfo {
                node_id: (*id).to_string(),
                grpc_addr: (*grpc).to_string(),
                transfer_addr: (*transfer).to_string(),
            })
        }
        _ => Err(NodeError::Config(BadNodeConfig::Peer {
            spec: s.to_string(),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_and_peer_syntax() {
        let c = ClusterConfig::default();
        c.validate().unwrap();
        assert!(matches!(
            c.membership_source().unwrap(),
            MembershipSource::Single
        ));
        let c = ClusterConfig {
            peers: vec!["a=127.0.0.1:1=127.0.0.1:2".into()],
            ..Default::default()
        };
        match c.membership_source().unwrap() {
            MembershipSource::Static { peers, .. } => {
                assert_eq!(peers[0].node_id, "a");
                assert_eq!(peers[0].transfer_addr, "127.0.0.1:2");
            }
            other => panic!("{other:?}"),
        }
        let bad = ClusterConfig {
            peers: vec!["a=127.0.0.1:1".into()],
            ..Default::default()
        };
        assert!(bad.validate().is_err());
        let both = ClusterConfig {
            etcd: vec!["http://x:1".into()],
            peers: vec!["a=b=c".into()],
            ..Default::default()
        };
        assert!(both.validate().is_err());
        let tr = ClusterConfig {
            transfer_transport: "udp".into(),
            ..Default::default()
        };
        assert!(tr.validate().is_err());
        assert!(serde_json::from_str::<ClusterConfig>(r#"{"etcdd":[]}"#).is_err());
    }

    #[test]
    fn transfer_settings_default_to_the_engine_defaults_and_are_settable() {
        let engine = TransferConfig::default();
        let t = ClusterConfig::default()
            .transfer_config("n1", None)
            .unwrap();
        assert_eq!(t.connections_per_peer, engine.connections_per_peer);
        assert_eq!(t.slice_bytes, engine.slice_bytes);
        assert_eq!(t.pipeline_depth, engine.pipeline_depth);
        assert_eq!(
            t.idle_connections_per_peer,
            engine.idle_connections_per_peer
        );
        assert_eq!(t.idle_timeout_ms, engine.idle_timeout_ms);
        assert_eq!(t.wire_compression, engine.wire_compression);
        assert_eq!(t.node_name.as_deref(), Some("n1"));
        let c: ClusterConfig = serde_json::from_str(
            r#"{"transfer_connections_per_peer":8,"transfer_slice_bytes":"256KiB","transfer_pipeline_depth":2}"#,
        )
        .unwrap();
        let t = c.transfer_config("n1", None).unwrap();
        assert_eq!(
            (t.connections_per_peer, t.slice_bytes, t.pipeline_depth),
            (8, 256 << 10, 2)
        );
        let c: ClusterConfig =
            serde_json::from_str(r#"{"transfer_wire_compression":"off"}"#).unwrap();
        let t = c.transfer_config("n1", None).unwrap();
        assert_eq!(t.wire_compression, WireCompression::Off);
        assert!(
            serde_json::from_str::<ClusterConfig>(r#"{"transfer_wire_compression":"zstd"}"#)
                .is_err()
        );
        for zero in [
            r#"{"transfer_connections_per_peer":0}"#,
            r#"{"transfer_slice_bytes":"0B"}"#,
            r#"{"transfer_pipeline_depth":0}"#,
            r#"{"transfer_idle_connections_per_peer":0}"#,
        ] {
            let c: ClusterConfig = serde_json::from_str(zero).unwrap();
            assert!(c.validate().is_err(), "{zero}");
        }
    }
}
