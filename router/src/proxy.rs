//! Talking to engines: the pooled HTTP client, per-hop timeouts, and relaying
//! an engine's answer to the client.
//!
//! Client choice: hyper 1 + hyper-util's pooled (legacy) client. Engines
//! speak plain HTTP/1.1 on the cluster network, so a TLS-capable client
//! (reqwest) would only add a stack to compile; hyper/hyper-util are already
//! in the build (axum, tonic, the engine's tests), and their body type lets
//! the router forward an SSE stream frame by frame as it arrives.
//!
//! Every hop gets `request_timeout_ms` from sending the request to the last
//! body byte, and `connect_timeout_ms` to open the TCP connection.
//! [`RequestRecord`] counts a client request exactly once, whatever path it
//! leaves by, and [`Relay`] hands the answer back: 4xx as is, 5xx as a 502
//! error body, 2xx JSON (optionally with the prefill side's cached-token
//! count) or an SSE stream passed through event by event.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, HeaderValue, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::balance::LoadGuard;
use crate::error::{AnswerProblem, ApiError, Hop, RouterError};
use crate::metrics::{RequestLabels, RouteLabels, RouterMetrics};
use crate::request::{HopHeaders, SESSION_AFFINITY_HEADER};
use crate::rewrite::{replace_cached_tokens, SseRewriter};

/// The HTTP client to engines.
#[derive(Clone, Debug)]
pub(crate) struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

/// An engine's answer whose body has not been read yet.
#[derive(Debug)]
pub(crate) struct Answer {
    pub endpoint: String,
    pub status: StatusCode,
    content_type: Option<HeaderValue>,
    body: Incoming,
    deadline: tokio::time::Instant,
    timeout: Duration,
}

impl Upstream {
    pub fn new(connect_timeout: Duration, timeout: Duration) -> Upstream {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Upstream { client, timeout }
    }

    /// Send one request (with the client's `Authorization` and
    /// `x-session-affinity`, if any); returns once the response head arrived.
    pub async fn send(
        &self,
        method: Method,
        endpoint: &str,
        path: &str,
        body: Vec<u8>,
        headers: &HopHeaders,
    ) -> Result<Answer, RouterError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let uri = format!("{endpoint}{path}");
        let mut request = Request::builder()
            .method(method)
            .uri(&uri)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(auth) = &headers.authorization {
            // The engine checks the same key and keys the blocks under its tenant.
            request = request.header(header::AUTHORIZATION, auth.clone());
        }
        if let Some(session) = &headers.session {
            request = request.header(SESSION_AFFINITY_HEADER, session.clone());
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|source| RouterError::BadAnswer {
                endpoint: endpoint.to_owned(),
                problem: AnswerProblem::Request {
                    uri: uri.clone(),
                    source,
                },
            })?;
        let response = tokio::time::timeout_at(deadline, self.client.request(request))
            .await
            .map_err(|_| self.timed_out(endpoint))?
            .map_err(|e| RouterError::Connect {
                endpoint: endpoint.to_owned(),
                hop: Hop::Request,
                source: Box::new(e),
            })?;
        let (parts, body) = response.into_parts();
        Ok(Answer {
            endpoint: endpoint.to_owned(),
            status: parts.status,
            content_type: parts.headers.get(header::CONTENT_TYPE).cloned(),
            body,
            deadline,
            timeout: self.timeout,
        })
    }

    fn timed_out(&self, endpoint: &str) -> RouterError {
        RouterError::Timeout {
            endpoint: endpoint.to_owned(),
            timeout_ms: self.timeout.as_millis() as u64,
        }
    }
}

impl Answer {
    /// True for `text/event-stream` answers.
    pub fn is_event_stream(&self) -> bool {
        self.content_type
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"))
    }

    /// Read the whole body within the hop's deadline.
    pub async fn collect(self) -> Result<Collected, RouterError> {
        let endpoint = self.endpoint;
        let bytes = tokio::time::timeout_at(self.deadline, self.body.collect())
            .await
            .map_err(|_| RouterError::Timeout {
                endpoint: endpoint.clone(),
                timeout_ms: self.timeout.as_millis() as u64,
            })?
            .map_err(|e| RouterError::Connect {
                endpoint: endpoint.clone(),
                hop: Hop::Answer,
                source: Box::new(e),
            })?
            .to_bytes();
        Ok(Collected {
            endpoint,
            status: self.status,
            content_type: self.content_type,
            bytes,
        })
    }
}

/// A fully read answer.
#[derive(Debug)]
pub(crate) struct Collected {
    pub endpoint: String,
    pub status: StatusCode,
    pub content_type: Option<HeaderValue>,
    pub bytes: Bytes,
}

impl Collected {
    /// The answer as is, for the client.
    pub fn into_response(self) -> Response {
        let mut r = (self.status, self.bytes).into_response();
        if let Some(ct) = self.content_type {
            r.headers_mut().insert(header::CONTENT_TYPE, ct);
        }
        r
    }

    /// The engine's error message (its `error.message`, else the raw text).
    pub fn error_message(&self) -> String {
        serde_json::from_slice::<Value>(&self.bytes)
            .ok()
            .and_then(|v| v.pointer("/error/message")?.as_str().map(str::to_owned))
            .unwrap_or_else(|| {
                String::from_utf8_lossy(&self.bytes)
                    .chars()
                    .take(500)
                    .collect()
            })
    }

    /// A 5xx answer as an error.
    pub fn status_error(&self) -> RouterError {
        RouterError::Status {
            endpoint: self.endpoint.clone(),
            status: self.status,
            message: self.error_message(),
        }
    }
}

/// Counts one client request once, by outcome, with its latency; a record
/// dropped without an outcome counts as `cancelled` (the client went away).
#[derive(Debug)]
pub(crate) struct RequestRecord {
    metrics: RouterMetrics,
    mode: &'static str,
    route: &'static str,
    started: Instant,
    outcome: Option<&'static str>,
}

impl RequestRecord {
    pub fn new(metrics: RouterMetrics, mode: &'static str, route: &'static str) -> Self {
        RequestRecord {
            metrics,
            mode,
            route,
            started: Instant::now(),
            outcome: None,
        }
    }

    /// Set the outcome (the last call wins).
    pub fn set(&mut self, outcome: &'static str) {
        self.outcome = Some(outcome);
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        let outcome = self.outcome.unwrap_or("cancelled");
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                mode: self.mode.into(),
                route: self.route.into(),
                outcome: outcome.into(),
            })
            .inc();
        self.metrics
            .request_duration_seconds
            .get_or_create(&RouteLabels {
                mode: self.mode.into(),
                route: self.route.into(),
            })
            .observe(self.started.elapsed().as_secs_f64());
    }
}

/// How a final hop's answer goes back to the client.
pub(crate) struct Relay {
    pub metrics: RouterMetrics,
    /// `decode` or `plain` (the `hop` label of upstream errors).
    pub hop: &'static str,
    /// Replace `usage.prompt_tokens_details.cached_tokens` with this.
    pub cached_tokens: Option<u64>,
    /// Outcome of a successful answer (`ok` or `fallback`).
    pub ok_outcome: &'static str,
    pub record: RequestRecord,
    /// Released when the answer has been sent (or abandoned).
    pub load: LoadGuard,
}

impl Relay {
    /// A failed hop: count it and answer 502.
    pub fn fail(mut self, e: RouterError) -> Response {
        tracing::warn!(error = %e, hop = self.hop, "engine hop failed");
        self.metrics
            .upstream_error(self.load.url(), self.hop, e.upstream_kind());
        self.record.set("upstream_error");
        ApiError::bad_gateway(e.to_string()).into_response()
    }

    /// Send `answer` to the client.
    pub async fn answer(mut self, answer: Answer) -> Response {
        if answer.status.is_success() && answer.is_event_stream() {
            return self.stream(answer);
        }
        let collected = match answer.collect().await {
            Ok(c) => c,
            Err(e) => return self.fail(e),
        };
        if collected.status.is_server_error() {
            let e = collected.status_error();
            return self.fail(e);
        }
        if !collected.status.is_success() {
            self.record.set("client_error");
            return collected.into_response();
        }
        let Some(cached) = self.cached_tokens else {
            self.record.set(self.ok_outcome);
            return collected.into_response();
        };
        let mut v: Value = match serde_json::from_slice(&collected.bytes) {
            Ok(v) => v,
            Err(e) => {
                let err = RouterError::BadAnswer {
                    endpoint: collected.endpoint.clone(),
                    problem: AnswerProblem::NotJson {
                        what: "answer",
                        source: e,
                    },
                };
                return self.fail(err);
            }
        };
        replace_cached_tokens(&mut v, cached);
        self.record.set(self.ok_outcome);
        (collected.status, axum::Json(v)).into_response()
    }

    /// Pass an SSE answer through as it arrives.
    fn stream(self, answer: Answer) -> Response {
        let status = answer.status;
        let content_type = answer.content_type.clone();
        let state = StreamState {
            rewriter: self.cached_tokens.map(SseRewriter::new),
            answer,
            relay: self,
            ended: false,
        };
        let stream = futures::stream::unfold(state, |mut s| async move {
            loop {
                if s.ended {
                    return None;
                }
                let next = tokio::time::timeout_at(s.answer.deadline, s.answer.body.frame()).await;
                match next {
                    Ok(Some(Ok(frame))) => {
                        let Ok(data) = frame.into_data() else {
                            continue; // trailers: nothing to forward
                        };
                        let data = match s.rewriter.as_mut() {
                            Some(r) => r.push(&data),
                            None => data,
                        };
                        if !data.is_empty() {
                            return Some((Ok::<Bytes, std::io::Error>(data), s));
                        }
                    }
                    Ok(None) => {
                        s.ended = true;
                        s.relay.record.set(s.relay.ok_outcome);
                        let tail = s.rewriter.as_mut().map(SseRewriter::finish);
                        if let Some(tail) = tail.filter(|t| !t.is_empty()) {
                            return Some((Ok(tail), s));
                        }
                        return None;
                    }
                    Ok(Some(Err(e))) => {
                        let err = RouterError::Connect {
                            endpoint: s.answer.endpoint.clone(),
                            hop: Hop::Stream,
                            source: Box::new(e),
                        };
                        return s.abort(err);
                    }
                    Err(_) => {
                        let err = RouterError::Timeout {
                            endpoint: s.answer.endpoint.clone(),
                            timeout_ms: s.answer.timeout.as_millis() as u64,
                        };
                        return s.abort(err);
                    }
                }
            }
        });
        let mut r = Response::new(Body::from_stream(stream));
        *r.status_mut() = status;
        if let Some(ct) = content_type {
            r.headers_mut().insert(header::CONTENT_TYPE, ct);
        }
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r
    }
}

/// One relayed SSE stream: owns the engine's body and the request's guards,
/// so a client that goes away drops the engine connection (which cancels the
/// generation there) and releases the endpoint's tokens.
struct StreamState {
    answer: Answer,
    rewriter: Option<SseRewriter>,
    relay: Relay,
    ended: bool,
}

impl StreamState {
    /// The engine's stream broke mid-way: count it and end the client's
    /// stream with an error (headers are already sent, so no 502 is possible).
    fn abort(mut self, e: RouterError) -> Option<(Result<Bytes, std::io::Error>, StreamState)> {
        tracing::warn!(error = %e, hop = self.relay.hop, "engine stream failed");
        self.relay
            .metrics
            .upstream_error(self.relay.load.url(), self.relay.hop, e.upstream_kind());
        self.relay.record.set("upstream_error");
        self.ended = true;
        Some((Err(std::io::Error::other(e.to_string())), self))
    }
}
