//! One in-flight generation as seen by the HTTP layer.
//!
//! [`Generation`] submits a [`GenerationRequest`], then turns the scheduler's
//! token events into text steps: streaming detokenization, stop-sequence
//! matching, latency metrics and the final usage. Ending early (stop string
//! seen, or the HTTP response dropped because the client went away) drops the
//! event receiver, which is how the scheduler learns to cancel the request and
//! free its KV blocks. Requests dropped before finishing count as `cancelled`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use axum::http::StatusCode;
use tokio::sync::mpsc;

use kvfabric_tenants::{Identity, TenantGate};

use super::logprobs::{token_logprob, TokenLogprob};
use super::openai::ApiError;
use super::stop::StopMatcher;
use crate::metrics::EngineMetrics;
use crate::request::{
    EngineHandle, FinishReason, Fork, GenerationEvent, GenerationRequest, SamplingParams,
    TransferParams, Usage,
};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Events beyond the tokens: `Admitted`, `Saved`, then `Finished` or `Error`.
const EVENT_CHANNEL_SLACK: usize = 3;

/// What the HTTP layer needs to start one generation.
#[derive(Debug)]
pub(crate) struct GenerationPlan {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_strings: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    /// When the HTTP request arrived (TTFT starts here).
    pub arrived: Instant,
    /// The namespace the prompt's blocks are keyed under (tenant, cache_salt).
    pub namespace: Vec<u8>,
    /// Where the finished request's usage is counted per tenant.
    pub tenant: Option<TenantUsage>,
    /// Report each token's logprob and this many alternatives (None: no logprobs).
    pub top_logprobs: Option<usize>,
}

/// A tenant's gate and identity, to count its usage at the end.
#[derive(Clone, Debug)]
pub(crate) struct TenantUsage {
    pub gate: TenantGate,
    pub who: Identity,
}

/// One unit of output.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// More text (never empty).
    Text(String),
    /// The logprob of the next generated token (before its text, which
    /// may be held back by the stop matcher); only when asked for.
    Logprob(TokenLogprob),
    /// Generation is over.
    Done {
        finish_reason: &'static str,
        usage: Usage,
    },
    /// The engine failed the request.
    Failed(String),
}

/// A submitted request being turned into text.
pub(crate) struct Generation {
    events: Option<mpsc::Receiver<GenerationEvent>>,
    decoder: Option<StreamDecoder>,
    stop: Option<StopMatcher>,
    tokenizer: Arc<Tokenizer>,
    metrics: EngineMetrics,
    arrived: Instant,
    last_token_at: Option<Instant>,
    prompt_tokens: usize,
    completion_tokens: usize,
    queue: VecDeque<Step>,
    outcome_recorded: bool,
    /// Set by a prefill-role engine before it finishes.
    transfer: Option<TransferParams>,
    /// Prompt tokens reused, known once the scheduler admitted the request.
    cached_tokens: usize,
    tenant: Option<TenantUsage>,
    top_logprobs: Option<usize>,
    /// The request's first sample: it alone counts the prompt, TTFT and
    /// the outcome (the others share its prompt).
    primary: bool,
}

/// The seed of sample `k` of a request seeded with `seed`: sample 0 uses
/// the seed itself (so `n: 1` is unchanged), the others a SplitMix64 step
/// of seed + k, so a seeded request repeats all its samples exactly.
pub(crate) fn sample_seed(seed: u64, k: usize) -> u64 {
    if k == 0 {
        return seed;
    }
    let mut z = seed.wrapping_add((k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Generation {
    /// Submit `plan` to the engine as `n` samples (one prefill; see
    /// [`sample_seed`] for their seeds); one generation per sample.
    pub(crate) async fn start(
        engine: &EngineHandle,
        tokenizer: Arc<Tokenizer>,
        metrics: EngineMetrics,
        plan: GenerationPlan,
        n: usize,
    ) -> Result<Vec<Generation>, ApiError> {
        // Room for every event the request can produce, so the scheduler (which
        // sends with `blocking_send`) never blocks its whole batch on one slow
        // client. tokio allocates the channel lazily, so this reserves nothing.
        let capacity = plan.max_tokens + EVENT_CHANNEL_SLACK;
        let mut receivers = Vec::with_capacity(n.max(1));
        let mut forks = Vec::new();
        let (events_tx, events_rx) = mpsc::channel(capacity);
        receivers.push(events_rx);
        for k in 1..n.max(1) {
            let (tx, rx) = mpsc::channel(capacity);
            let mut sampling = plan.sampling.clone();
            sampling.seed = plan.sampling.seed.map(|s| sample_seed(s, k));
            forks.push(Fork {
                sampling,
                events: tx,
            });
            receivers.push(rx);
        }
        let prompt_tokens = plan.prompt.len();
        engine
            .submit(GenerationRequest {
                prompt: plan.prompt,
                max_tokens: plan.max_tokens,
                sampling: plan.sampling,
                stop_token_ids: plan.stop_token_ids,
                namespace: plan.namespace,
                owner: plan.tenant.as_ref().and_then(|t| t.who.owner().cloned()),
                // The row the sampler used rides with each token.
                return_logits: plan.top_logprobs.is_some(),
                forks,
                events: events_tx,
            })
            .await
            .map_err(|e| ApiError::server(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
        let mut tenant = plan.tenant;
        Ok(receivers
            .into_iter()
            .enumerate()
            .map(|(k, rx)| Generation {
                events: Some(rx),
                decoder: Some(StreamDecoder::new(true)),
                stop: Some(StopMatcher::new(plan.stop_strings.clone())),
                tokenizer: tokenizer.clone(),
                metrics: metrics.clone(),
                arrived: plan.arrived,
                last_token_at: None,
                prompt_tokens,
                completion_tokens: 0,
                queue: VecDeque::new(),
                primary: k == 0,
                // Only the first sample records the request's outcome.
                outcome_recorded: k != 0,
                transfer: None,
                cached_tokens: 0,
                tenant: tenant.take(),
                top_logprobs: plan.top_logprobs,
            })
            .collect())
    }

    /// The next step; `None` after `Done` or `Failed` was returned.
    pub(crate) async fn next(&mut self) -> Option<Step> {
        loop {
            if let Some(step) = self.queue.pop_front() {
                return Some(step);
            }
            let events = self.events.as_mut()?;
            match events.recv().await {
                Some(GenerationEvent::Token { id, logits }) => self.on_token(id, logits),
                Some(GenerationEvent::Finished { reason, usage }) => {
                    self.on_finished(reason, usage)
                }
                Some(GenerationEvent::Error(message)) => self.fail(message),
                Some(GenerationEvent::Saved(params)) => self.transfer = Some(params),
                Some(GenerationEvent::Admitted { cached_tokens }) => {
                    self.cached_tokens = cached_tokens
                }
                None => self.fail("the engine dropped the request before finishing it".into()),
            }
        }
    }

    /// The prompt's saved blocks, once a prefill-role engine reported them.
    pub(crate) fn transfer_params(&self) -> Option<&TransferParams> {
        self.transfer.as_ref()
    }

    fn on_token(&mut self, id: u32, logits: Option<Vec<f32>>) {
        let now = Instant::now();
        match self.last_token_at {
            None if !self.primary => {}
            None => self
                .metrics
                .time_to_first_token_seconds
                .observe(now.duration_since(self.arrived).as_secs_f64()),
            Some(last) => self
                .metrics
                .inter_token_latency_seconds
                .observe(now.duration_since(last).as_secs_f64()),
        }
        self.last_token_at = Some(now);
        self.metrics.generation_tokens.inc();
        self.completion_tokens += 1;
        if let (Some(top), Some(row)) = (self.top_logprobs, logits.as_deref()) {
            self.queue
                .push_back(Step::Logprob(token_logprob(row, id, top)));
        }
        let (Some(decoder), Some(stop)) = (self.decoder.as_mut(), self.stop.as_mut()) else {
            return;
        };
        let out = stop.push(&decoder.push(&self.tokenizer, id));
        if !out.text.is_empty() {
            self.queue.push_back(Step::Text(out.text));
        }
        if out.stopped {
            // Dropping the receiver cancels the request in the scheduler.
            self.events = None;
            let usage = Usage {
                prompt_tokens: self.prompt_tokens,
                completion_tokens: self.completion_tokens,
                cached_tokens: self.cached_tokens,
            };
            self.finish("stop", usage);
        }
    }

    fn on_finished(&mut self, reason: FinishReason, usage: Usage) {
        self.events = None;
        let tail = self
            .decoder
            .take()
            .map(StreamDecoder::finish)
            .unwrap_or_default();
        if let Some(mut stop) = self.stop.take() {
            let out = stop.push(&tail);
            let mut text = out.text;
            if !out.stopped {
                text.push_str(&stop.finish());
            }
            if !text.is_empty() {
                self.queue.push_back(Step::Text(text));
            }
            if out.stopped {
                self.finish("stop", usage);
                return;
            }
        }
        let finish_reason = match reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        };
        self.finish(finish_reason, usage);
    }

    fn finish(&mut self, finish_reason: &'static str, usage: Usage) {
        if !self.primary {
            self.queue.push_back(Step::Done {
                finish_reason,
                usage,
            });
            return;
        }
        self.metrics
            .prompt_tokens
            .inc_by(usage.prompt_tokens as u64);
        self.metrics
            .prefix_cache_hit_tokens
            .inc_by(usage.cached_tokens as u64);
        if let Some(t) = &self.tenant {
            t.gate.record_usage(
                &t.who,
                usage.prompt_tokens as u64,
                usage.cached_tokens as u64,
            );
        }
        self.record(finish_reason);
        self.queue.push_back(Step::Done {
            finish_reason,
            usage,
        });
    }

    fn fail(&mut self, message: String) {
        self.events = None;
        self.record("error");
        self.queue.push_back(Step::Failed(message));
    }

    fn record(&mut self, outcome: &str) {
        if !self.outcome_recorded {
            self.outcome_recorded = true;
            self.metrics.record_outcome(outcome);
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        // Dropped before the end: the client went away; the receiver drops with us.
        self.record("cancelled");
    }
}
