//! kvfabric-node: a cluster node around a [`kvfabric_store::Store`].
//!
//! The store is the single-node tiered cache and knows nothing of RPC or
//! membership; this crate wraps it for the cluster and serves it. Files:
//!
//! - [`cluster`]: membership, key ownership (rendezvous), directory shards,
//!   cross-node leases and reads, announcements, the cluster-wide
//!   CacheService, KV events, node identity on the gRPC side.
//! - [`cache_service`]: the gRPC `kvfabric.v1.CacheService` of one store.
//! - [`tenant_scope`]: every CacheService call scoped to its caller's tenant.
//! - [`console`]: the browser console and its JSON API on the HTTP port.
//! - [`operator_gate`]: with a tenants file, the HTTP port answers operators
//!   (trusted tenants' keys) only.
//! - [`node_server`]: [`NodeServer`], the one way a node is served (gRPC,
//!   HTTP `/metrics`, `/health`, the console), and the gRPC channel settings.
//! - [`wire`]: store types to protocol types and back, at the node's edge.
//! - [`error`]: [`NodeError`], and the gRPC status of every error.
//! - [`exposition`]: Prometheus text of a registry (`/metrics`, the console).
//!
//! See docs/ARCHITECTURE.md, "Directory", "Membership", "Store and node".

pub mod cache_service;
pub mod cluster;
pub mod console;
pub mod error;
pub mod exposition;
pub mod node_server;
pub mod operator_gate;
pub mod tenant_scope;
pub mod wire;

pub use cache_service::CacheServer;
pub use error::{store_status, BadNodeArgument, BadNodeConfig, NodeError};
pub use node_server::NodeServer;
