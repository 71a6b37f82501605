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
    /// Invalid settings (refused at startup): which, and why.
    #[error("router config: {0}")]
    Config(ConfigProblem),
    /// Socket errors of the listener.
    #[error("router I/O: {0}")]
    Io(#[from] std::io::Error),
    /// No TCP connection, or the connection broke before the whole answer
    /// (`hop` says when): the HTTP client's error. The message spells out
    /// the error's whole chain (the client's own text is only "client
    /// error (Connect)").
    #[error("engine {endpoint} unreachable: {}", unreachable(*hop, source.as_ref()))]
    Connect {
        endpoint: String,
        hop: Hop,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The hop took longer than `request_timeout_ms`.
    #[error("engine {endpoint} did not answer within {timeout_ms} ms")]
    Timeout { endpoint: String, timeout_ms: u64 },
    /// The engine answered with a 5xx status; `message` is the engine's
    /// own (its `error.message`, else the start of its body), as it sent it.
    #[error("engine {endpoint} answered {status}: {message}")]
    Status {
        endpoint: String,
        status: StatusCode,
        message: String,
    },
    /// The answer could not be read or is not what an engine sends.
    #[error("engine {endpoint} sent an unusable answer: {problem}")]
    BadAnswer {
        endpoint: String,
        #[source]
        problem: AnswerProblem,
    },
    /// The tenants file could not be loaded at start.
    #[error("tenants: {0}")]
    Tenants(#[from] kvfabric_tenants::TenantsError),
}

/// When a hop to an engine broke ([`RouterError::Connect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    /// Sending the request (connecting included).
    Request,
    /// Reading the whole answer.
    Answer,
    /// Passing a streamed answer through.
    Stream,
}

/// [`RouterError::Connect`]'s message: where the hop broke and the error's
/// whole chain.
fn unreachable(hop: Hop, e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = match hop {
        Hop::Request => String::new(),
        Hop::Answer => "reading the answer: ".to_owned(),
        Hop::Stream => "stream broke: ".to_owned(),
    };
    s.push_str(&e.to_string());
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// What is wrong with an engine's answer ([`RouterError::BadAnswer`]).
#[derive(Debug, thiserror::Error)]
pub enum AnswerProblem {
    /// The request to `uri` could not be built (a header the client sent
    /// that HTTP does not allow).
    #[error("building the request to {uri}: {source}")]
    Request {
        uri: String,
        #[source]
        source: axum::http::Error,
    },
    /// The `what` (`answer`, `prefill answer`, `keys answer`) is not JSON.
    #[error("the {what} is not JSON: {source}")]
    NotJson {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// A keys answer without a positive `block_tokens`.
    #[error("no block_tokens")]
    NoBlockTokens,
    /// A keys answer without a `block_keys` array.
    #[error("no block_keys")]
    NoBlockKeys,
    /// A block key that is not 64 hex digits.
    #[error("a key is not 64 hex digits")]
    BadKey,
}

/// A setting the router cannot run with ([`RouterError::Config`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigProblem {
    /// A `policy` that is none of the four.
    #[error(
        "policy must be \"least-loaded\", \"random\", \"affinity\" or \"prefix\", not {policy:?}"
    )]
    Policy { policy: String },
    /// `key` is not a finite number of at least `min`.
    #[error("{key} must be a number >= {min}")]
    Below { key: &'static str, min: u8 },
    /// `key` is 0.
    #[error("{key} must be > 0")]
    Zero { key: &'static str },
    /// A `url` in `field` (`engines`, `prefill`, `decode`, `engine_nodes`)
    /// that is not an engine's base URL.
    #[error("{field}: {url:?}: {why}")]
    Url {
        field: &'static str,
        url: String,
        why: UrlProblem,
    },
    /// A `url` listed twice in `field`.
    #[error("{field}: {url:?} is listed twice")]
    Duplicate { field: &'static str, url: String },
    /// No endpoint list is set.
    #[error("no endpoints: set prefill and decode (disaggregated) or engines (plain)")]
    NoEndpoints,
    /// `engines` together with `prefill` or `decode`.
    #[error("engines (plain mode) cannot be combined with prefill/decode (disaggregated mode)")]
    MixedModes,
    /// One of `prefill` and `decode` without the other (`set` is set,
    /// `empty` is not).
    #[error("{set} is set but {empty} is empty")]
    HalfDisaggregated {
        set: &'static str,
        empty: &'static str,
    },
    /// More engines in one set than the prefix policy routes (`max`).
    #[error("policy \"prefix\" routes at most {max} engines per set")]
    PrefixSetTooLarge { max: usize },
    /// An `engine_nodes` entry for a `url` that is no engine of any set.
    #[error("engine_nodes: {url:?} is not one of the engines, prefill or decode engines")]
    UnknownEngine { url: String },
    /// An `engine_nodes` entry whose `node` is not a gRPC `host:port`.
    #[error("engine_nodes: {url:?}: give the node's gRPC address as host:port, not {node:?}")]
    NodeAddress { url: String, node: String },
}

/// Why a URL is not an engine's base URL ([`ConfigProblem::Url`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    #[error("not a URL like http://127.0.0.1:8001")]
    NotAUrl,
    #[error("only http:// engines are supported")]
    NotHttp,
    #[error("the URL has no host")]
    NoHost,
    #[error("give the engine's base URL, without a path")]
    HasPath,
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
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let c = RouterError::Connect {
            endpoint: "http://a:1".into(),
            hop: Hop::Answer,
            source: Box::new(refused),
        };
        assert_eq!(c.upstream_kind(), "connect");
        assert_eq!(
            c.to_string(),
            "engine http://a:1 unreachable: reading the answer: connection refused"
        );
    }
}
