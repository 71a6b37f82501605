//! The router's HTTP front (axum): routes, shared state, plain-mode proxying.
//!
//! `POST /v1/completions` and `/v1/chat/completions` are checked just enough
//! to route ([`ClientRequest::parse`]) and then go either through the two-hop
//! path (`disagg.rs`) or, in plain mode, one hop to one engine. `GET
//! /v1/models` is forwarded to the first engine that answers; `/health` and
//! `/metrics` are the router's own. `/v1/*` passes the tenant gate first
//! (`tenancy.rs`); the client's `Authorization` goes on to the engines.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;

use crate::balance::EndpointSet;
use crate::disagg;
use crate::error::ApiError;
use crate::proxy::{Relay, RequestRecord};
use crate::request::{Api, ClientRequest, HopHeaders};
use crate::state::{RouterState, Routing};
use kvfabric_tenants::http::gate;

/// Every route over `state`.
pub(crate) fn app(state: Arc<RouterState>) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            gate::<RouterState>,
        ));
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .with_state(state)
}

async fn chat_completions(
    State(state): State<Arc<RouterState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(&state, Api::Chat, &headers, body).await
}

async fn completions(
    State(state): State<Arc<RouterState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(&state, Api::Completion, &headers, body).await
}

async fn handle(
    state: &RouterState,
    api: Api,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let mut record = RequestRecord::new(state.metrics.clone(), state.mode_label, api.path());
    let parsed = body
        .map_err(|e| {
            let mut err = ApiError::invalid(format!("could not read the request body: {e}"), None);
            err.status = e.status();
            err
        })
        .and_then(|b| ClientRequest::parse(api, &b));
    let mut req = match parsed {
        Ok(req) => req,
        Err(e) => {
            record.set("client_error");
            return e.into_response();
        }
    };
    req.headers = HopHeaders::of(headers);
    match &state.routing {
        Routing::Disaggregated { prefill, decode } => {
            disagg::two_hop(state, prefill, decode, req, record).await
        }
        Routing::Plain { engines } => plain(state, engines, req, record).await,
    }
}

/// Plain mode: one engine runs the whole request; its answer passes through.
async fn plain(
    state: &RouterState,
    engines: &EndpointSet,
    req: ClientRequest,
    record: RequestRecord,
) -> Response {
    let load = state.pick(engines, req.decode_tokens(), &req).await;
    let endpoint = load.url().to_owned();
    let relay = Relay {
        metrics: state.metrics.clone(),
        hop: "plain",
        cached_tokens: None,
        ok_outcome: "ok",
        record,
        load,
    };
    match state
        .upstream
        .send(
            Method::POST,
            &endpoint,
            req.api.path(),
            req.original_body(),
            &req.headers,
        )
        .await
    {
        Ok(answer) => relay.answer(answer).await,
        Err(e) => relay.fail(e),
    }
}

/// The model list of the first engine that answers (decode engines first in
/// disaggregated mode: they are the ones that generate).
async fn models(State(state): State<Arc<RouterState>>, headers: HeaderMap) -> Response {
    let auth = HopHeaders {
        authorization: headers.get(header::AUTHORIZATION).cloned(),
        session: None,
    };
    let urls: Vec<&str> = match &state.routing {
        Routing::Disaggregated { prefill, decode } => decode.urls().chain(prefill.urls()).collect(),
        Routing::Plain { engines } => engines.urls().collect(),
    };
    let mut last_error = None;
    for url in urls {
        let result = match state
            .upstream
            .send(Method::GET, url, "/v1/models", Vec::new(), &auth)
            .await
        {
            Ok(answer) => answer.collect().await,
            Err(e) => Err(e),
        };
        match result {
            Ok(c) if !c.status.is_server_error() => return c.into_response(),
            Ok(c) => last_error = Some(c.status_error()),
            Err(e) => last_error = Some(e),
        }
        if let Some(e) = &last_error {
            state
                .metrics
                .upstream_error(url, "models", e.upstream_kind());
        }
    }
    let message = last_error.map_or_else(|| "no engines".to_owned(), |e| e.to_string());
    ApiError::bad_gateway(message).into_response()
}

async fn health(State(state): State<Arc<RouterState>>) -> Response {
    axum::Json(json!({"status": "ok", "mode": state.mode_label})).into_response()
}

async fn metrics_text(State(state): State<Arc<RouterState>>) -> Response {
    let mut body = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        let mut err = ApiError::bad_gateway(format!("encoding metrics: {e}"));
        err.status = StatusCode::INTERNAL_SERVER_ERROR;
        return err.into_response();
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
    let mut err = ApiError::invalid(format!("no route for {}", uri.path()), None);
    err.status = StatusCode::NOT_FOUND;
    err.into_response()
}
