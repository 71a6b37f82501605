//! The scheduler's side of the fabric connector.
//!
//! * Admission: after the local prefix cache, start a fabric lookup of the
//!   following blocks; when it answers, allocate pool blocks for what the
//!   fabric holds and start the load. Meanwhile the sequence waits in
//!   `loading` (not planned into any forward pass, its blocks untouched by
//!   the engine); when the load ends, the blocks that arrived verified join
//!   its table and the rest are freed and recomputed. Other sequences keep
//!   stepping: the scheduler only polls.
//! * Layer-wise: once a load says it streams `n` blocks layer by layer,
//!   the sequence runs with them in its table ([`Streaming`]); its forward
//!   pass waits per layer (the gate in `step`). If every layer came in
//!   time, the blocks are registered after that pass; if not, the pass's
//!   work for the sequence is dropped, its table goes back to what it was,
//!   and it waits in `loading` for the load to end like any other. Blocks
//!   still being written are never freed or reused: a load's blocks are a
//!   [`LoadBlocks`], which, dropped before its load ends (the sequence went
//!   away mid-stream), parks them with the pool until it does.
//! * Save: each block a sequence completes is pinned (a [`Block`] handle
//!   in [`SavePins`]) and queued with the connector; the pin is dropped
//!   when the connector reports the save finished. A full queue drops the
//!   save, never waits.
//! * Prefill role: a finished sequence waits in `flushing` until every full
//!   block of its prompt is in the fabric (or failed), then the scheduler
//!   sends `Saved` (the transfer params) and `Finished`.

use std::time::Duration;

use kvfabric_connector::{KvConnector, SaveBlock};
use kvfabric_types::BlockKey;

use super::fabric_state::{FabricState, LoadBlocks, SavePins, Streaming, TAG_BLOCK_BITS};
use super::seq::{FabricWait, Loading, Seq};
use super::Scheduler;
use crate::kv::BlockTable;
use crate::request::{GenerationEvent, TransferParams};

/// Pin block `r` of `s` (registered under `key`) and queue it for saving.
pub(super) fn save_block(
    c: &dyn KvConnector,
    pins: &mut SavePins,
    s: &mut Seq,
    r: usize,
    key: BlockKey,
    block_tokens: usize,
) {
    if s.fabric.len() <= r {
        s.fabric.resize(r + 1, FabricState::Unknown);
    }
    // Another block holds this key already (a concurrent duplicate): that one is saved.
    if s.fabric[r] != FabricState::Unknown || s.table.key_of(r) != Some(key) {
        return;
    }
    let pin = s.table.pin(r);
    let tag = (s.id << TAG_BLOCK_BITS) | r as u64;
    let queued = c.save(SaveBlock {
        key,
        block: pin.id(),
        tokens: block_tokens as u32,
        tag,
        owner: s.owner.clone(),
    });
    if queued {
        s.fabric[r] = FabricState::Saving;
        pins.hold(tag, pin);
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
        // Only free or cached blocks: a load never preempts running work.
        let blocks = self.blocks.allocate(found.min(keys.len()));
        if blocks.is_empty() || seq.events.is_closed() {
            drop(blocks);
            self.begin(seq);
            return;
        }
        let keys: Vec<BlockKey> = keys[..blocks.len()].to_vec();
        let load = c.start_load(
            keys.iter()
                .copied()
                .zip(blocks.ids().iter().copied())
                .collect(),
        );
        self.loading.push(Loading {
            seq,
            stage: FabricWait::Load {
                load: LoadBlocks::new(load, blocks),
                keys,
                streamable: true,
            },
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
            if let FabricWait::Load {
                load,
                streamable: true,
                ..
            } = &self.loading[i].stage
            {
                if let Some(n) = load.pending().streaming().filter(|&n| n > 0) {
                    let l = self.loading.swap_remove(i);
                    if let FabricWait::Load { load, keys, .. } = l.stage {
                        self.start_streamed(l.seq, load, keys, n);
                    }
                    continue;
                }
            }
            let outcome = match &mut self.loading[i].stage {
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
                FabricWait::Load { load, keys, .. } => {
                    self.finish_load(l.seq, load.into_blocks(), keys, n)
                }
            }
        }
        // Loads whose sequence went away: their blocks come back once they end.
        self.blocks.reap();
        let saves_wait = if waited { Duration::ZERO } else { wait };
        for d in c.finished_saves(saves_wait) {
            self.saves.done(d.tag, d.block);
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

    /// Run `seq` with the `n` blocks its load streams in its table.
    fn start_streamed(&mut self, mut seq: Seq, load: LoadBlocks, keys: Vec<BlockKey>, n: usize) {
        let from = seq.table.len();
        seq.table.append(load.blocks.share(0..n));
        seq.computed = seq.table.len() * self.kv.layout().block_tokens as usize;
        seq.stream = Some(Streaming {
            load,
            keys,
            from,
            n,
        });
        self.begin(seq);
    }

    /// Every layer of running sequence `i`'s stream passed the gate: its
    /// blocks join the prefix cache. False if the load did not end with all
    /// of them (the caller unloads the sequence).
    pub(super) fn finish_stream(&mut self, i: usize) -> bool {
        let Some(mut st) = self.running[i].stream.take() else {
            return true;
        };
        // The last layer is published just before the load reports its end.
        let budget = st.load.pending().layer_wait();
        let loaded = st.load.wait(budget).unwrap_or(0);
        if loaded < st.n {
            self.running[i].stream = Some(st);
            return false;
        }
        let s = &mut self.running[i];
        for (j, &k) in st.keys[..st.n].iter().enumerate() {
            s.table.register(st.from + j, k);
            s.fabric.push(FabricState::In);
            s.parent = Some(k);
            s.registered += 1;
        }
        // The load's own references (and its blocks past `n`) go back.
        drop(st);
        // Called before advance(): `computed` is the prefix in place.
        let cached = s.computed.min(s.prompt_len);
        s.cached_tokens = Some(cached);
        let _ = s.events.blocking_send(GenerationEvent::Admitted {
            cached_tokens: cached,
        });
        true
    }

    /// Running sequence `s`'s stream did not deliver in time: drop what this
    /// step computed for it and wait for the load to end.
    pub(super) fn unload(&mut self, mut s: Seq) {
        let Some(st) = s.stream.take() else {
            self.begin(s);
            return;
        };
        // The streamed blocks (the load keeps its own references) and the
        // blocks this step allocated after them.
        s.table.truncate(st.from);
        s.computed = st.from * self.kv.layout().block_tokens as usize;
        self.loading.push(Loading {
            seq: s,
            stage: FabricWait::Load {
                load: st.load,
                keys: st.keys,
                streamable: false,
            },
        });
    }

    /// The load ended with its first `loaded` blocks verified: they join
    /// `seq`'s table, the rest go back to the pool.
    fn finish_load(
        &mut self,
        mut seq: Seq,
        mut blocks: BlockTable,
        keys: Vec<BlockKey>,
        loaded: usize,
    ) {
        drop(blocks.split_off(loaded));
        let from = seq.table.len();
        seq.table.append(blocks);
        for (j, k) in keys.into_iter().enumerate().take(seq.table.len() - from) {
            seq.table.register(from + j, k);
            seq.fabric.push(FabricState::In);
            seq.parent = Some(k);
            seq.registered += 1;
        }
        seq.computed = seq.table.len() * self.kv.layout().block_tokens as usize;
        // A sequence that went away meanwhile drops its blocks with it.
        if !seq.events.is_closed() {
            self.begin(seq);
        }
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
                    save_block(c.as_ref(), &mut self.saves, &mut s, r, key, bt);
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
    }
}
