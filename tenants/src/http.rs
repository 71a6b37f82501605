//! The tenant gate as axum middleware, for every API that serves `/v1/*`
//! (the engine's and the router's): the API key names the tenant (401 when
//! it is missing or unknown), the tenant's limits admit the request or
//! refuse it (429 with `Retry-After`), and the tenant's [`Identity`] rides
//! in the request's extensions to the handler, which keys the request's
//! blocks under its namespace. The admission is held until the response
//! body has been sent (or dropped), so a streamed answer occupies its
//! concurrency slot for as long as it streams.
//!
//! The rules (file, keys, limits, status and error codes) are this crate's;
//! an API supplies only its state and its error body, through [`GateState`].
//! Behind the `axum` feature, so that users of the rules alone do not link
//! a web framework.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use crate::gate::{Denied, Identity, TenantGate};

/// A refusal in the terms of an OpenAI-style error body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
    /// `invalid_request_error` (401) or `requests` (429).
    pub kind: &'static str,
    /// `invalid_api_key`, `rate_limit_exceeded` or `concurrency_limit_exceeded`.
    pub code: &'static str,
}

impl From<&Denied> for Refusal {
    fn from(d: &Denied) -> Refusal {
        let (kind, code) = d.openai_type_and_code();
        Refusal {
            status: StatusCode::from_u16(d.http_status()).unwrap_or(StatusCode::UNAUTHORIZED),
            message: d.message(),
            kind,
            code,
        }
    }
}

/// What an API's state gives the gate: its tenants, and the error type
/// whose response carries a refusal.
pub trait GateState: Send + Sync + 'static {
    /// The API's error, built from a refusal.
    type Error: From<Refusal> + IntoResponse;

    /// The tenants this API serves.
    fn tenant_gate(&self) -> &TenantGate;
}

/// Authenticate, admit (POSTs: completions only), then run the handler.
pub async fn gate<S: GateState>(
    State(state): State<Arc<S>>,
    mut req: Request,
    next: Next,
) -> Response {
    let tenants = state.tenant_gate();
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or(""));
    let who: Identity = match tenants.authenticate(auth) {
        Ok(who) => who,
        Err(d) => return denied::<S::Error>(&d),
    };
    let admission = if req.method() == Method::POST {
        match tenants.admit(&who) {
            Ok(a) => Some(a),
            Err(d) => return denied::<S::Error>(&d),
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

/// The API error `E` of a refusal, with `Retry-After` on a 429 and
/// `WWW-Authenticate` on a 401.
pub fn denied<E: From<Refusal> + IntoResponse>(d: &Denied) -> Response {
    let mut response = E::from(Refusal::from(d)).into_response();
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::limits::Over;

    /// A test API's error body: the status and the refusal's code.
    struct Body(Refusal);

    impl From<Refusal> for Body {
        fn from(r: Refusal) -> Body {
            Body(r)
        }
    }

    impl IntoResponse for Body {
        fn into_response(self) -> Response {
            (self.0.status, self.0.code).into_response()
        }
    }

    #[test]
    fn a_401_asks_for_a_bearer_key_and_a_429_says_when_to_retry() {
        let r = denied::<Body>(&Denied::Unauthenticated { reason: "no key" });
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(r.headers()[header::WWW_AUTHENTICATE], "Bearer");
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
        let limited = Denied::Limited {
            tenant: "acme".into(),
            over: Over::Rate {
                retry_after: Duration::from_millis(1500),
            },
        };
        let r = denied::<Body>(&limited);
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        assert_eq!(Refusal::from(&limited).code, "rate_limit_exceeded");
    }
}
