//! Continuous-batching scheduler on its own OS thread.
//!
//! Requests arrive on an mpsc channel and join the running set between
//! forward steps; each step packs every decoding sequence (one token each)
//! and then prefill chunks into at most `max_batch_tokens` tokens. A prefill
//! that does not fit is cut at a block boundary (chunked prefill), so every
//! block is computed whole or continued later from its start. Before its
//! first step a request takes the longest cached prefix of full blocks from
//! the local prefix cache (keys from `kvfabric_types::KeyChain`) and reports it
//! as `cached_tokens`; every block it completes is registered under its key.
//! When the pool runs out, the most recently admitted sequence is preempted
//! (its blocks released to the cache, recomputed later, mostly from cache hits).
//! A closed event channel cancels a request and frees its blocks.
//!
//! Blocks are held through owned handles (`kv::blocks`): a sequence's table,
//! a load's blocks and a save's pin each give their blocks back when
//! dropped, so every path that drops a sequence frees what it held.
//!
//! With a fabric connector (see `fabric.rs`), admission also asks the fabric
//! for the blocks after the local prefix and loads them into the pool. A
//! load that streams layer by layer lets the sequence run at once: the
//! forward pass waits for each layer (at most `layer_wait_ms` per step)
//! right before attention reads it. Otherwise the sequence waits aside
//! until its blocks arrived, or recomputes what did not, and the scheduler
//! never waits on the network for it. Every block a sequence completes is
//! queued for saving.

mod batch_queue;
mod constrain;
mod fabric;
mod fabric_state;
mod fork;
mod priority;
mod seq;
mod spec;
#[cfg(test)]
mod spec_tests;
#[cfg(test)]
mod tests;
mod token;

use std::collections::VecDeque;
use std::sync::Arc;

use kvfabric_connector::{KvConnector, PendingLoad};
use tokio::sync::mpsc;

use batch_queue::BatchQueue;
use fabric_state::{FabricState, SavePins, Streaming};
use seq::{Loading, Seq};

use crate::config::Role;
use crate::kernels::Compute;
use crate::kv::{BlockPool, KvPool};
use crate::metrics::EngineMetrics;
use crate::model::{LlamaModel, RowLogits, SeqChunk};
use crate::request::{FinishReason, GenerationEvent, GenerationRequest, KeyBasis, Usage};
use crate::sampling::Sampler;
use crate::spec::shared::SharedContinuations;
use crate::spec::{SpecConfig, SpecState};
use crate::EngineError;

/// Batching limits and role.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Tokens per forward step (decode tokens + prefill chunks).
    pub max_batch_tokens: usize,
    /// Sequences running at once.
    pub max_seqs: usize,
    /// both | prefill (finish after the first token, KV left cached) | decode.
    pub role: Role,
    /// Where the scheduler reports batch size, queue lengths and KV pool use
    /// (the HTTP layer reports latency and token counts into the same series).
    pub metrics: EngineMetrics,
    /// Reuse blocks of earlier requests held in the pool.
    pub prefix_cache: bool,
    /// Speculative decoding (see `spec.rs`).
    pub spec: SpecConfig,
}

/// The scheduler's state; [`Scheduler::spawn`] runs it on a dedicated thread.
pub struct Scheduler {
    model: Arc<LlamaModel>,
    cx: Compute,
    kv: KvPool,
    blocks: BlockPool,
    cfg: SchedulerConfig,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    connector: Option<Arc<dyn KvConnector>>,
    loading: Vec<Loading>,
    /// Prefill role: finished sequences waiting for their saves.
    flushing: Vec<Seq>,
    /// Blocks queued for saving, pinned until the connector is done.
    saves: SavePins,
    next_id: u64,
    /// Finished requests' outputs to draft from.
    shared: SharedContinuations,
    /// Scratch for drafts.
    draft_buf: Vec<u32>,
    /// This machine's cost of a verified row (given, or measured when the
    /// scheduler starts: `spec::calibrate`); None where it never drafts.
    pass_cost: Option<crate::spec::length::PassCost>,
    /// Batch-class requests (see `priority.rs`).
    batch: BatchQueue,
}

impl Scheduler {
    /// A scheduler over `kv` (its layout must match the model), with the
    /// fabric behind `connector` if any.
    pub fn new(
        model: Arc<LlamaModel>,
        cx: Compute,
        kv: KvPool,
        cfg: SchedulerConfig,
        connector: Option<Arc<dyn KvConnector>>,
    ) -> Scheduler {
        let blocks = BlockPool::new(kv.blocks());
        // Measured here, not at the first draft: the probe's passes then
        // count to start-up, not to a request.
        let pass_cost = (cfg.spec.enabled && cfg.role != Role::Prefill).then(|| {
            cfg.spec.given_cost().unwrap_or_else(|| {
                crate::spec::calibrate::measure_or_default(&model, &cx, *kv.layout())
            })
        });
        Scheduler {
            model,
            cx,
            kv,
            blocks,
            waiting: VecDeque::new(),
            running: Vec::new(),
            connector,
            loading: Vec::new(),
            flushing: Vec::new(),
            saves: SavePins::default(),
            next_id: 0,
            shared: SharedContinuations::new(if cfg.spec.enabled {
                cfg.spec.shared_tokens
            } else {
                0
            }),
            draft_buf: Vec::new(),
            pass_cost,
            batch: BatchQueue::new(cfg.max_seqs),
            cfg,
        }
    }

    /// Nothing to run, load or flush.
    fn idle(&self) -> bool {
        self.running.is_empty()
            && self.waiting.is_empty()
            && self.loading.is_empty()
            && self.flushing.is_empty()
            && self.blocks.parked() == 0
            && self.batch.waiting.is_empty()
    }

    /// How this scheduler keys blocks: its model and KV layout.
    pub fn key_basis(&self) -> KeyBasis {
        KeyBasis {
            model: self.model.fingerprint(),
            layout: *self.kv.layout(),
        }
    }

    fn accept(&mut self, r: GenerationRequest) {
        let ctx = self.model.config.context_length;
        let bt = self.kv.layout().block_tokens as usize;
        let err = if r.prompt.is_empty() {
            Some("empty prompt".to_string())
        } else if r.prompt.len() >= ctx {
            Some(format!(
                "prompt of {} tokens does not fit the context of {ctx}",
                r.prompt.len()
            ))
        } else if (r.prompt.len() + 1).div_ceil(bt) > self.kv.blocks() {
            Some(format!(
                "prompt of {} tokens does not fit the KV pool",
                r.prompt.len()
            ))
        } else if let Some(&bad) = r
            .prompt
            .iter()
            .find(|&&t| t as usize >= self.model.config.vocab)
        {
            Some(format!("token id {bad} out of vocabulary"))
        } else {
            None
        };
        if let Some(e) = err {
            let _ = r.events.blocking_send(GenerationEvent::Error(e));
            return;
        }
        if r.max_tokens == 0 {
            let usage = Usage {
                prompt_tokens: r.prompt.len(),
                ..Usage::default()
            };
            let _ = r.events.blocking_send(GenerationEvent::Finished {
                reason: FinishReason::Length,
                usage,
            });
            return;
        }
        let chain = self.key_basis().chain(&r.namespace);
        if let Some(c) = &self.connector {
            // It will wait behind others: pull its prefix into our node meanwhile.
            if self.running.len() + self.loading.len() + self.waiting.len() >= self.cfg.max_seqs {
                let bt = self.kv.layout().block_tokens as usize;
                let usable = (r.prompt.len() - 1) / bt;
                c.prefetch(&chain.keys(&r.prompt[..usable * bt]), r.owner.clone());
            }
        }
        self.next_id += 1;
        self.waiting.push_back(Seq {
            id: self.next_id,
            events: r.events,
            prompt_len: r.prompt.len(),
            tokens: r.prompt,
            computed: 0,
            table: self.blocks.table(),
            registered: 0,
            parent: None,
            chain,
            sampler: Sampler::new(&r.sampling),
            max_tokens: r.max_tokens,
            generated: 0,
            stop: r.stop_token_ids,
            return_logits: r.return_logits,
            cached_tokens: None,
            fabric: Vec::new(),
            finished: None,
            stream: None,
            forks: r.forks,
            spec: SpecState::new(&r.namespace),
            drafted: 0,
            batch: false,
            owner: r.owner,
        });
    }

    /// Take the longest cached prefix (full blocks, at least one token left
    /// to compute), then start loading what the fabric has beyond it.
    fn admit(&mut self, mut seq: Seq) {
        let bt = self.kv.layout().block_tokens as usize;
        let usable = (seq.tokens.len() - 1) / bt;
        let keys = seq.chain.keys(&seq.tokens[..usable * bt]);
        let hits = if self.cfg.prefix_cache {
            self.blocks.lookup(&keys)
        } else {
            self.blocks.table()
        };
        seq.computed = hits.len() * bt;
        seq.registered = hits.len();
        seq.parent = hits.len().checked_sub(1).map(|i| keys[i]);
        seq.fabric = vec![FabricState::Unknown; hits.len()];
        seq.table = hits;
        if let Some(seq) = self.start_fabric_load(seq, &keys) {
            self.begin(seq);
        }
    }

    /// Put an admitted sequence (prefix in place) in the running set.
    fn begin(&mut self, mut seq: Seq) {
        // A streaming sequence is admitted once its stream is in (or not).
        if seq.cached_tokens.is_none() && seq.stream.is_none() {
            let cached = seq.computed.min(seq.prompt_len);
            seq.cached_tokens = Some(cached);
            let _ = seq.events.blocking_send(GenerationEvent::Admitted {
                cached_tokens: cached,
            });
        }
        self.running.push(seq);
    }

    /// One step, then the gauges as the step left them.
    fn step(&mut self) {
        self.step_batch();
        self.report_gauges();
    }

    /// One scheduling step: drop cancelled requests, admit waiting ones,
    /// run one forward pass over the plan, then take its tokens.
    fn step_batch(&mut self) {
        self.drop_cancelled();
        self.poll_fabric(std::time::Duration::ZERO);
        self.admit_waiting();
        if self.running.is_empty() {
            // Only loads or saves in flight: wait a little for them, then
            // look at the intake again.
            self.poll_fabric(std::time::Duration::from_millis(2));
            return;
        }
        let plan = self.plan();
        if plan.is_empty() {
            return;
        }
        let (result, mut unloaded) = self.forward_masked(&plan);
        let done = self.take_results(&plan, result, &mut unloaded);
        self.retire(done, unloaded);
    }

    /// Cancelled requests free their blocks.
    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].events.is_closed() {
                self.running.remove(i);
            } else {
                i += 1;
            }
        }
        self.waiting.retain(|s| !s.events.is_closed());
    }

    /// The forward pass over `plan`'s chunks, waiting per layer for blocks
    /// still streaming in; with the running indices whose stream ran late
    /// (their step is void).
    fn forward(&mut self, plan: &[(usize, usize)]) -> (Result<RowLogits, EngineError>, Vec<usize>) {
        let chunks: Vec<SeqChunk> = plan
            .iter()
            .map(|&(i, n)| {
                let s = &self.running[i];
                SeqChunk {
                    tokens: &s.tokens[s.computed..s.computed + n],
                    start: s.computed,
                    blocks: s.table.ids(),
                    logits: s.computed + n == s.tokens.len(),
                }
            })
            .collect();
        self.cfg.metrics.batch_size.observe(chunks.len() as f64);
        // Sequences whose blocks still stream in: wait for each layer before
        // attention reads it, up to the load's budget for this step.
        let gated: Vec<&PendingLoad> = plan
            .iter()
            .filter_map(|&(i, _)| self.running[i].stream.as_ref().map(Streaming::load))
            .collect();
        let started = std::time::Instant::now();
        let mut late = vec![false; gated.len()];
        let mut gate = |layer: usize| {
            for (load, late) in gated.iter().zip(late.iter_mut()) {
                if !*late && !load.wait_layer(layer, started + load.layer_wait()) {
                    *late = true;
                }
            }
        };
        // Logits of the last row, or of every verified row (draft + 1).
        let tails: Vec<usize> = plan
            .iter()
            .map(|&(i, n)| {
                let s = &self.running[i];
                match s.drafted {
                    0 => usize::from(s.computed + n == s.tokens.len()),
                    d => d + 1,
                }
            })
            .collect();
        let result = self
            .model
            .forward_rows(&self.cx, &mut self.kv, &chunks, &tails, &mut gate);
        drop(chunks);
        drop(gated);
        if !late.is_empty() {
            self.cfg.metrics.streamed_steps.inc();
        }
        let mut late = late.into_iter();
        let mut unloaded = Vec::new();
        for &(i, _) in plan {
            if self.running[i].stream.is_some() && late.next() != Some(false) {
                self.cfg.metrics.stream_fallbacks.inc();
                unloaded.push(i);
            }
        }
        (result, unloaded)
    }

    /// Take each planned sequence's logits (an error ends them all); returns
    /// the finished ones. A stream that failed or ran late joins `unloaded`.
    fn take_results(
        &mut self,
        plan: &[(usize, usize)],
        result: Result<RowLogits, EngineError>,
        unloaded: &mut Vec<usize>,
    ) -> Vec<usize> {
        let mut done = Vec::new();
        match result {
            Err(e) => {
                for &(i, _) in plan {
                    self.running[i].take_drafts();
                    let _ = self.running[i]
                        .events
                        .blocking_send(GenerationEvent::Error(e.to_string()));
                    done.push(i);
                }
            }
            Ok(out) => {
                for (&(i, n), logits) in plan.iter().zip(out) {
                    // A stream that failed or ran late: this step of the sequence is void.
                    if unloaded.contains(&i) {
                        continue;
                    }
                    if self.running[i].stream.is_some() && !self.finish_stream(i) {
                        unloaded.push(i);
                        continue;
                    }
                    if self.advance(i, n, logits) {
                        done.push(i);
                    }
                }
            }
        }
        done
    }

    /// Remove finished and unloaded sequences from the running set: finished
    /// ones flush their saves or record their continuation, unloaded ones go
    /// back to waiting for their loads to end.
    fn retire(&mut self, done: Vec<usize>, unloaded: Vec<usize>) {
        // Unloaded sequences go back to waiting for their loads to end.
        let mut gone: Vec<(usize, bool)> = done.into_iter().map(|i| (i, true)).collect();
        gone.extend(unloaded.into_iter().map(|i| (i, false)));
        // A sequence both finished (an error) and unloaded is finished.
        gone.sort_unstable_by_key(|&(i, finished)| (i, !finished));
        gone.dedup_by_key(|g| g.0);
        for (i, finished) in gone.into_iter().rev() {
            if !finished {
                let s = self.running.remove(i);
                self.unload(s);
                continue;
            }
            let s = self.running.remove(i);
            if s.finished.is_some() {
                self.start_flush(s);
            } else {
                self.shared.record(s.spec.ns(), &s.tokens, s.prompt_len);
            }
        }
    }

    /// (running index, tokens to compute) for this step, blocks allocated.
    fn plan(&mut self) -> Vec<(usize, usize)> {
        let bt = self.kv.layout().block_tokens as usize;
        let mut budget = self.cfg.max_batch_tokens.max(1);
        // Batch-job sequences sit out the steps of interactive prefills.
        let (hold, mut batch_prefill) = (self.hold_batch(), batch_queue::BATCH_STEP_PREFILL);
        let mut order: Vec<usize> = (0..self.running.len())
            .filter(|&i| !(hold && self.running[i].batch))
            .collect();
        // Decoding sequences first (one token each), then prefills in arrival order.
        order.sort_by_key(|&i| self.running[i].tokens.len() - self.running[i].computed > 1);
        let mut plan: Vec<(usize, usize)> = Vec::new();
        let mut preempted = Vec::new();
        let decoding = self
            .running
            .iter()
            .filter(|s| s.tokens.len() - s.computed == 1)
            .count();
        for i in order {
            if budget == 0 {
                break;
            }
            if preempted.contains(&i) {
                continue;
            }
            let s = &self.running[i];
            let remaining = s.tokens.len() - s.computed;
            let n = if remaining <= budget {
                remaining
            } else {
                // Chunked prefill: stop at a block boundary.
                (s.computed + budget) / bt * bt - s.computed
            };
            let n = self.batch_chunk(i, n, &mut batch_prefill);
            if n == 0 {
                continue;
            }
            let need = (s.computed + n).div_ceil(bt);
            let mut ok = true;
            while self.running[i].table.len() < need {
                if self.running[i].table.grow() {
                    continue;
                }
                // Preempt the latest sequence not planned yet (not this one).
                // Not one whose blocks are still arriving.
                // Batch-job sequences first (see `priority.rs`).
                let eligible = |v: usize| {
                    v != i
                        && !preempted.contains(&v)
                        && !plan.iter().any(|p| p.0 == v)
                        && self.running[v].stream.is_none()
                };
                let victim = (0..self.running.len())
                    .rev()
                    .find(|&v| eligible(v) && self.running[v].batch)
                    .or_else(|| (0..self.running.len()).rev().find(|&v| eligible(v)));
                match victim {
                    Some(v) => {
                        self.running[v].drop_kv();
                        preempted.push(v);
                    }
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                let n = n + self.add_draft(i, budget - n, decoding);
                plan.push((i, n));
                budget -= n;
            } else if plan.is_empty() {
                let _ = self.running[i].events.blocking_send(GenerationEvent::Error(
                    "sequence does not fit the KV pool".into(),
                ));
                // Closing our side of nothing: mark for removal by dropping its tokens.
                preempted.push(i);
                self.running[i].events = mpsc::channel(1).0;
            } else {
                preempted.push(i);
            }
        }
        // Preempted sequences go back to the front of the queue (oldest first).
        preempted.sort_unstable();
        for v in preempted.into_iter().rev() {
            let mut s = self.running.remove(v);
            s.drop_kv();
            for p in plan.iter_mut() {
                if p.0 > v {
                    p.0 -= 1;
                }
            }
            if !s.events.is_closed() {
                self.requeue_front(s);
            }
        }
        plan
    }
}
