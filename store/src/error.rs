//! The store crate's one error type, and its mapping to gRPC status codes.

use crate::keys::BlockKey;

/// Everything that can go wrong in a node's store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Bad input from a client (maps to gRPC INVALID_ARGUMENT).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No room: everything that could make room is pinned or being read (RESOURCE_EXHAUSTED).
    #[error("resource exhausted: {0}")]
    ResourceExhausted(String),
    /// The reservation for `key` was reclaimed (timed out) or revoked before commit.
    #[error("reservation expired: {key:?} was reclaimed or revoked before commit")]
    ReservationExpired {
        /// The key the reservation was for.
        key: BlockKey,
    },
    /// `key` is not stored (NOT_FOUND).
    #[error("not found: block {key:?}")]
    NotFound {
        /// The key asked for.
        key: BlockKey,
    },
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
    /// A configuration that cannot work.
    #[error("bad configuration: {0}")]
    Config(String),
    /// A disk or OS call failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The disk index (RocksDB) failed.
    #[error("index error: {0}")]
    Index(#[from] rocksdb::Error),
    /// The RAM arena could not be set up.
    #[error("transfer region: {0}")]
    Region(#[from] kvfabric_transfer::TransferError),
    /// A server (gRPC or HTTP) failed.
    #[error("server: {0}")]
    Server(String),
    /// The node's tenants file could not be loaded.
    #[error("tenants: {0}")]
    Tenants(#[from] kvfabric_tenants::TenantsError),
}

impl From<StoreError> for tonic::Status {
    fn from(e: StoreError) -> Self {
        let msg = e.to_string();
        match e {
            StoreError::InvalidArgument(_) => tonic::Status::invalid_argument(msg),
            StoreError::ResourceExhausted(_) => tonic::Status::resource_exhausted(msg),
            StoreError::ReservationExpired { .. } => tonic::Status::aborted(msg),
            StoreError::NotFound { .. } => tonic::Status::not_found(msg),
            StoreError::Config(_) | StoreError::Tenants(_) => {
                tonic::Status::failed_precondition(msg)
            }
            StoreError::Io(_)
            | StoreError::Index(_)
            | StoreError::Region(_)
            | StoreError::PeerRpc { .. }
            | StoreError::Server(_) => tonic::Status::internal(msg),
        }
    }
}
