//! kvfabric-store: a node's cache.
//!
//! Owns the RAM and disk tiers, placement and eviction, the gRPC cache
//! service and the node's HTTP metrics/health. Block keys and layouts are
//! `kvfabric-types`', re-exported as [`keys`].
//! See docs/ARCHITECTURE.md, "Block", "Block key", "Tiers".
//!
//! Entry points: [`Store`] (the in-process data path: put/lease/get_into,
//! lookup, exists, pin, remove, stats) and [`NodeServer`] (the one way a node
//! is served: gRPC CacheService, directory and holder services when in a
//! cluster, `/metrics` + `/health`; `kvfabric node` runs [`NodeServer::open`]).
//! With the `cuda` feature, `vram::VramTier` adds GPU memory as the first
//! tier above a [`Store`].

mod block_info;
mod changes;
mod disk;
mod disk_codec;
#[cfg(test)]
mod disk_codec_tests;
mod disk_staging;
mod error;
mod extent;
mod huge_alloc;
pub mod keys;
mod lifecycle;
mod metrics;
mod node_config;
mod planner;
mod policy;
mod probe;
mod rec;
mod state;
mod store;
mod store_core;
mod store_stats;
#[cfg(test)]
mod store_tests;
mod tenant_shares;
#[cfg(test)]
mod tenant_shares_tests;
mod tenant_usage;
pub mod tier;
mod tiering;
mod upper;
mod uring;
#[cfg(feature = "cuda")]
pub mod vram;

pub use block_info::{BlockInfo, PutOutcome};
pub use changes::{BlockChange, ChangeFeed, KvEventRecord, KV_EVENT_BUFFER};
pub use error::{BadArgument, BadConfig, NoRoom, StoreError};
pub use keys::{BlockKey, BlockOrder, DType, KeyChain, KvLayout, ModelFingerprint};
pub use lifecycle::{ReadLease, Reservation};
pub use node_config::{
    DiskAdmission, DiskCompression, EvictionPolicy, NodeConfig, VramVerify, WritePolicy,
};
pub use planner::{CapacityReport, CurvePoint, TierCurve, SCALES as PLANNER_SCALES};
pub use policy::{AdaptiveMode, AdaptiveStats};
pub use store::{PutOptions, ReserveOutcome, Store};
pub use store_stats::{StoreStats, TierStats};
pub use tenant_shares::{Owner, TierUsage};
pub use tier::Tier;

/// The Prometheus registry type `Store::open` registers into.
pub use prometheus_client::registry::Registry;
