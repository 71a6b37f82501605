//! kvfabric-store: a node's cache.
//!
//! Owns block keys and layouts, the RAM and disk tiers, placement and
//! eviction, the directory shard and the gRPC cache service.
//! See docs/ARCHITECTURE.md, "Block", "Block key", "Tiers", "Directory".

mod error;
pub mod keys;

pub use error::StoreError;
pub use keys::{BlockKey, BlockOrder, DType, KeyChain, KvLayout, ModelFingerprint};
