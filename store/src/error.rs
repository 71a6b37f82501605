//! The store crate's one error type, and its mapping to gRPC status codes.

use kvfabric_transfer::TransferError;
use kvfabric_types::TypesError;

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
    Region(#[from] TransferError),
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
}

impl From<TypesError> for StoreError {
    /// A bad key or layout is the client's (INVALID_ARGUMENT); a region that
    /// could not be made is the arena's, as when the transfer crate made it.
    fn from(e: TypesError) -> Self {
        match e {
            TypesError::InvalidArgument(msg) => StoreError::InvalidArgument(msg),
            other => StoreError::Region(other.into()),
        }
    }
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
            | StoreError::Server { .. }
            | StoreError::Connect { .. }
            | StoreError::RemoteRead { .. }
            | StoreError::RemoteReadTimeout { .. }
            | StoreError::Internal { .. } => tonic::Status::internal(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed server-side failures keep the message the `Server(String)`
    /// they replaced gave, and stay INTERNAL over gRPC.
    #[test]
    fn typed_server_failures_read_as_before_and_are_internal() {
        let e = StoreError::RemoteReadTimeout {
            holder: "node-b".into(),
            ms: 250,
        };
        assert_eq!(
            e.to_string(),
            "server: read from node-b: timed out after 250 ms"
        );
        assert_eq!(tonic::Status::from(e).code(), tonic::Code::Internal);
        let e = StoreError::Server {
            what: "http",
            source: "address in use".into(),
        };
        assert_eq!(e.to_string(), "server: http: address in use");
        let e = StoreError::Internal {
            what: "read returned no result",
        };
        assert_eq!(tonic::Status::from(e).code(), tonic::Code::Internal);
    }
}
