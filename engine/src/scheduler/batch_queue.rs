//! The batch class's queue and limit (the rules are in `priority.rs`).

use std::collections::VecDeque;

use tokio::sync::mpsc;

use super::seq::Seq;
use crate::request::GenerationRequest;

/// Most prompt tokens of batch sequences in one step: a step that holds
/// batch prefill stays short, so an interactive request arriving during it
/// waits little before its own prefill runs.
pub(super) const BATCH_STEP_PREFILL: usize = 16;

/// The batch class's queue and limit.
pub(super) struct BatchQueue {
    /// Requests from [`EngineHandle::batch_class`] handles (None once closed).
    pub(super) intake: Option<mpsc::Receiver<GenerationRequest>>,
    /// Accepted batch sequences not running (new or paused), oldest first.
    pub(super) waiting: VecDeque<Seq>,
    /// Most batch sequences running or loading at once.
    pub(super) cap: usize,
}

impl BatchQueue {
    pub(super) fn new(cap: usize) -> BatchQueue {
        BatchQueue {
            intake: None,
            waiting: VecDeque::new(),
            cap,
        }
    }
}
