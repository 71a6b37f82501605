//! The router's error enum and the OpenAI-style error body it answers with.
//!
//! [`RouterError`] covers startup (config, socket) and upstream failures; an
//! upstream failure is classified by [`RouterError::upstream_kind`] for the
//! `upstream_errors` metric and decides whether the prefill hop falls back.
//! [`ApiError`] is what a client sees: the same `{"error": {...}}` shape the
//! engine answers with, so clients handle router and engine errors alike.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Everything that can fail in the router.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// Invalid settings (refused at startup).
    #[error("{0}")]
    Config(String),
    /// Socket errors of the listener.
    #[error("router I/O: {0}")]
    Io(#[from] std::io::Error),
    /// No TCP connection / the connection broke before an answer.
    #[error("engine {endpoint} unreachable: {message}")]
    Connect { endpoint: String, message: String },
    /// The hop took longer than `request_timeout_ms`.
    #[error("engine {endpoint} did not answer within {timeout_ms} ms")]
    Timeout { endpoint: String, timeout_ms: u64 },
    /// The engine answered with a 5xx status.
    #[error("engine {endpoint} answered {status}: {message}")]
    Status {
        endpoint: String,
        status: StatusCode,
        message: String,
    },
    /// The answer could not be read or is not what an engine sends.
    #[error("engine {endpoint} sent an unusable answer: {message}")]
    BadAnswer { endpoint: String, message: String },
    /// The tenants file could not be loaded at start.
    #[error("tenants: {0}")]
    Tenants(#[from] kvfabric_tenants::TenantsError),
}

impl RouterError {
    /// The `kind` label of `upstream_errors`: `connect`, `timeout`, `status`,
    /// `bad_answer` (`other` for startup errors, which never reach it).
    pub fn upstream_kind(&self) -> &'static str {
        match self {
            RouterError::Connect { .. } => "connect",
            RouterError::Timeout { .. } => "timeout",
            RouterError::Status { .. } => "status",
            RouterError::BadAnswer { .. } => "bad_answer",
            RouterError::Config(_) | RouterError::Io(_) | RouterError::Tenants(_) => "other",
        }
    }
}

/// An OpenAI-style error response (same shape as the engine's).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// `invalid_request_error` or `server_error`.
    pub kind: &'static str,
    pub param: Option<String>,
    /// Machine-readable code (`invalid_api_key`, `rate_limit_exceeded`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 invalid_request_error about `param`.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_owned),
            code: None,
        }
    }

    /// 502 server_error: the engine behind the router failed.
    pub fn bad_gateway(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_GATEWAY,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The `{"error": {...}}` body.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_has_the_engine_shape() {
        let e = ApiError::bad_gateway("decode engine down");
        assert_eq!(e.status, StatusCode::BAD_GATEWAY);
        let b = e.body();
        assert_eq!(b["error"]["message"], "decode engine down");
        assert_eq!(b["error"]["type"], "server_error");
        let e = ApiError::invalid("prompt is required", Some("prompt"));
        assert_eq!(e.body()["error"]["param"], "prompt");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn upstream_kinds_label_the_failure() {
        let t = RouterError::Timeout {
            endpoint: "http://a:1".into(),
            timeout_ms: 5,
        };
        assert_eq!(t.upstream_kind(), "timeout");
        let c = RouterError::Connect {
            endpoint: "http://a:1".into(),
            message: "refused".into(),
        };
        assert_eq!(c.upstream_kind(), "connect");
    }
}
