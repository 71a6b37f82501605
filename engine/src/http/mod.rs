//! The OpenAI-compatible HTTP API (axum): routes and `serve`; the state the
//! handlers share is [`HttpState`] (`state.rs`).
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions` (see
//! [`completions`]), `GET /v1/models`, `GET /health`, `GET /metrics`
//! (Prometheus text of the registry handed in), the batch API's
//! `/v1/files` and `/v1/batches` routes ([`batch`]), and
//! `POST /v1/kvfabric/keys/{chat/completions,completions}` (a body's block
//! keys, for a prefix-aware router; [`keys`]). Every error is an OpenAI
//! JSON error body, unknown routes included. `/v1/*` passes the tenant gate
//! first ([`tenancy`]: API key, per-tenant limits); `/health` and
//! `/metrics` do not.

mod answer;
pub(crate) mod batch;
mod completions;
pub mod generate;
mod keys;
mod logprobs;
pub mod openai;
mod params;
mod response;
mod state;
pub mod stop;
mod structured;
mod tenancy;
mod tools;

use std::future::Future;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use tokio::net::TcpListener;

pub use crate::metrics::{EngineMetrics, RequestOutcomeLabels};
use crate::EngineError;
use kvfabric_tenants::http::gate;
pub use openai::ApiError;
pub use state::HttpState;

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
    // Block keys of a body (for a prefix-aware router): authenticated, not admitted.
    let keys = Router::new()
        .route(keys::CHAT_KEYS_PATH, post(keys::chat_keys))
        .route(keys::COMPLETION_KEYS_PATH, post(keys::completion_keys))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            keys::authenticate,
        ));
    Router::new()
        .merge(v1)
        .merge(keys)
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
