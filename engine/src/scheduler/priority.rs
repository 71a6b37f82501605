//! Two request classes: interactive requests and batch-job requests (the
//! async batch API, `crate::batch`), which only fill idle decode slots.
//!
//! Batch requests arrive on an intake of their own and wait in a queue of
//! their own. The rules, applied before every step:
//! - an interactive request is admitted before any waiting batch request;
//!   batch requests are admitted only while no interactive request waits,
//!   and at most `batch_cap` of them run (or load) at once;
//! - while an interactive sequence prefills, batch sequences sit out the
//!   step (they keep their blocks): its time to first token does not pay
//!   for their rows;
//! - batch prefills take at most `BATCH_STEP_PREFILL` tokens per step, so
//!   no step with batch work runs long (an interactive request arriving
//!   mid-step waits for it to end);
//! - when interactive requests wait for a slot, running batch sequences
//!   yield it: the latest admitted are paused (their blocks go back to the
//!   pool, the full ones stay in the prefix cache) and requeued at the front
//!   of the batch queue. A paused sequence keeps its tokens and its sampler,
//!   so when it resumes it recomputes its KV (mostly prefix-cache hits) and
//!   goes on with the same tokens it would have produced unpaused, as the
//!   pool-pressure preemption already does.
//!
//! The scheduler thread's loop lives here too: it waits on both intakes
//! when idle.

use tokio::sync::mpsc;

use super::seq::Seq;
use super::Scheduler;
use crate::request::{EngineHandle, GenerationRequest};
use crate::EngineError;

/// What woke an idle scheduler.
enum Woken {
    Interactive(GenerationRequest),
    Batch(GenerationRequest),
    BatchClosed,
    ShutDown,
}

impl Scheduler {
    /// Run at most `cap` batch sequences at once (default: `max_seqs`).
    pub fn with_batch_cap(mut self, cap: usize) -> Scheduler {
        self.batch.cap = cap;
        self
    }

    /// Start the scheduler thread; it exits when every handle is dropped and the work is done.
    pub fn spawn(
        mut self,
        queue: usize,
    ) -> Result<(EngineHandle, std::thread::JoinHandle<()>), EngineError> {
        let (tx, rx) = mpsc::channel(queue.max(1));
        let (batch_tx, batch_rx) = mpsc::channel(queue.max(1));
        self.batch.intake = Some(batch_rx);
        let keys = self.key_basis();
        let join = std::thread::Builder::new()
            .name("kvf-scheduler".into())
            .spawn(move || self.run(rx))?;
        Ok((
            EngineHandle::with_batch_intake(tx, batch_tx).with_keys(keys),
            join,
        ))
    }

    /// The loop: take requests (both classes), step, repeat.
    pub fn run(mut self, mut intake: mpsc::Receiver<GenerationRequest>) {
        loop {
            if self.idle() {
                match self.wait(&mut intake) {
                    Woken::Interactive(r) => self.accept(r),
                    Woken::Batch(r) => self.accept_batch(r),
                    Woken::BatchClosed => self.batch.intake = None,
                    Woken::ShutDown => return,
                }
            }
            while let Ok(r) = intake.try_recv() {
                self.accept(r);
            }
            while let Some(r) = self.batch.intake.as_mut().and_then(|b| b.try_recv().ok()) {
                self.accept_batch(r);
            }
            self.step();
        }
    }

    /// Block until either intake has something (or the interactive one closed).
    fn wait(&mut self, intake: &mut mpsc::Receiver<GenerationRequest>) -> Woken {
        let Some(batch) = self.batch.intake.as_mut() else {
            return intake
                .blocking_recv()
                .map_or(Woken::ShutDown, Woken::Interactive);
        };
        futures::executor::block_on(async {
            tokio::select! {
                r = intake.recv() => r.map_or(Woken::ShutDown, Woken::Interactive),
                r = batch.recv() => r.map_or(Woken::BatchClosed, Woken::Batch),
            }
        })
    }

    /// Accept a batch-class request: checked like any, queued in the batch queue.
    pub(super) fn accept_batch(&mut self, r: GenerationRequest) {
        let before = self.waiting.len();
        self.accept(r);
        if self.waiting.len() > before {
            if let Some(mut s) = self.waiting.pop_back() {
                s.batch = true;
                self.batch.waiting.push_back(s);
            }
        }
    }

    /// Sequences running or loading (each holds a slot).
    fn busy(&self) -> usize {
        self.running.len() + self.loading.len()
    }

    /// Batch sequences running or loading.
    pub(super) fn batch_busy(&self) -> usize {
        self.running.iter().filter(|s| s.batch).count()
            + self.loading.iter().filter(|l| l.seq.batch).count()
    }

    /// Fill the free slots: interactive requests first (batch sequences
    /// yield theirs to them), then batch requests while none waits.
    pub(super) fn admit_waiting(&mut self) {
        let slots = self.cfg.max_seqs.max(1);
        self.batch.waiting.retain(|s| !s.events.is_closed());
        self.yield_to_interactive(slots);
        while self.busy() < slots {
            let Some(s) = self.waiting.pop_front() else {
                break;
            };
            self.admit(s);
        }
        if !self.waiting.is_empty() {
            return;
        }
        while self.busy() < slots && self.batch_busy() < self.batch.cap {
            let Some(s) = self.batch.waiting.pop_front() else {
                break;
            };
            self.admit(s);
        }
    }

    /// Pause the latest running batch sequences, one per interactive request
    /// that would not find a free slot.
    fn yield_to_interactive(&mut self, slots: usize) {
        let free = slots.saturating_sub(self.busy());
        let mut need = self.waiting.len().saturating_sub(free);
        let mut i = self.running.len();
        while need > 0 && i > 0 {
            i -= 1;
            let s = &self.running[i];
            // Not one whose blocks are still arriving, nor one flushing its end.
            if !s.batch || s.stream.is_some() || s.finished.is_some() {
                continue;
            }
            let mut s = self.running.remove(i);
            s.drop_kv();
            self.cfg.metrics.batch_yields.inc();
            // Latest first: each earlier one goes in front of it.
            self.batch.waiting.push_front(s);
            need -= 1;
        }
    }

    /// Whether batch-job sequences sit out this step: an interactive
    /// sequence is prefilling (its time to first token would pay for their
    /// rows). They keep their blocks and go on at the next step.
    pub(super) fn hold_batch(&self) -> bool {
        self.running
            .iter()
            .any(|s| !s.batch && s.tokens.len() - s.computed > 1)
    }

    /// Tokens of running sequence `i` to plan, `n` before this rule: a
    /// batch sequence's prefill takes at most `left` tokens of the step's
    /// batch prefill budget (any chunk length gives the same bits; only
    /// blocks computed whole are registered).
    pub(super) fn batch_chunk(&self, i: usize, n: usize, left: &mut usize) -> usize {
        if !self.running[i].batch || n <= 1 {
            return n;
        }
        let n = n.min(*left);
        *left -= n;
        n
    }

    /// A preempted sequence goes back to the front of its class's queue.
    pub(super) fn requeue_front(&mut self, s: Seq) {
        if s.batch {
            self.batch.waiting.push_front(s);
        } else {
            self.waiting.push_front(s);
        }
    }

    /// Publish the queue lengths and KV pool use as they are now. Called
    /// after every step, so the gauges read 0 running and 0 waiting once
    /// the last request finished and the scheduler went idle (not the
    /// value of the last step that still ran it).
    pub(super) fn report_gauges(&self) {
        let m = &self.cfg.metrics;
        m.running_requests.set(self.running.len() as i64);
        m.waiting_requests.set(self.waiting.len() as i64);
        m.batch_running.set(self.batch_busy() as i64);
        m.batch_waiting.set(self.batch.waiting.len() as i64);
        let total = self.kv.blocks();
        m.kv_blocks_total.set(total as i64);
        m.kv_blocks_used
            .set(total.saturating_sub(self.blocks.available()) as i64);
    }
}

#[cfg(test)]
#[path = "priority_tests.rs"]
mod tests;
