//! `POST /v1/kvfabric/keys/chat/completions` and
//! `POST /v1/kvfabric/keys/completions`: the block keys of a request body,
//! as this engine would compute them, without running it.
//!
//! Why: a prefix-aware router (`kvfabric router`, `policy = "prefix"`)
//! matches a request's block keys against the blocks each engine's node
//! reports in its KV events, but has neither the chat template, the
//! tokenizer, the model fingerprint nor the KV layout that name those blocks.
//! The engine has all four, so it answers for it. The body is checked by the
//! same code as the completion endpoints (`completions::check`: every
//! rejection is the same OpenAI-style 4xx, a `json_schema` is compiled as
//! there), the prompt is rendered and tokenized the same way, and the keys
//! come from the scheduler's own [`crate::request::KeyBasis`] under the
//! caller's namespace (tenant, `cache_salt`): exactly the keys the engine
//! looks up and saves for that body.
//!
//! The answer lists the keys of the prompt's full blocks, in chain order, as
//! lower-case hex (the `BlockKey` bytes, as in `kv_transfer_params`). The
//! call is authenticated like `/v1/*` (a tenant's key picks its namespace)
//! but is not admitted against the tenant's request limits: it generates
//! nothing, and the completion that follows is admitted as usual.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kvfabric_tenants::http::denied;
use kvfabric_tenants::Identity;
use serde_json::json;

use super::completions::check;
use super::openai::ApiError;
use super::response::Api;
use super::state::HttpState;
use super::structured;

/// The keys route of the chat API.
pub(super) const CHAT_KEYS_PATH: &str = "/v1/kvfabric/keys/chat/completions";
/// The keys route of the completions API.
pub(super) const COMPLETION_KEYS_PATH: &str = "/v1/kvfabric/keys/completions";

pub(super) async fn chat_keys(
    State(state): State<Arc<HttpState>>,
    Extension(who): Extension<Identity>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    keys(&state, &who, body, Api::Chat).await
}

pub(super) async fn completion_keys(
    State(state): State<Arc<HttpState>>,
    Extension(who): Extension<Identity>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    keys(&state, &who, body, Api::Completion).await
}

/// Authenticate the caller (401 as `/v1/*`), without taking a request slot.
pub(super) async fn authenticate(
    State(state): State<Arc<HttpState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or(""));
    match state.tenants.authenticate(auth) {
        Ok(who) => {
            req.extensions_mut().insert(who);
            next.run(req).await
        }
        Err(d) => denied::<ApiError>(&d),
    }
}

async fn keys(
    state: &HttpState,
    who: &Identity,
    body: Result<Bytes, BytesRejection>,
    api: Api,
) -> Response {
    match answer(state, who, body, api).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(status = %e.status, message = %e.message, "keys request rejected");
            e.into_response()
        }
    }
}

async fn answer(
    state: &HttpState,
    who: &Identity,
    body: Result<Bytes, BytesRejection>,
    api: Api,
) -> Result<Response, ApiError> {
    let basis = *state.engine.key_basis().ok_or_else(|| {
        ApiError::server(
            StatusCode::NOT_IMPLEMENTED,
            "this engine does not key its blocks (no scheduler behind it)",
        )
    })?;
    let checked = check(state, who, body, api, "keys", Instant::now())?;
    if let Some(w) = checked.wanted {
        // A schema the completion would refuse is refused here too.
        structured::compile(&state.grammars, w).await?;
    }
    let plan = checked.plan;
    let chain = basis.chain(&plan.namespace);
    let bt = chain.block_tokens();
    let full = plan.prompt.len() / bt;
    let keys: Vec<String> = chain
        .keys(&plan.prompt[..full * bt])
        .iter()
        .map(|k| k.to_hex())
        .collect();
    Ok(axum::Json(json!({
        "object": "kvfabric.block_keys",
        "model": state.model_name,
        "prompt_tokens": plan.prompt.len(),
        "block_tokens": bt,
        "block_keys": keys,
    }))
    .into_response())
}
