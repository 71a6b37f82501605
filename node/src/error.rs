//! The node crate's one error type: the store's errors, and what only a
//! cluster node meets (peer RPCs, servers, channels, remote reads, its
//! configuration); [`NodeError::status`] maps every one to a gRPC status
//! code at the node's edge.

use kvfabric_store::StoreError;
use kvfabric_transfer::TransferError;

/// Everything that can go wrong in a cluster node.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The node's store refused or failed (its own typed error).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Bad input from a client that only the node checks (INVALID_ARGUMENT).
    #[error("invalid argument: {0}")]
    InvalidArgument(BadNodeArgument),
    /// A node or cluster setting that cannot work (FAILED_PRECONDITION).
    #[error("bad configuration: {0}")]
    Config(BadNodeConfig),
    /// A node-to-node RPC (`op`: locate, lease, ...) to `peer` failed.
    #[error("{op} at {peer}: {status}")]
    PeerRpc {
        /// The RPC that failed.
        op: &'static str,
        /// The node it was sent to (node id).
        peer: String,
        /// What the peer (or the channel) answered.
        status: Box<tonic::Status>,
    },
    /// A server this node runs failed: `what` (`grpc`, `http`, `grpc tls`,
    /// `reflection`, `store open task`).
    #[error("server: {what}: {source}")]
    Server {
        /// Which server, or which step of starting one.
        what: &'static str,
        /// What it said.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Connecting to the node at `addr` failed.
    #[error("server: connect {addr}: {source}")]
    Connect {
        /// The address dialled.
        addr: String,
        /// What the channel said.
        source: tonic::transport::Error,
    },
    /// A remote block read from `holder` failed in the transfer.
    #[error("server: read from {holder}: transfer: {source}")]
    RemoteRead {
        /// The node the blocks were read from (node id).
        holder: String,
        /// What the transfer said.
        source: TransferError,
    },
    /// A remote block read from `holder` ran past its time limit.
    #[error("server: read from {holder}: timed out after {ms} ms")]
    RemoteReadTimeout {
        /// The node the blocks were read from (node id).
        holder: String,
        /// The limit (`remote_read_timeout_ms`).
        ms: u64,
    },
    /// The read path broke one of its own invariants (`what` says which):
    /// a bug, not a peer's or a client's fault.
    #[error("server: {what}")]
    Internal {
        /// The invariant that did not hold.
        what: &'static str,
    },
    /// The node's tenants file could not be loaded.
    #[error("tenants: {0}")]
    Tenants(#[from] kvfabric_tenants::TenantsError),
    /// A socket or OS call of the node's servers failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The transfer engine or a registered region could not be set up.
    #[error("transfer: {0}")]
    Transfer(#[from] TransferError),
}

impl From<kvfabric_types::TypesError> for NodeError {
    /// As the store takes it: a bad key or layout is the client's, a
    /// region that could not be made the node's.
    fn from(e: kvfabric_types::TypesError) -> Self {
        NodeError::Store(e.into())
    }
}

/// What was wrong with an address a client gave ([`NodeError::InvalidArgument`]).
#[derive(Debug, thiserror::Error)]
pub enum BadNodeArgument {
    /// A node address (`addr`) that is not a URI.
    #[error("address {addr:?}: {source}")]
    Address {
        addr: String,
        source: tonic::transport::Error,
    },
    /// etcd membership with no endpoint.
    #[error("etcd membership needs at least one endpoint")]
    NoEtcdEndpoint,
}

/// A node or cluster setting that cannot work ([`NodeError::Config`]).
#[derive(Debug, thiserror::Error)]
pub enum BadNodeConfig {
    /// A VRAM tier asked of `kvfabric node`, which has no GPU-side writer.
    #[error("vram_capacity: `kvfabric node` serves no VRAM tier; a process with GPU work opens it in-process (kvfabric_store::vram::VramTier::open, docs/CONFIG.md)")]
    VramInNode,
    /// Both etcd endpoints and static peers.
    #[error("give either etcd endpoints or static peers, not both")]
    EtcdAndPeers,
    /// A `peers` entry that does not parse.
    #[error("peer {spec:?} is not node_id=grpc_host:port=transfer_host:port")]
    Peer { spec: String },
    /// A `transfer_transport` that is none of the four.
    #[error("transfer_transport {got:?} is not auto, tcp, shm or rdma")]
    Transport { got: String },
    /// The certificate's node id (`cert`) is not the configured `node_id`.
    #[error("the certificate names {cert} but node_id is {node_id:?}")]
    CertificateNode { cert: String, node_id: String },
    /// The `[cluster.security]` settings or files (the transfer crate's
    /// error, typed there: which setting or file, and why).
    #[error("{0}")]
    Security(TransferError),
    /// TLS for a channel (`what`: `tls`, `peer channel tls`) could not be set up.
    #[error("{what}: {source}")]
    Tls {
        what: &'static str,
        source: tonic::transport::Error,
    },
    /// A peer's advertised address (`addr`) is not a URI.
    #[error("peer address {addr:?}: {source}")]
    PeerAddress {
        addr: String,
        source: tonic::transport::Error,
    },
    /// The node at `addr` speaks TLS and this client has no certificate.
    #[error(
        "the node at {addr} requires mutual TLS and this client has no certificate: give it one \
         of the cluster CA with --tls-cert, --tls-key and --tls-ca (env KVFABRIC_TLS_CERT, \
         KVFABRIC_TLS_KEY, KVFABRIC_TLS_CA; or cert, key and ca in [cluster.security] of the \
         --config file); see docs/SECURITY.md"
    )]
    TlsRequired { addr: String },
    /// This client has a certificate and the node at `addr` speaks plaintext.
    #[error(
        "the node at {addr} does not speak TLS (its [cluster.security] mode is none) but this \
         client was given a certificate: remove --tls-cert, --tls-key and --tls-ca (and \
         KVFABRIC_TLS_*, [cluster.security] of the --config file), or secure the node; see \
         docs/SECURITY.md"
    )]
    TlsNotSpoken { addr: String },
}

impl NodeError {
    /// The caller's mistake (INVALID_ARGUMENT), whether the store or the
    /// node found it: never a peer's fault.
    pub fn is_invalid_argument(&self) -> bool {
        matches!(
            self,
            NodeError::InvalidArgument(_) | NodeError::Store(StoreError::InvalidArgument(_))
        )
    }

    /// The gRPC status a client is answered with: the client's mistakes as
    /// INVALID_ARGUMENT, full tiers as RESOURCE_EXHAUSTED, settings as
    /// FAILED_PRECONDITION, the rest as INTERNAL; the message is the error's.
    pub fn status(&self) -> tonic::Status {
        use tonic::Status;
        let msg = self.to_string();
        match self {
            NodeError::Store(e) => match e {
                StoreError::InvalidArgument(_) => Status::invalid_argument(msg),
                StoreError::ResourceExhausted(_) => Status::resource_exhausted(msg),
                StoreError::ReservationExpired { .. } => Status::aborted(msg),
                StoreError::NotFound { .. } => Status::not_found(msg),
                StoreError::Config(_) => Status::failed_precondition(msg),
                StoreError::Io(_) | StoreError::Index(_) | StoreError::Region(_) => {
                    Status::internal(msg)
                }
            },
            NodeError::InvalidArgument(_) => Status::invalid_argument(msg),
            NodeError::Config(_) | NodeError::Tenants(_) => Status::failed_precondition(msg),
            NodeError::PeerRpc { .. }
            | NodeError::Server { .. }
            | NodeError::Connect { .. }
            | NodeError::RemoteRead { .. }
            | NodeError::RemoteReadTimeout { .. }
            | NodeError::Internal { .. }
            | NodeError::Io(_)
            | NodeError::Transfer(_) => Status::internal(msg),
        }
    }
}

impl From<NodeError> for tonic::Status {
    fn from(e: NodeError) -> Self {
        e.status()
    }
}

/// A store error as the gRPC status its client is answered with.
pub fn store_status(e: StoreError) -> tonic::Status {
    NodeError::Store(e).status()
}

#[cfg(test)]
mod tests {
    use kvfabric_store::{BadArgument, BadConfig, NoRoom};
    use tonic::Code;

    use super::*;

    /// The server-side failures read as their fields say and are INTERNAL.
    #[test]
    fn server_failures_read_as_before_and_are_internal() {
        let e = NodeError::RemoteReadTimeout {
            holder: "node-b".into(),
            ms: 250,
        };
        assert_eq!(
            e.to_string(),
            "server: read from node-b: timed out after 250 ms"
        );
        assert_eq!(e.status().code(), Code::Internal);
        let e = NodeError::Server {
            what: "http",
            source: "address in use".into(),
        };
        assert_eq!(e.to_string(), "server: http: address in use");
        let e = NodeError::Internal {
            what: "read returned no result",
        };
        assert_eq!(e.status().code(), Code::Internal);
    }

    /// The store's errors keep their messages and map to their codes.
    #[test]
    fn store_errors_keep_messages_and_codes() {
        let e = StoreError::InvalidArgument(BadArgument::BlockSize { len: 0, max: 4096 });
        let status = store_status(e);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "invalid argument: block size 0 is outside 1..=4096 (max_block_size)"
        );
        let e = StoreError::ResourceExhausted(NoRoom::RamPinned);
        assert_eq!(store_status(e).code(), Code::ResourceExhausted);
        let e = StoreError::Config(BadConfig::Zero { key: "x" });
        assert_eq!(store_status(e).code(), Code::FailedPrecondition);
        let e = StoreError::NotFound {
            key: kvfabric_store::BlockKey([0; 32]),
        };
        assert_eq!(store_status(e).code(), Code::NotFound);
        let e = StoreError::from(kvfabric_types::TypesError::InvalidArgument(
            "unknown layout dtype 9".into(),
        ));
        assert_eq!(store_status(e).code(), Code::InvalidArgument);
    }

    /// A validation failure of the cluster section names its key.
    #[test]
    fn cluster_validation_names_the_key() {
        let cluster = crate::cluster::ClusterConfig {
            rpc_timeout_ms: 0,
            ..crate::cluster::ClusterConfig::default()
        };
        assert!(matches!(
            cluster.validate(),
            Err(NodeError::Store(StoreError::Config(BadConfig::Zero {
                key: "rpc_timeout_ms"
            })))
        ));
    }

    /// A refused `[cluster.security]` holds the transfer crate's typed error
    /// (which setting), and reads as the message it always gave.
    #[test]
    fn security_config_error_is_typed() {
        let cluster = crate::cluster::ClusterConfig {
            security: kvfabric_transfer::security::SecurityConfig {
                cert: Some("node.pem".into()),
                ..Default::default()
            },
            ..crate::cluster::ClusterConfig::default()
        };
        let e = cluster.validate().unwrap_err();
        assert!(
            matches!(
                &e,
                NodeError::Config(BadNodeConfig::Security(TransferError::InvalidArgument(
                    kvfabric_transfer::BadInput::SecurityFilesPartial
                )))
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "bad configuration: invalid argument: security: give cert, key and ca together"
        );
    }
}
