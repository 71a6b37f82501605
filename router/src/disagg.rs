//! The disaggregated two-hop request: prefill on one engine, decode on another.
//!
//! Under `policy = "prefix"` the request's block keys are asked of a prefill
//! engine once, before both hops.
//!
//! 1. Prefill: the prefill engine the policy picks (least-loaded: by
//!    in-flight prompt tokens; prefix: the longest cached prefix against
//!    that load) gets the body with `max_tokens: 1`, `stream: false` and
//!    `kv_transfer_params: {"do_remote_decode": true}`. It computes the
//!    prompt, saves its KV blocks into the fabric and answers with
//!    `kv_transfer_params` (holder, block keys) and its cached-token count.
//! 2. Decode: the decode engine the policy picks (by in-flight prompt +
//!    completion tokens; `prefix` with decode engines in `engine_nodes`:
//!    the one whose node holds the most of the prompt against that load,
//!    least-loaded without them) gets the client's original body plus that
//!    `kv_transfer_params`. It finds the saved blocks in the fabric by
//!    itself and generates; its answer goes back to the client as it
//!    arrives, with `cached_tokens` set to the prefill side's count.
//!
//! A failed prefill hop (no connection, 5xx, timeout, unusable answer) is
//! logged and counted, and the request goes straight to decode, which then
//! computes the prompt itself: slower, but the client still gets its answer.
//! A 4xx from prefill is the client's fault and is returned as is. A failed
//! decode hop is a 502.

use axum::http::Method;
use axum::response::Response;
use serde_json::Value;

use crate::balance::EndpointSet;
use crate::error::{AnswerProblem, RouterError};
use crate::prefix::RequestKeys;
use crate::proxy::{Relay, RequestRecord};
use crate::request::ClientRequest;
use crate::state::{RouterState, Stage};

/// What the prefill hop produced.
#[derive(Debug)]
enum Prefilled {
    /// Prompt computed: hand these to decode.
    Done {
        transfer: Option<Value>,
        cached_tokens: Option<u64>,
    },
    /// The engine refused the request (4xx): answer the client with it.
    Refused(Response),
    /// The hop failed: decode recomputes the prompt.
    Failed,
}

/// Serve `req` in two hops.
pub(crate) async fn two_hop(
    state: &RouterState,
    prefill: &EndpointSet,
    decode: &EndpointSet,
    req: ClientRequest,
    mut record: RequestRecord,
) -> Response {
    let keys = state.request_keys(prefill, &req).await;
    let prefilled = prefill_hop(state, prefill, &req, keys.as_ref()).await;
    let (transfer, cached_tokens, ok_outcome) = match prefilled {
        Prefilled::Done {
            transfer,
            cached_tokens,
        } => (transfer, cached_tokens, "ok"),
        Prefilled::Refused(response) => {
            record.set("client_error");
            return response;
        }
        Prefilled::Failed => (None, None, "fallback"),
    };
    let load = state.pick_keyed(
        decode,
        Stage::Decode,
        req.decode_tokens(),
        &req,
        keys.as_ref(),
    );
    let endpoint = load.url().to_owned();
    let relay = Relay {
        metrics: state.metrics.clone(),
        hop: "decode",
        cached_tokens,
        ok_outcome,
        record,
        load,
    };
    let body = req.decode_body(transfer.as_ref());
    match state
        .upstream
        .send(Method::POST, &endpoint, req.api.path(), body, &req.headers)
        .await
    {
        Ok(answer) => relay.answer(answer).await,
        Err(e) => relay.fail(e),
    }
}

async fn prefill_hop(
    state: &RouterState,
    prefill: &EndpointSet,
    req: &ClientRequest,
    keys: Option<&RequestKeys>,
) -> Prefilled {
    let load = state.pick_keyed(prefill, Stage::Prefill, req.prompt_tokens, req, keys);
    let endpoint = load.url().to_owned();
    let result = prefill_exchange(state, &endpoint, req).await;
    drop(load);
    match result {
        Ok(done) => done,
        Err(e) => {
            tracing::warn!(
                error = %e,
                "prefill hop failed; sending the request straight to decode (it recomputes the prompt)"
            );
            state
                .metrics
                .upstream_error(&endpoint, "prefill", e.upstream_kind());
            state.metrics.prefill_fallbacks.inc();
            Prefilled::Failed
        }
    }
}

async fn prefill_exchange(
    state: &RouterState,
    endpoint: &str,
    req: &ClientRequest,
) -> Result<Prefilled, RouterError> {
    let answer = state
        .upstream
        .send(
            Method::POST,
            endpoint,
            req.api.path(),
            req.prefill_body(),
            &req.headers,
        )
        .await?;
    let collected = answer.collect().await?;
    if collected.status.is_server_error() {
        return Err(collected.status_error());
    }
    if !collected.status.is_success() {
        return Ok(Prefilled::Refused(collected.into_response()));
    }
    let v: Value =
        serde_json::from_slice(&collected.bytes).map_err(|source| RouterError::BadAnswer {
            endpoint: endpoint.to_owned(),
            problem: AnswerProblem::NotJson {
                what: "prefill answer",
                source,
            },
        })?;
    let transfer = v
        .get("kv_transfer_params")
        .filter(|t| t.is_object())
        .cloned();
    let cached_tokens = v
        .pointer("/usage/prompt_tokens_details/cached_tokens")
        .and_then(Value::as_u64)
        .or_else(|| transfer.as_ref()?.get("cached_tokens")?.as_u64());
    tracing::debug!(
        %endpoint,
        blocks = transfer.as_ref().and_then(|t| t.get("block_keys")?.as_array().map(Vec::len)),
        cached_tokens,
        "prefill done"
    );
    Ok(Prefilled::Done {
        transfer,
        cached_tokens,
    })
}
