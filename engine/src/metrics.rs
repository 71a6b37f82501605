//! The engine's Prometheus metrics, shared by the HTTP layer and the scheduler.
//!
//! They live at the crate root, not under `http`, because the scheduler
//! reports into them too and must not depend on the HTTP layer (imports
//! point one way: `http` and `scheduler` both use this module, it uses
//! neither).
//!
//! [`EngineMetrics`] is a bundle of prometheus-client handles: cheap to clone,
//! every clone updates the same series. It is registered into a registry the
//! caller owns (no global registry); `/metrics` encodes that registry.
//!
//! Who updates what (so nothing is counted twice):
//! - HTTP layer: `time_to_first_token_seconds`, `inter_token_latency_seconds`,
//!   `prompt_tokens`, `generation_tokens`, `prefix_cache_hit_tokens`
//!   (from `Usage::cached_tokens`), `requests{outcome}`.
//! - Scheduler: `batch_size` (per step histogram), `running_requests`,
//!   `waiting_requests`, `kv_blocks_used`, `kv_blocks_total`,
//!   `spec_drafted_tokens`, `spec_accepted_tokens`, `spec_acceptance_length`,
//!   `batch_running_requests`, `batch_waiting_requests`, `batch_yields`
//!   (batch-job requests, `scheduler/priority.rs`).
//!
//! Gauges are true at any moment, idle included: the scheduler sets them
//! after every step (not before the forward pass), so they read 0 running
//! and 0 waiting once the last request finished.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of `kvfabric_engine_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestOutcomeLabels {
    /// `stop`, `length`, `cancelled` or `error`.
    pub outcome: String,
}

/// Engine metrics; clone freely and update from any thread.
#[derive(Clone, Debug)]
pub struct EngineMetrics {
    /// Request arrival at the HTTP layer to its first generated token.
    pub time_to_first_token_seconds: Histogram,
    /// Time between consecutive generated tokens of one request.
    pub inter_token_latency_seconds: Histogram,
    /// Prompt tokens of completed requests (`rate()` gives prompt tokens/s).
    pub prompt_tokens: Counter,
    /// Generated tokens (`rate()` gives tokens/s).
    pub generation_tokens: Counter,
    /// Prompt tokens whose KV was reused (local prefix cache or fabric).
    pub prefix_cache_hit_tokens: Counter,
    /// Prompt tokens run through a forward pass (scheduler); `n` samples
    /// of one prompt count it once.
    pub prompt_tokens_computed: Counter,
    /// Finished requests by outcome.
    pub requests: Family<RequestOutcomeLabels, Counter>,
    /// Sequences per forward step (scheduler).
    pub batch_size: Histogram,
    /// Sequences being generated now (scheduler).
    pub running_requests: Gauge,
    /// Requests queued, not yet admitted (scheduler).
    pub waiting_requests: Gauge,
    /// Batch-job sequences running or loading (scheduler).
    pub batch_running: Gauge,
    /// Batch-job sequences waiting, new or paused (scheduler).
    pub batch_waiting: Gauge,
    /// Batch-job sequences paused to give their slot to an interactive request (scheduler).
    pub batch_yields: Counter,
    /// KV pool blocks in use (scheduler).
    pub kv_blocks_used: Gauge,
    /// KV pool capacity in blocks (scheduler).
    pub kv_blocks_total: Gauge,
    /// Forward passes that waited on a layer-wise load's layers (scheduler).
    pub streamed_steps: Counter,
    /// Layer-wise loads whose layer failed or came late: that step of the
    /// sequence was discarded and the load finished whole (scheduler).
    pub stream_fallbacks: Counter,
    /// Draft tokens verified (scheduler).
    pub spec_drafted_tokens: Counter,
    /// Draft tokens accepted (scheduler).
    pub spec_accepted_tokens: Counter,
    /// Tokens one verification emitted: accepted drafts plus the sampled one (scheduler).
    pub spec_acceptance_length: Histogram,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        EngineMetrics::new()
    }
}

impl EngineMetrics {
    /// Fresh, unregistered metrics.
    pub fn new() -> EngineMetrics {
        EngineMetrics {
            // 1 ms .. ~65 s
            time_to_first_token_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            // 0.5 ms .. ~8 s
            inter_token_latency_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 15)),
            prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            prefix_cache_hit_tokens: Counter::default(),
            prompt_tokens_computed: Counter::default(),
            requests: Family::default(),
            // 1 .. 512
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
            running_requests: Gauge::default(),
            waiting_requests: Gauge::default(),
            batch_running: Gauge::default(),
            batch_waiting: Gauge::default(),
            batch_yields: Counter::default(),
            kv_blocks_used: Gauge::default(),
            kv_blocks_total: Gauge::default(),
            streamed_steps: Counter::default(),
            stream_fallbacks: Counter::default(),
            spec_drafted_tokens: Counter::default(),
            spec_accepted_tokens: Counter::default(),
            // 1 .. 32
            spec_acceptance_length: Histogram::new(exponential_buckets(1.0, 2.0, 6)),
        }
    }

    /// Register every series under `kvfabric_engine_*`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("kvfabric_engine");
        self.register_requests(r);
        self.register_load(r);
        self.register_streaming(r);
        self.register_speculation(r);
    }

    /// Latencies, tokens and outcomes of requests.
    fn register_requests(&self, r: &mut Registry) {
        r.register(
            "time_to_first_token_seconds",
            "Time from request arrival to the first generated token",
            self.time_to_first_token_seconds.clone(),
        );
        r.register(
            "inter_token_latency_seconds",
            "Time between consecutive generated tokens of a request",
            self.inter_token_latency_seconds.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens of finished requests",
            self.prompt_tokens.clone(),
        );
        r.register(
            "generation_tokens",
            "Generated tokens",
            self.generation_tokens.clone(),
        );
        r.register(
            "prefix_cache_hit_tokens",
            "Prompt tokens whose KV was reused instead of computed",
            self.prefix_cache_hit_tokens.clone(),
        );
        r.register(
            "prompt_tokens_computed",
            "Prompt tokens run through a forward pass (n samples of one prompt count it once)",
            self.prompt_tokens_computed.clone(),
        );
        r.register(
            "requests",
            "Finished requests by outcome (stop, length, cancelled, error)",
            self.requests.clone(),
        );
    }

    /// Batch size, queues (interactive and batch jobs) and the KV pool.
    fn register_load(&self, r: &mut Registry) {
        r.register(
            "batch_size",
            "Sequences per forward step",
            self.batch_size.clone(),
        );
        r.register(
            "running_requests",
            "Sequences being generated",
            self.running_requests.clone(),
        );
        r.register(
            "waiting_requests",
            "Requests waiting for admission",
            self.waiting_requests.clone(),
        );
        r.register(
            "batch_running_requests",
            "Batch-job sequences running",
            self.batch_running.clone(),
        );
        r.register(
            "batch_waiting_requests",
            "Batch-job sequences waiting (new or paused)",
            self.batch_waiting.clone(),
        );
        r.register(
            "batch_yields",
            "Batch-job sequences paused to give their slot to an interactive request",
            self.batch_yields.clone(),
        );
        r.register(
            "kv_blocks_used",
            "KV pool blocks in use",
            self.kv_blocks_used.clone(),
        );
        r.register(
            "kv_blocks_total",
            "KV pool capacity in blocks",
            self.kv_blocks_total.clone(),
        );
    }

    /// Layer-wise loads from the fabric.
    fn register_streaming(&self, r: &mut Registry) {
        r.register(
            "streamed_steps",
            "Forward passes that waited on layers of a layer-wise load",
            self.streamed_steps.clone(),
        );
        r.register(
            "stream_fallbacks",
            "Layer-wise loads that failed or came late in a forward pass (step discarded, load finished whole)",
            self.stream_fallbacks.clone(),
        );
    }

    /// Speculative decoding.
    fn register_speculation(&self, r: &mut Registry) {
        r.register(
            "spec_drafted_tokens",
            "Speculative draft tokens verified",
            self.spec_drafted_tokens.clone(),
        );
        r.register(
            "spec_accepted_tokens",
            "Speculative draft tokens accepted",
            self.spec_accepted_tokens.clone(),
        );
        r.register(
            "spec_acceptance_length",
            "Tokens emitted per speculative verification (accepted drafts + 1)",
            self.spec_acceptance_length.clone(),
        );
    }

    /// Count one finished request.
    pub fn record_outcome(&self, outcome: &str) {
        self.requests
            .get_or_create(&RequestOutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    }
}
