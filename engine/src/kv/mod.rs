//! Paged KV: the block pool (fabric layout) and block allocation with a local prefix cache.

pub mod pool;
pub mod prefix_cache;

pub use pool::{BlockId, KvPool};
pub use prefix_cache::BlockManager;
