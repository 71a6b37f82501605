//! Paged KV: the block pool (fabric layout), block allocation with a local
//! prefix cache, and the owned handles through which the engine holds blocks.

pub mod blocks;
pub mod pool;
mod prefix_cache;

pub use blocks::{Block, BlockPool, BlockTable};
pub use pool::{BlockId, KvPool};
