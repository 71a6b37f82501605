//! kvfabric-store: one node's tiered KV-block cache.
//!
//! The single-node cache and nothing else: tiers (RAM arena, disk through
//! io_uring with a RocksDB index, VRAM above RAM with the `cuda` feature),
//! placement and eviction, two-phase puts, read leases, pins, per-tenant
//! shares and the capacity planner. It knows nothing of RPC or membership:
//! `kvfabric-node` wraps a [`Store`] for the cluster and serves it (gRPC,
//! console, directory). Block keys and layouts are `kvfabric-types`',
//! re-exported as [`keys`]. See docs/ARCHITECTURE.md, "Block", "Tiers".
//!
//! ```
//! use kvfabric_store::{BlockKey, BlockOrder, DType, KvLayout, NodeConfig, PutOptions, Registry, Store};
//!
//! let cfg = NodeConfig { ram_capacity: bytesize::ByteSize::mib(8), ..NodeConfig::default() };
//! let store = Store::open(cfg, &mut Registry::default())?;
//! let layout = KvLayout {
//!     layers: 2, kv_heads: 1, head_dim: 64, dtype: DType::F16, block_tokens: 16,
//!     order: BlockOrder::LayerKvTokenHead,
//! };
//! let key = BlockKey([7; 32]);
//! let block = vec![1u8; layout.block_bytes()];
//! store.put(key, layout, &block, PutOptions::default())?;
//! let mut back = vec![0u8; block.len()];
//! assert!(store.get_into(&key, 0, &mut back)?.is_some());
//! assert_eq!(back, block);
//! # Ok::<(), kvfabric_store::StoreError>(())
//! ```
//!
//! Files:
//! - [`Store`] (`store.rs`): the handle: put, reserve, lease, get_into,
//!   lookup, exists, pin, remove; `store_core.rs`: the state every handle,
//!   lease and reservation shares; `store_stats.rs`: [`StoreStats`].
//! - `lifecycle.rs`: [`Reservation`] (reserve, write, commit) and
//!   [`ReadLease`]; `block_info.rs`: [`BlockInfo`], [`PutOutcome`].
//! - `state.rs`, `state/`: the locked block index; `rec.rs`: a record's
//!   name in the index and the eviction orders.
//! - `policy.rs`, `policy/`: eviction orders (adaptive, LIRS, LRU, S3-FIFO).
//! - `tiering.rs`: watermarks, demotion, promotion; `upper.rs`: the link to
//!   a tier above RAM; `vram/` (feature `cuda`): the VRAM tier.
//! - `disk.rs`, `disk_staging.rs`, `disk_codec.rs`, `uring.rs`, `extent.rs`:
//!   the disk tier; `huge_alloc.rs`: tables on huge pages.
//! - `tenant_shares.rs`, `tenant_usage.rs`: per-tenant shares and use.
//! - `changes.rs`: [`ChangeFeed`] (what the node announces, KV events).
//! - `planner/`: SHARDS miss-ratio curves ([`CapacityReport`]).
//! - [`tier`], `node_config.rs` ([`NodeConfig`]), `metrics.rs`, `probe.rs`,
//!   `error.rs` ([`StoreError`]).

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
