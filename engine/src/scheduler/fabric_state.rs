//! What the scheduler keeps per block and per load while it works with the
//! fabric: each registered block's [`FabricState`], the pins of blocks
//! queued for saving ([`SavePins`]), a load's destination blocks
//! ([`LoadBlocks`]) and a layer-wise load still streaming in
//! ([`Streaming`]). The scheduler's steps with the fabric are in `fabric.rs`.

use std::collections::HashMap;
use std::time::Duration;

use kvfabric_connector::PendingLoad;
use kvfabric_types::BlockKey;

use crate::kv::{Block, BlockId, BlockTable};

/// Block indices fit in the low bits of a save's tag, the sequence id above.
pub(super) const TAG_BLOCK_BITS: u32 = 24;

/// Where one registered block of a sequence stands with the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FabricState {
    /// Not known to be in the fabric (local prefix-cache hit, or save dropped).
    Unknown,
    /// Queued for saving (the block is pinned).
    Saving,
    /// In the fabric: loaded from it, stored, or found there.
    In,
    /// The save failed.
    Failed,
}

/// Blocks queued with the connector for saving, each pinned (kept
/// unchanged, never reused) until the connector reports its save ended.
#[derive(Debug, Default)]
pub(super) struct SavePins {
    /// By (tag, block); a block can be queued twice under one tag (its
    /// sequence was preempted and completed it again).
    pub(super) pins: HashMap<(u64, BlockId), Vec<Block>>,
}

impl SavePins {
    pub(super) fn hold(&mut self, tag: u64, pin: Block) {
        self.pins.entry((tag, pin.id())).or_default().push(pin);
    }

    /// The save of `block` under `tag` ended: drop its pin.
    pub(super) fn done(&mut self, tag: u64, block: BlockId) {
        if let Some(v) = self.pins.get_mut(&(tag, block)) {
            v.pop();
            if v.is_empty() {
                self.pins.remove(&(tag, block));
            }
        }
    }

    /// Saves still pinned.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.pins.values().map(Vec::len).sum()
    }
}

/// A fabric load and the pool blocks it writes into. Until the load ends
/// the blocks are the connector's; dropped before then, this parks them
/// with the pool, which frees them once the load has ended.
pub(super) struct LoadBlocks {
    /// None once dropped.
    pub(super) load: Option<PendingLoad>,
    pub(super) blocks: BlockTable,
    /// The load reported its end.
    pub(super) ended: bool,
}

impl LoadBlocks {
    pub(super) fn new(load: PendingLoad, blocks: BlockTable) -> LoadBlocks {
        LoadBlocks {
            load: Some(load),
            blocks,
            ended: false,
        }
    }

    pub(super) fn pending(&self) -> &PendingLoad {
        self.load.as_ref().expect("a live LoadBlocks has its load")
    }

    /// Wait up to `timeout` for the load to end: Some(blocks that arrived).
    pub(super) fn wait(&mut self, timeout: Duration) -> Option<usize> {
        let n = self.pending().wait(timeout);
        self.ended |= n.is_some();
        n
    }

    /// The blocks, once the load ended ([`Self::wait`] said so).
    pub(super) fn into_blocks(mut self) -> BlockTable {
        assert!(self.ended, "blocks taken from a load still running");
        self.blocks.split_off(0)
    }
}

impl Drop for LoadBlocks {
    fn drop(&mut self) {
        let Some(load) = self.load.take() else {
            return;
        };
        if !self.ended && load.try_finish().is_none() {
            let blocks = self.blocks.split_off(0);
            blocks.park_until(move || load.try_finish().is_some());
        }
    }
}

/// A load streaming into a running sequence: its first `n` blocks sit
/// (shared) in the sequence's table from index `from`, unregistered, still
/// written by the connector.
pub(super) struct Streaming {
    pub(super) load: LoadBlocks,
    pub(super) keys: Vec<BlockKey>,
    pub(super) from: usize,
    pub(super) n: usize,
}

impl Streaming {
    /// The load, for the forward pass's per-layer gate.
    pub(super) fn load(&self) -> &PendingLoad {
        self.load.pending()
    }
}
