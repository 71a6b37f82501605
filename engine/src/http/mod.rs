//! The OpenAI-compatible HTTP API (axum): routes, shared state and `serve`.
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions` (see
//! [`completions`]), `GET /v1/models`, `GET /health`, `GET /metrics`
//! (Prometheus text of the registry handed in), and the batch API's
//! `/v1/files` and `/v1/batches` routes ([`batch`]). Every error is an OpenAI
//! JSON error body, unknown routes included. `/v1/*` passes the tenant gate
//! first ([`tenancy`]: API key, per-tenant limits); `/health` and
//! `/metrics` do not.

mod answer;
pub(crate) mod batch;
mod completions;
pub mod generate;
mod logprobs;
pub mod openai;
mod params;
mod response;
pub mod stop;
mod structured;
mod tenancy;
mod tools;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::net::TcpListener;

use crate::chat::ChatTemplate;
use crate::grammar::Grammars;
pub use crate::metrics::{EngineMetrics, RequestOutcomeLabels};
use crate::request::EngineHandle;
use crate::tokenizer::Tokenizer;
use crate::EngineError;
use kvfabric_tenants::http::gate;
use kvfabric_tenants::TenantGate;
pub use openai::ApiError;

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
    pub batches: Option<Arc<crate::batch::BatchService>>,
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
    pub fn with_batches(mut self, service: Arc<crate::batch::BatchService>) -> HttpState {
        self.batches = Some(service);
        self
    }

    /// A fresh response id such as `chatcmpl-0123456789abcdef`.
    pub(crate) fn request_id(&self, prefix: &str) -> String {
        let n = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{n:016x}")
    }
}

/// Seconds since the Unix epoch (the `created` field).
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The router with every route; `serve` runs it, tests may embed it.
pub fn router(state: HttpState) -> Router {
    let state = Arc::new(state);
    let v1 = Router::new()
        .route("/v1/chat/completions", post(completions::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(list_models))
        .route(
            "/v1/files",
            post(batch::upload_file)
                .get(batch::list_files)
                .layer(DefaultBodyLimit::max(upload_limit(&state))),
        )
        .route(
            "/v1/files/{id}",
            get(batch::get_file).delete(batch::delete_file),
        )
        .route("/v1/files/{id}/content", get(batch::file_content))
        .route(
            "/v1/batches",
            post(batch::create_batch).get(batch::list_batches),
        )
        .route("/v1/batches/{id}", get(batch::get_batch))
        .route("/v1/batches/{id}/cancel", post(batch::cancel_batch))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            gate::<HttpState>,
        ));
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .with_state(state)
}

/// Largest upload body: the file limit plus room for the form around it.
fn upload_limit(state: &HttpState) -> usize {
    let max = state
        .batches
        .as_ref()
        .map_or(0, |b| b.cfg.max_file_bytes.as_u64());
    usize::try_from(max)
        .unwrap_or(usize::MAX)
        .saturating_add(64 * 1024)
}

/// Serve the API on `listener` until `shutdown` resolves (in-flight requests finish).
pub async fn serve(
    listener: TcpListener,
    state: HttpState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), EngineError> {
    let addr = listener.local_addr()?;
    tracing::info!(%addr, model = %state.model_name, "OpenAI-compatible API listening");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(EngineError::Io)
}

async fn list_models(State(state): State<Arc<HttpState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": state.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "kvfabric",
            "max_model_len": state.context_length,
        }]
    }))
    .into_response()
}

async fn health() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn metrics_text(State(state): State<Arc<HttpState>>) -> Response {
    let mut body = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        return ApiError::server(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}"),
        )
        .into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError::invalid(format!("no route for {}", uri.path()), None)
        .with_status(StatusCode::NOT_FOUND)
        .with_code("unknown_url")
        .into_response()
}
