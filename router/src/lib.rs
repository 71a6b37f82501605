//! kvfabric-router: an OpenAI-compatible front for a fleet of engines.
//!
//! Why a router: with disaggregated serving, prefill (compute-bound, whole
//! prompt at once) and decode (memory-bound, one token per step) run on
//! different engines so neither stalls the other. Something must send each
//! request to a prefill engine first, then to a decode engine, and pick
//! both by load. Load is counted in tokens, not requests, because one long
//! prompt costs as much as many short ones.
//!
//! Two modes, chosen by which endpoint lists [`RouterConfig`] sets:
//! - **disaggregated** (`prefill` + `decode`): two hops per request, see
//!   `disagg.rs`; the KV moves between the engines through the fabric, keyed
//!   by block keys the prefill answer reports in `kv_transfer_params`.
//! - **plain** (`engines`): one hop to one engine, picked by the policy.
//!
//! Map: `config.rs` (settings, mode), `request.rs` (body checks, token
//! estimates, hop bodies, forwarded headers), `pick.rs` (the policies as pure
//! functions, shared with `kvfabric bench agentic`), `balance.rs` (in-flight
//! tokens and sessions per endpoint set), `state.rs` (shared state),
//! `proxy.rs` (HTTP client, relaying answers), `rewrite.rs` (cached-token
//! rewrite, SSE event by event), `disagg.rs` (two hops), `server.rs` (routes),
//! `metrics.rs`, `error.rs`; for `policy = "prefix"`, `prefix.rs` (a
//! request's block keys from an engine, matched against the index) and
//! `kv_events.rs` (the nodes' KV event streams feeding that index).
//! docs/ROUTER.md is the user-facing description.

mod balance;
mod config;
mod disagg;
mod error;
mod kv_events;
mod metrics;
pub mod pick;
mod pick_params;
mod pick_prefix;
mod prefix;
mod proxy;
mod request;
mod rewrite;
mod server;
mod state;
mod tenancy;

use std::future::Future;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
pub use tonic::transport::ClientTlsConfig;

pub use config::{Mode, Policy, RouterConfig};
pub use error::{AnswerProblem, ApiError, ConfigProblem, Hop, RouterError, UrlProblem};
pub use metrics::{EndpointLabels, RequestLabels, RouteLabels, RouterMetrics, UpstreamErrorLabels};
pub use request::{estimate_text_tokens, DEFAULT_COMPLETION_ESTIMATE, SESSION_AFFINITY_HEADER};

/// Serve the router on `listener` until `shutdown` resolves (in-flight
/// requests finish first). `cfg.listen` is not used: the caller binds.
/// Fails at once on an invalid config.
pub async fn serve(
    cfg: RouterConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RouterError> {
    let metrics = RouterMetrics::new();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    serve_with_metrics(cfg, listener, metrics, registry, None, shutdown).await
}

/// [`serve`] whose KV event subscriptions (`policy = "prefix"`) present
/// `tls` to the nodes (a secured cluster's client certificate; the binary
/// builds it from `[cluster.security]` as `kvfabric ctl` does).
pub async fn serve_secured(
    cfg: RouterConfig,
    listener: TcpListener,
    tls: Option<ClientTlsConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RouterError> {
    let metrics = RouterMetrics::new();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    serve_with_metrics(cfg, listener, metrics, registry, tls, shutdown).await
}

/// [`serve_secured`] with metrics the caller holds; `metrics` must already
/// be registered in `registry`, which `GET /metrics` encodes.
pub async fn serve_with_metrics(
    cfg: RouterConfig,
    listener: TcpListener,
    metrics: RouterMetrics,
    registry: Registry,
    tls: Option<ClientTlsConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RouterError> {
    let state = state::RouterState::new(&cfg, metrics, registry, tls)?;
    let addr = listener.local_addr()?;
    tracing::info!(
        %addr,
        mode = state.mode_label,
        policy = %cfg.policy,
        "kvfabric router listening"
    );
    axum::serve(listener, server::app(Arc::new(state)))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(RouterError::Io)
}
