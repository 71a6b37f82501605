//! kvfabric-store: a node's cache.
//!
//! Owns the RAM and disk tiers, placement and eviction, the gRPC cache
//! service and the node's HTTP metrics/health. Block keys and layouts are
//! `kvfabric-types`', re-exported as [`keys`].
//! See docs/ARCHITECTURE.md, "Block", "Block key", "Tiers".
//!
//! Entry points: [`Store`] (the in-process data path: put/lease/get_into,
//! lookup, exists, pin, remove, stats), [`cluster::serve_node`] (what
//! `kvfabric node` runs: gRPC CacheService + directory + transfer server +
//! `/metrics` + `/health`) and [`serve_store`] (a standalone single node).

mod changes;
pub mod cluster;
mod config;
mod disk;
mod error;
mod extent;
pub mod keys;
mod lifecycle;
mod metrics;
mod placement;
mod policy;
pub mod ports;
mod server;
mod service;
mod staging;
mod state;
mod store;
#[cfg(test)]
mod store_tests;
mod uring;

pub use changes::{BlockChange, ChangeFeed};
pub use config::{DiskAdmission, EvictionPolicy, NodeConfig, WritePolicy};
pub use error::StoreError;
pub use keys::{BlockKey, BlockOrder, DType, KeyChain, KvLayout, ModelFingerprint};
pub use lifecycle::{BlockInfo, PutOutcome, ReadLease, Reservation};
pub use server::serve_store;
pub use service::CacheServer;
pub use store::{PutOptions, ReserveOutcome, Store};

/// The Prometheus registry type `Store::open` registers into.
pub use prometheus_client::registry::Registry;
