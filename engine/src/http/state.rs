//! [`HttpState`]: everything the HTTP handlers share (the engine handle,
//! tokenizer, template, metrics, tenant gate, grammars, the batch service).
//! A leaf of the HTTP layer: the router (`mod.rs`) and the handlers import
//! it, and it imports none of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use kvfabric_tenants::TenantGate;
use prometheus_client::registry::Registry;

use crate::batch::BatchService;
use crate::chat::ChatTemplate;
use crate::grammar::Grammars;
use crate::metrics::EngineMetrics;
use crate::request::EngineHandle;
use crate::tokenizer::Tokenizer;

/// Everything the HTTP layer needs; cheap to clone.
#[derive(Clone, Debug)]
pub struct HttpState {
    /// Where requests go.
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Arc<ChatTemplate>,
    /// The one model id this server answers to (`model` must match).
    pub model_name: String,
    /// Context length in tokens: prompt + max_tokens must fit.
    pub context_length: usize,
    /// Ids that end generation (default: the tokenizer's EOS / end-of-turn ids).
    pub stop_token_ids: Vec<u32>,
    /// Updated by the HTTP layer (latencies, tokens) and by the scheduler.
    pub metrics: EngineMetrics,
    /// Encoded by `GET /metrics`; `metrics` must be registered in it.
    pub registry: Arc<Registry>,
    /// API keys, limits and namespaces (single-tenant mode unless
    /// [`with_tenants`](Self::with_tenants) is given a tenants file's gate).
    pub tenants: TenantGate,
    /// Compiles `response_format` schemas and forced tool calls.
    pub grammars: Arc<Grammars>,
    /// The batch API (None: its routes answer 404).
    pub batches: Option<Arc<BatchService>>,
    next_request_id: Arc<AtomicU64>,
}

impl HttpState {
    /// State with the tokenizer's stop ids. Register `metrics` into the
    /// registry before wrapping it in the `Arc`.
    pub fn new(
        engine: EngineHandle,
        tokenizer: Arc<Tokenizer>,
        chat_template: Arc<ChatTemplate>,
        model_name: impl Into<String>,
        context_length: usize,
        metrics: EngineMetrics,
        registry: Arc<Registry>,
    ) -> HttpState {
        let stop_token_ids = tokenizer.stop_token_ids();
        // Seeded from the clock so ids differ across restarts; unique within one process.
        let first_id = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let grammars = Arc::new(Grammars::new(tokenizer.clone(), stop_token_ids.clone()));
        HttpState {
            engine,
            tokenizer,
            chat_template,
            model_name: model_name.into(),
            context_length,
            stop_token_ids,
            metrics,
            registry,
            tenants: TenantGate::single_tenant(Default::default()),
            grammars,
            batches: None,
            next_request_id: Arc::new(AtomicU64::new(first_id)),
        }
    }

    /// Check API keys and limits with `gate` (its metrics must be
    /// registered in the registry handed to [`new`](Self::new)).
    pub fn with_tenants(mut self, gate: TenantGate) -> HttpState {
        self.tenants = gate;
        self
    }

    /// Serve the batch API of `service`.
    pub fn with_batches(mut self, service: Arc<BatchService>) -> HttpState {
        self.batches = Some(service);
        self
    }

    /// A fresh response id such as `chatcmpl-0123456789abcdef`.
    pub(crate) fn request_id(&self, prefix: &str) -> String {
        let n = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{n:016x}")
    }
}
