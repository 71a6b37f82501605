//! kvfabric-store: a node's cache.
//!
//! Owns block keys and layouts, the RAM and disk tiers, placement and
//! eviction, the directory shard and the gRPC cache service.
//! See docs/ARCHITECTURE.md, "Block", "Block key", "Tiers", "Directory".
