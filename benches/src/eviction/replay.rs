//! Replaying a trace on a real RAM tier: the store each policy runs on, and
//! the policies compared. Kept apart from the bench's driver (`mod.rs`) so
//! the planner check and the trace loaders can replay without importing it.

use anyhow::Context;
use kvfabric_store::{
    BlockOrder, DType, EvictionPolicy, KvLayout, NodeConfig, PutOptions, Registry, Store,
};

use super::min::Hits;
use super::traces::Trace;

/// The policies compared, by their config names.
pub const POLICIES: [(&str, EvictionPolicy); 5] = [
    ("adaptive", EvictionPolicy::Adaptive),
    ("lirs", EvictionPolicy::Lirs),
    ("lru", EvictionPolicy::Lru),
    ("s3fifo", EvictionPolicy::S3fifo),
    ("door", EvictionPolicy::Door),
];

/// Replay `trace` on a RAM tier of `capacity_blocks` blocks (None: never
/// evicts), evicting between `base`'s watermarks (1.0 / 1.0 in the bench's
/// default: one block when full, as MIN's tier).
pub fn replay(
    trace: &Trace,
    layout: KvLayout,
    base: &NodeConfig,
    policy: EvictionPolicy,
    capacity_blocks: Option<usize>,
) -> anyhow::Result<Hits> {
    Ok(replay_store(trace, layout, base, policy, capacity_blocks)?.0)
}

/// [`replay`], and the store it ran on (its stats, its capacity planner).
pub fn replay_store(
    trace: &Trace,
    layout: KvLayout,
    base: &NodeConfig,
    policy: EvictionPolicy,
    capacity_blocks: Option<usize>,
) -> anyhow::Result<(Hits, Store)> {
    let bt = trace.block_tokens;
    let block = vec![0u8; layout.block_bytes()];
    // Room for every block the replay could put, when it must never evict.
    let every_block: usize = trace.requests.iter().map(|r| r.keys.len()).sum();
    let blocks = capacity_blocks.unwrap_or(every_block.max(1));
    // The arena gives each block a 4 KiB-aligned slot.
    let slot = layout.block_bytes().div_ceil(4096) * 4096;
    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::b((blocks * slot) as u64),
        eviction: policy,
        ..base.clone()
    };
    cfg.validate()?;
    let store = Store::open(cfg, &mut Registry::default())?;
    let mut hits = Hits::default();
    for r in &trace.requests {
        let found = store.lookup(&r.keys[..r.usable]).len();
        for k in &r.keys[..found] {
            // The connector reads every hit block.
            drop(store.lease(k)?.context("looked-up block vanished")?);
        }
        hits.add(r, found, bt);
        for k in &r.keys[found..] {
            store.put(*k, layout, &block, PutOptions::default())?;
        }
    }
    Ok((hits, store))
}

/// The default node config with both watermarks at 1.0: the tier evicts
/// one block when full, so it holds as many blocks as MIN's.
#[cfg(test)]
pub(super) fn one_at_a_time() -> NodeConfig {
    NodeConfig {
        high_watermark: 1.0,
        low_watermark: 1.0,
        ..Default::default()
    }
}

/// A layout of small blocks (a few KiB): the tier's bookkeeping is what is
/// measured, not copies.
pub(super) fn small_layout(block_tokens: usize) -> KvLayout {
    KvLayout {
        layers: 1,
        kv_heads: 1,
        head_dim: 16,
        dtype: DType::F32,
        block_tokens: block_tokens as u32,
        order: BlockOrder::LayerKvTokenHead,
    }
}
