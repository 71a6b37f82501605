//! The HTTP port's gate. With a tenants file, `/metrics`, the console and
//! its API show every tenant's names and traffic, so they answer operators
//! only: a `trusted` tenant's key, as `Authorization: Bearer <key>`
//! (Prometheus' scrape `authorization` setting) or as the password of HTTP
//! Basic auth (what a browser prompts for). No key or an unknown one: 401
//! with `WWW-Authenticate: Basic`; a key of a tenant that is not trusted:
//! 403. Both with an OpenAI-style JSON error body. `/health` stays open.
//! Without a tenants file nothing is checked; the port listens on loopback
//! unless `http_listen` says otherwise (docs/CONFIG.md).

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use kvfabric_tenants::TenantGate;

/// The key an `Authorization` value carries: `Bearer <key>` as is, `Basic
/// base64(user:key)` as its password.
fn presented_key(auth: &str) -> Option<String> {
    if let Some(b) = auth.strip_prefix("Basic ") {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b.trim())
            .ok()?;
        let text = String::from_utf8(raw).ok()?;
        return text.split_once(':').map(|(_, key)| key.to_string());
    }
    Some(auth.strip_prefix("Bearer ")?.trim().to_string())
}

fn refuse(status: StatusCode, message: &str, code: &str) -> Response {
    let body = serde_json::json!({
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "code": code,
        }
    });
    let mut r = (status, axum::Json(body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Basic realm=\"kvfabric operators\""),
        );
    }
    r
}

/// Middleware: pass operators (trusted tenants) and `/health`; refuse the rest.
pub async fn require_operator(
    State(gate): State<TenantGate>,
    req: Request,
    next: Next,
) -> Response {
    if !gate.enabled() || req.uri().path() == "/health" {
        return next.run(req).await;
    }
    let key = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(presented_key);
    let bearer = key.map(|k| format!("Bearer {k}"));
    match gate.authenticate(bearer.as_deref()) {
        Ok(who) if who.tenant().is_some_and(|t| t.trusted) => next.run(req).await,
        Ok(who) => refuse(
            StatusCode::FORBIDDEN,
            &format!(
                "tenant {} is not an operator: metrics and the console need a trusted tenant's key",
                who.label()
            ),
            "operator_required",
        ),
        Err(d) => refuse(StatusCode::UNAUTHORIZED, &d.message(), "invalid_api_key"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_and_basic_carry_the_key() {
        assert_eq!(presented_key("Bearer k-1").as_deref(), Some("k-1"));
        let basic = base64::engine::general_purpose::STANDARD.encode("ops:k-2");
        assert_eq!(
            presented_key(&format!("Basic {basic}")).as_deref(),
            Some("k-2")
        );
        assert_eq!(presented_key("Basic !!"), None);
        assert_eq!(presented_key("Token x"), None);
    }
}
