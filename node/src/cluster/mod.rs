//! Cluster: membership, key ownership, directory shards, cross-node reads.
//!
//! - [`membership`]: which nodes are alive (single, static peers, or etcd);
//!   `membership_metrics` exports what it sees (`kvfabric_cluster_*`).
//! - [`rendezvous`]: which live node owns a key's directory entry.
//! - [`directory`]: the entries a node owns (who holds which block, where).
//! - [`cluster_config`]: the `[cluster]` section.
//! - [`client`]: a CacheService client for tools and tests.
//! - [`node`]: a node's cluster side (announce, locate, remote reads);
//!   batched reads: [`ClusterNode::lease_many`] -> [`LeasedBlock`]s, then
//!   [`ClusterNode::read_leased`] of [`RangeRead`]s.
//! - `order_feed`: the shard's lookups and puts feed the RAM tier's
//!   `adaptive` order (its shadows judge the cluster's traffic).
//! - [`security`]: node identity on the gRPC side (mutual TLS, claimed ids).
//! - `integrity`: counters of blocks a holder could not vouch for (another
//!   checksum than the one the key's directory entry recorded).
//! - [`kv_events`]: the node's block stored / removed event stream (`KvEventService`).
//! - [`cluster_cache_service`], [`rpc`]: the cluster-wide CacheService and the
//!   internal Directory/Holder services ([`crate::NodeServer`] serves them).

mod announce;
pub mod client;
pub mod cluster_cache_service;
pub mod cluster_config;
pub mod directory;
mod holder;
mod integrity;
pub mod kv_events;
mod lease;
pub mod membership;
mod membership_metrics;
pub mod node;
mod node_state;
mod order_feed;
mod read;
pub mod read_staging;
mod refresh;
pub mod rendezvous;
pub mod rpc;
pub mod security;

pub use announce::RefreshStatus;
pub use cluster_cache_service::{ClusterCacheService, LOCAL_ONLY_HEADER};
pub use cluster_config::{parse_peer, ClusterConfig};
pub use directory::{DirectoryShard, HolderEntry, HolderTier};
pub use kv_events::KvEventRpc;
pub use lease::LeasedBlock;
pub use membership::{Membership, MembershipSource, MembershipView, NodeInfo};
pub use node::{FetchedBlock, RangeRead, ReadTarget};
pub use node_state::ClusterNode;
