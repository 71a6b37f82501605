//! The router's tenant gate in front of `/v1/*`: the API key names the tenant
//! (401 when it is missing or unknown), the tenant's limits admit the
//! request or refuse it (429 with `Retry-After`), and the tenant's
//! [`Identity`] rides in the request's extensions to the handler, which
//! keys the request's blocks under its namespace. The admission is held
//! until the response body has been sent (or dropped), so a streamed answer
//! occupies its concurrency slot for as long as it streams.
//!
//! The rules themselves (file, keys, limits, status and error codes) are
//! `kvfabric-tenants`'; this module only maps them onto axum. The engine's
//! API has the same module (`engine/src/http/tenancy.rs`) over its own state.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use kvfabric_tenants::{Denied, Identity};

use crate::error::ApiError;
use crate::server::RouterState;

/// Authenticate, admit (completions only), then run the handler.
pub(crate) async fn gate(
    State(state): State<Arc<RouterState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or(""));
    let who: Identity = match state.tenants.authenticate(auth) {
        Ok(who) => who,
        Err(d) => return denied(&d),
    };
    let admission = if req.method() == Method::POST {
        match state.tenants.admit(&who) {
            Ok(a) => Some(a),
            Err(d) => return denied(&d),
        }
    } else {
        None
    };
    req.extensions_mut().insert(who);
    let response = next.run(req).await;
    match admission {
        // The body owns the admission: the slot frees when it ends or drops.
        Some(admission) => response.map(|body| {
            Body::from_stream(body.into_data_stream().map(move |chunk| {
                let _held = &admission;
                chunk
            }))
        }),
        None => response,
    }
}

/// The OpenAI-style error of a refusal (`Retry-After` on a 429,
/// `WWW-Authenticate` on a 401).
pub(crate) fn denied(d: &Denied) -> Response {
    let (kind, code) = d.openai_type_and_code();
    let err = ApiError {
        status: StatusCode::from_u16(d.http_status()).unwrap_or(StatusCode::UNAUTHORIZED),
        message: d.message(),
        kind,
        param: None,
        code: Some(code),
    };
    let mut response = err.into_response();
    let headers = response.headers_mut();
    match d.retry_after_secs() {
        Some(secs) => {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        None => {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
    }
    response
}
