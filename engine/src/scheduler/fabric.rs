//! The scheduler's side of the fabric connector.
//!
//! * Admission: after the local prefix cache, start a fabric lookup of the
//!   following blocks; when it answers, allocate pool blocks for what the
//!   fabric holds and start the load. Meanwhile the sequence waits in
//!   `loading` (not planned into any forward pass, its blocks untouched by
//!   the engine); when the load ends, the blocks that arrived verified join
//!   its table and the rest are freed and recomputed. Other sequences keep
//!   stepping: the scheduler only polls.
//! * Save: each block a sequence completes is pinned (one more reference)
//!   and queued with the connector; the pin is dropped when the connector
//!   reports the save finished. A full queue drops the save, never waits.
//! * Prefill role: a finished sequence waits in `flushing` until every full
//!   block of its prompt is in the fabric (or failed), then the scheduler
//!   sends `Saved` (the transfer params) and `Finished`.

use std::time::Duration;

use kvfabric_connector::{KvConnector, SaveBlock};
use kvfabric_store::keys::BlockKey;

use super::{FabricWait, Loading, Scheduler, Seq};
use crate::kv::{BlockId, BlockManager};
use crate::request::{GenerationEvent, TransferParams};

/// Block indices fit in the low bits of a save's tag, the sequence id above.
const TAG_BLOCK_BITS: u32 = 24;

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

/// Pin block `r` of `s` (registered under `key`) and queue it for saving.
pub(super) fn save_block(
    c: &dyn KvConnector,
    blocks: &mut BlockManager,
    s: &mut Seq,
    r: usize,
    key: BlockKey,
    block_tokens: usize,
) {
    if s.fabric.len() <= r {
        s.fabric.resize(r + 1, FabricState::Unknown);
    }
    let b = s.table[r];
    // Another block holds this key already (a concurrent duplicate): that one is saved.
    if s.fabric[r] != FabricState::Unknown || blocks.key_of(b) != Some(key) {
        return;
    }
    blocks.retain(b);
    let queued = c.save(SaveBlock {
        key,
        block: b,
        tokens: block_tokens as u32,
        tag: (s.id << TAG_BLOCK_BITS) | r as u64,
    });
    if queued {
        s.fabric[r] = FabricState::Saving;
    } else {
        blocks.release(b);
    }
}

impl Scheduler {
    /// Ask the fabric for the blocks after the sequence's local prefix;
    /// None when the sequence went to `loading` to wait for the answer.
    pub(super) fn start_fabric_load(&mut self, seq: Seq, keys: &[BlockKey]) -> Option<Seq> {
        let Some(c) = self.connector.clone() else {
            return Some(seq);
        };
        let have = seq.table.len();
        if have >= keys.len() {
            return Some(seq);
        }
        let keys = keys[have..].to_vec();
        let pending = c.start_lookup(keys.clone());
        self.loading.push(Loading {
            seq,
            stage: FabricWait::Lookup { pending, keys },
        });
        None
    }

    /// The lookup found `found` of `keys`: allocate pool blocks and start
    /// loading them, or run the sequence as it is.
    fn after_lookup(&mut self, seq: Seq, keys: Vec<BlockKey>, found: usize, c: &dyn KvConnector) {
        let mut blocks = Vec::with_capacity(found);
        while blocks.len() < found.min(keys.len()) {
            // Only free or cached blocks: a load never preempts running work.
            match self.blocks.allocate() {
                Some(b) => blocks.push(b),
                None => break,
            }
        }
        if blocks.is_empty() || seq.events.is_closed() {
            for b in blocks {
                self.blocks.release(b);
            }
            self.begin(seq);
            return;
        }
        let keys: Vec<BlockKey> = keys[..blocks.len()].to_vec();
        let load = c.start_load(keys.iter().copied().zip(blocks.iter().copied()).collect());
        self.loading.push(Loading {
            seq,
            stage: FabricWait::Load { load, blocks, keys },
        });
    }

    /// Move answered lookups on to their loads, finished loads to the
    /// running set, hand finished saves' blocks back, and answer flushed
    /// prefill sequences. Waits up to `wait` for the first lookup, load or
    /// save when nothing has finished.
    pub(super) fn poll_fabric(&mut self, wait: Duration) {
        let Some(c) = self.connector.clone() else {
            return;
        };
        let mut i = 0;
        let mut waited = wait.is_zero();
        while i < self.loading.len() {
            let budget = if waited { Duration::ZERO } else { wait };
            waited = true;
            let outcome = match &self.loading[i].stage {
                FabricWait::Lookup { pending, .. } => pending.wait(budget),
                FabricWait::Load { load, .. } => load.wait(budget),
            };
            let Some(n) = outcome else {
                i += 1;
                continue;
            };
            let l = self.loading.swap_remove(i);
            match l.stage {
                FabricWait::Lookup { keys, .. } => self.after_lookup(l.seq, keys, n, c.as_ref()),
                FabricWait::Load { blocks, keys, .. } => self.finish_load(l.seq, blocks, keys, n),
            }
        }
        let saves_wait = if waited { Duration::ZERO } else { wait };
        for d in c.finished_saves(saves_wait) {
            self.blocks.release(d.block);
            let id = d.tag >> TAG_BLOCK_BITS;
            let r = (d.tag & ((1 << TAG_BLOCK_BITS) - 1)) as usize;
            let seq = self
                .running
                .iter_mut()
                .chain(self.flushing.iter_mut())
                .find(|s| s.id == id);
            if let Some(s) = seq {
                if s.fabric.get(r) == Some(&FabricState::Saving) {
                    s.fabric[r] = if d.stored {
                        FabricState::In
                    } else {
                        FabricState::Failed
                    };
                }
            }
        }
        let mut i = 0;
        while i < self.flushing.len() {
            let s = &self.flushing[i];
            let closed = s.events.is_closed();
            if closed || !s.fabric.contains(&FabricState::Saving) {
                let s = self.flushing.swap_remove(i);
                self.answer_flushed(s, c.as_ref());
            } else {
                i += 1;
            }
        }
    }

    fn finish_load(
        &mut self,
        mut seq: Seq,
        blocks: Vec<BlockId>,
        keys: Vec<BlockKey>,
        loaded: usize,
    ) {
        for (i, (b, k)) in blocks.into_iter().zip(keys).enumerate() {
            if i < loaded {
                self.blocks.register(b, k);
                seq.table.push(b);
                seq.fabric.push(FabricState::In);
                seq.parent = Some(k);
                seq.registered += 1;
            } else {
                self.blocks.release(b);
            }
        }
        seq.computed = seq.table.len() * self.kv.layout().block_tokens as usize;
        if seq.events.is_closed() {
            self.release(&mut seq);
            return;
        }
        self.begin(seq);
    }

    /// A prefill sequence finished generating: save the prompt blocks it
    /// took from the local cache too, then wait for all of them.
    pub(super) fn start_flush(&mut self, mut s: Seq) {
        let bt = self.kv.layout().block_tokens as usize;
        if let Some(c) = self.connector.clone() {
            let full = (s.prompt_len / bt).min(s.registered);
            if s.fabric.len() < full {
                s.fabric.resize(full, FabricState::Unknown);
            }
            let keys = s.chain.keys(&s.tokens[..full * bt]);
            for (r, key) in keys.into_iter().enumerate() {
                if s.fabric[r] == FabricState::Unknown {
                    save_block(c.as_ref(), &mut self.blocks, &mut s, r, key, bt);
                }
            }
        }
        self.flushing.push(s);
    }

    fn answer_flushed(&mut self, mut s: Seq, c: &dyn KvConnector) {
        let bt = self.kv.layout().block_tokens as usize;
        let full = (s.prompt_len / bt).min(s.fabric.len());
        let saved = s.fabric[..full]
            .iter()
            .take_while(|f| **f == FabricState::In)
            .count();
        let block_keys = s.chain.keys(&s.tokens[..saved * bt]);
        let _ = s
            .events
            .blocking_send(GenerationEvent::Saved(TransferParams {
                holder: c.holder(),
                block_keys,
                block_tokens: bt,
            }));
        if let Some((reason, usage)) = s.finished.take() {
            let _ = s
                .events
                .blocking_send(GenerationEvent::Finished { reason, usage });
        }
        self.release(&mut s);
    }
}
