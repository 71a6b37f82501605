//! A client request as the router sees it: the JSON body, checked just
//! enough to route it, and the token estimates the balancer uses.
//!
//! The router does not tokenize (it has no model): the engine stays the one
//! place that validates a request fully. The router refuses only what no
//! engine could answer (not JSON, not an object, no `model`, no
//! prompt/messages, a non-integer `max_tokens`), so those cost no engine a
//! round trip.
//!
//! Token estimates (load balancing only, never sent anywhere):
//! - prompt: a token-id array counts its length; text counts UTF-8 bytes / 4,
//!   rounded up (about right for English BPE vocabularies); chat counts every
//!   message's role and text bytes the same way.
//! - decode: prompt estimate + `max_completion_tokens` / `max_tokens`, or
//!   [`DEFAULT_COMPLETION_ESTIMATE`] when the client set neither.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// Completion tokens assumed for a request without `max_tokens`.
pub const DEFAULT_COMPLETION_ESTIMATE: u64 = 256;

/// Which API: decides the path and the prompt field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Api {
    Chat,
    Completion,
}

impl Api {
    /// The request path, also the `route` metrics label.
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completion => "/v1/completions",
        }
    }
}

/// A parsed client request.
#[derive(Debug)]
pub(crate) struct ClientRequest {
    pub api: Api,
    body: Map<String, Value>,
    /// Estimated prompt tokens.
    pub prompt_tokens: u64,
    /// `max_completion_tokens` or `max_tokens`, if set.
    pub max_tokens: Option<u64>,
    /// The client's headers forwarded on every hop.
    pub headers: HopHeaders,
}

/// The routing hint header: the session a request belongs to.
pub const SESSION_AFFINITY_HEADER: &str = "x-session-affinity";

/// Client headers the router passes on to engines.
#[derive(Clone, Debug, Default)]
pub(crate) struct HopHeaders {
    /// `Authorization`: the engine checks the same key and picks the namespace.
    pub authorization: Option<axum::http::HeaderValue>,
    /// `x-session-affinity`: the routing hint, passed on so the engine sees it too.
    pub session: Option<axum::http::HeaderValue>,
}

impl HopHeaders {
    /// The forwarded headers of `headers`.
    pub fn of(headers: &axum::http::HeaderMap) -> HopHeaders {
        HopHeaders {
            authorization: headers.get(axum::http::header::AUTHORIZATION).cloned(),
            session: headers.get(SESSION_AFFINITY_HEADER).cloned(),
        }
    }

    /// The session id, when the header is set and printable.
    pub fn session_id(&self) -> Option<&str> {
        self.session
            .as_ref()?
            .to_str()
            .ok()
            .filter(|s| !s.is_empty())
    }
}

/// `ceil(bytes / 4)`.
pub fn estimate_text_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}

impl ClientRequest {
    /// Check `bytes` enough to route it.
    pub fn parse(api: Api, bytes: &[u8]) -> Result<ClientRequest, ApiError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            ApiError::invalid(
                format!("We could not parse the JSON body of your request: {e}"),
                None,
            )
        })?;
        let Value::Object(body) = value else {
            return Err(ApiError::invalid(
                "the request body must be a JSON object",
                None,
            ));
        };
        match body.get("model") {
            Some(Value::String(_)) => {}
            Some(_) => return Err(ApiError::invalid("model must be a string", Some("model"))),
            None => return Err(ApiError::invalid("model is required", Some("model"))),
        }
        let prompt_tokens = match api {
            Api::Completion => completion_estimate(body.get("prompt"))?,
            Api::Chat => chat_estimate(body.get("messages"))?,
        };
        let max_tokens = match body.get("max_completion_tokens") {
            Some(v) if !v.is_null() => Some(count(v, "max_completion_tokens")?),
            _ => match body.get("max_tokens") {
                Some(v) if !v.is_null() => Some(count(v, "max_tokens")?),
                _ => None,
            },
        };
        if let Some(v) = body.get("stream") {
            if !v.is_boolean() && !v.is_null() {
                return Err(ApiError::invalid(
                    "stream must be a boolean",
                    Some("stream"),
                ));
            }
        }
        Ok(ClientRequest {
            api,
            body,
            prompt_tokens,
            max_tokens,
            headers: HopHeaders::default(),
        })
    }

    /// Tokens a decode (or plain) engine will hold for this request.
    pub fn decode_tokens(&self) -> u64 {
        self.prompt_tokens
            .saturating_add(self.max_tokens.unwrap_or(DEFAULT_COMPLETION_ESTIMATE))
    }

    /// The body as the client sent it (re-encoded).
    pub fn original_body(&self) -> Vec<u8> {
        encode(&self.body)
    }

    /// The prefill hop's body: one token, no streaming, and the
    /// `kv_transfer_params` that asks the engine to keep the KV for a remote decode.
    pub fn prefill_body(&self) -> Vec<u8> {
        let mut body = self.body.clone();
        body.insert("max_tokens".into(), Value::from(1));
        body.remove("max_completion_tokens");
        body.insert("stream".into(), Value::Bool(false));
        body.remove("stream_options");
        let mut params = Map::new();
        params.insert("do_remote_decode".into(), Value::Bool(true));
        body.insert("kv_transfer_params".into(), Value::Object(params));
        encode(&body)
    }

    /// The decode hop's body: the original plus the prefill's `kv_transfer_params`, if any.
    pub fn decode_body(&self, transfer: Option<&Value>) -> Vec<u8> {
        match transfer {
            None => self.original_body(),
            Some(params) => {
                let mut body = self.body.clone();
                body.insert("kv_transfer_params".into(), params.clone());
                encode(&body)
            }
        }
    }
}

fn encode(body: &Map<String, Value>) -> Vec<u8> {
    // Serializing a Map of JSON values cannot fail.
    serde_json::to_vec(body).unwrap_or_default()
}

fn count(v: &Value, param: &str) -> Result<u64, ApiError> {
    v.as_u64().ok_or_else(|| {
        ApiError::invalid(
            format!("{param} must be a non-negative integer"),
            Some(param),
        )
    })
}

fn completion_estimate(prompt: Option<&Value>) -> Result<u64, ApiError> {
    let bad = || {
        ApiError::invalid(
            "prompt must be a string, a list of strings or a list of token ids",
            Some("prompt"),
        )
    };
    match prompt {
        None | Some(Value::Null) => Err(ApiError::invalid("prompt is required", Some("prompt"))),
        Some(Value::String(s)) => Ok(estimate_text_tokens(s)),
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => Ok(items.len() as u64),
        Some(Value::Array(items)) => items.iter().try_fold(0u64, |sum, item| match item {
            Value::String(s) => Ok(sum + estimate_text_tokens(s)),
            _ => Err(bad()),
        }),
        Some(_) => Err(bad()),
    }
}

fn chat_estimate(messages: Option<&Value>) -> Result<u64, ApiError> {
    let Some(Value::Array(messages)) = messages else {
        return Err(ApiError::invalid(
            "messages is required and must be a list",
            Some("messages"),
        ));
    };
    let mut bytes = 0u64;
    for m in messages {
        let Value::Object(m) = m else {
            return Err(ApiError::invalid(
                "every message must be an object",
                Some("messages"),
            ));
        };
        let text_len = |v: Option<&Value>| v.and_then(Value::as_str).map_or(0, str::len) as u64;
        bytes += text_len(m.get("role"));
        match m.get("content") {
            Some(Value::Array(parts)) => {
                for p in parts {
                    bytes += text_len(p.get("text"));
                }
            }
            other => bytes += text_len(other),
        }
    }
    Ok(bytes.div_ceil(4))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(api: Api, v: Value) -> Result<ClientRequest, ApiError> {
        ClientRequest::parse(api, v.to_string().as_bytes())
    }

    #[test]
    fn estimates_follow_the_documented_rule() {
        let r = parse(Api::Completion, json!({"model":"m","prompt":"abcdefghi"})).expect("ok");
        assert_eq!(r.prompt_tokens, 3); // 9 bytes / 4, rounded up
        assert_eq!(r.decode_tokens(), 3 + DEFAULT_COMPLETION_ESTIMATE);
        let r = parse(
            Api::Completion,
            json!({"model":"m","prompt":[1,2,3,4,5],"max_tokens":10}),
        )
        .expect("ok");
        assert_eq!(r.prompt_tokens, 5);
        assert_eq!(r.decode_tokens(), 15);
        let r = parse(
            Api::Chat,
            json!({"model":"m","messages":[{"role":"user","content":"hello"},{"role":"assistant","content":[{"type":"text","text":"abc"}]}],"max_completion_tokens":7,"max_tokens":99}),
        )
        .expect("ok");
        // "user"+"hello"+"assistant"+"abc" = 4+5+9+3 = 21 bytes -> 6
        assert_eq!(r.prompt_tokens, 6);
        assert_eq!(r.max_tokens, Some(7));
    }

    #[test]
    fn bad_bodies_are_400_with_the_param() {
        let e = ClientRequest::parse(Api::Completion, b"{nope").expect_err("not json");
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        let e = ClientRequest::parse(Api::Completion, b"[1]").expect_err("not an object");
        assert_eq!(e.kind, "invalid_request_error");
        let e = parse(Api::Completion, json!({"prompt":"x"})).expect_err("no model");
        assert_eq!(e.param.as_deref(), Some("model"));
        let e = parse(Api::Completion, json!({"model":"m"})).expect_err("no prompt");
        assert_eq!(e.param.as_deref(), Some("prompt"));
        let e = parse(Api::Chat, json!({"model":"m","prompt":"x"})).expect_err("no messages");
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = parse(
            Api::Completion,
            json!({"model":"m","prompt":"x","max_tokens":-1}),
        )
        .expect_err("negative");
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = parse(Api::Completion, json!({"model":"m","prompt":{"a":1}})).expect_err("object");
        assert_eq!(e.param.as_deref(), Some("prompt"));
    }

    #[test]
    fn hop_bodies_carry_the_protocol_fields() {
        let r = parse(
            Api::Chat,
            json!({"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":9,"stream":true,"stream_options":{"include_usage":true},"temperature":0}),
        )
        .expect("ok");
        let p: Value = serde_json::from_slice(&r.prefill_body()).expect("json");
        assert_eq!(p["max_tokens"], 1);
        assert!(p.get("max_completion_tokens").is_none());
        assert_eq!(p["stream"], false);
        assert!(p.get("stream_options").is_none());
        assert_eq!(p["kv_transfer_params"], json!({"do_remote_decode": true}));
        assert_eq!(p["temperature"], 0);
        let params = json!({"holder":"n1","block_keys":["ab"],"block_tokens":64,"cached_tokens":0});
        let d: Value = serde_json::from_slice(&r.decode_body(Some(&params))).expect("json");
        assert_eq!(d["kv_transfer_params"], params);
        assert_eq!(d["max_completion_tokens"], 9);
        assert_eq!(d["stream"], true);
        assert_eq!(d["stream_options"]["include_usage"], true);
        let d: Value = serde_json::from_slice(&r.decode_body(None)).expect("json");
        assert!(d.get("kv_transfer_params").is_none());
    }
}
