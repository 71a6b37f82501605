//! OpenAI wire format: request bodies, the error body, and body parsing.
//!
//! Bodies are parsed by hand (not axum's `Json`, whose rejection is plain
//! text) so every malformed body, wrong type or missing field becomes an
//! OpenAI-style JSON error with the offending field in `param`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::json;

use crate::chat::ChatMessage;

/// An OpenAI-style error response.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// `invalid_request_error`, `not_found_error`, `server_error`, ...
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 invalid_request_error.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_owned),
            code: None,
        }
    }

    /// Set the machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// Set the status.
    pub fn with_status(mut self, status: StatusCode) -> ApiError {
        self.status = status;
        self
    }

    /// 5xx server_error.
    pub fn server(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
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

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

impl StopSpec {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopSpec::One(s) => vec![s],
            StopSpec::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// A request body of either endpoint: `messages` for chat, `prompt` for
/// completions (one struct, no `serde(flatten)`, so type errors keep their path).
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionBody {
    pub model: String,
    /// Chat endpoint: the conversation.
    pub messages: Option<Vec<MessageIn>>,
    /// Completions endpoint: the prompt.
    pub prompt: Option<PromptIn>,
    /// Completions endpoint: put the prompt before the generated text.
    #[serde(default)]
    pub echo: bool,
    /// Chat: a boolean; completions: how many alternatives per token (0..=5).
    pub logprobs: Option<serde_json::Value>,
    /// Chat: alternatives per token (0..=20), with `logprobs: true`.
    pub top_logprobs: Option<u64>,
    /// An end-user id (OpenAI's abuse tracking): logged only.
    pub user: Option<String>,
    /// Chat: function definitions (see `http/tools.rs`).
    pub tools: Option<serde_json::Value>,
    /// Chat: `none`, `auto`, `required` or `{"type": "function", "function": {"name": ..}}`.
    pub tool_choice: Option<serde_json::Value>,
    /// Chat: false keeps only the first call.
    pub parallel_tool_calls: Option<bool>,
    /// `text`, `json_object` or `json_schema` (see `http/structured.rs`).
    pub response_format: Option<serde_json::Value>,
    pub max_tokens: Option<u64>,
    /// The chat API's newer name for `max_tokens`.
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Extension (vLLM, llama.cpp): keep the k most likely tokens; 0 or -1 = off.
    pub top_k: Option<i64>,
    pub seed: Option<serde_json::Number>,
    pub stop: Option<StopSpec>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u64>,
    /// Completions: generate this many, return the `n` most likely.
    pub best_of: Option<u64>,
    /// Disaggregated serving (vLLM's field): a JSON object the router adds.
    /// A prefill engine gets `{"do_remote_decode": true}`; a decode engine
    /// gets the prefill response's `kv_transfer_params`. Only logged: a
    /// decode engine finds the saved blocks itself, from the prompt's block
    /// keys, so the hint changes nothing in what is computed.
    pub kv_transfer_params: Option<serde_json::Map<String, serde_json::Value>>,
    /// vLLM's field: a secret that splits the prefix cache finer than the
    /// tenant (requests with different salts never share blocks).
    pub cache_salt: Option<String>,
}

/// A chat message as sent: `content` is a string, a list of parts, or null.
#[derive(Debug, Clone, Deserialize)]
pub struct MessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<ContentIn>,
    /// An assistant turn's calls (OpenAI shape).
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool turn: the call it answers (required for `role: "tool"`).
    pub tool_call_id: Option<String>,
}

/// Message content forms.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ContentIn {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a multi-part content; only text parts are supported.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// `prompt` forms of the completions API.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptIn {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
}

/// Parse a JSON body into `T`; malformed JSON and type errors become 400s.
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    from_value(parse_json(body)?)
}

/// Parse a body into a JSON object; malformed JSON and non-objects are 400s.
pub fn parse_json(body: &[u8]) -> Result<serde_json::Value, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(
            format!("We could not parse the JSON body of your request: {e}"),
            None,
        )
        .with_code("invalid_json")
    })?;
    if !value.is_object() {
        return Err(ApiError::invalid(
            "the request body must be a JSON object",
            None,
        ));
    }
    Ok(value)
}

/// Deserialize a parsed body; a type error names its path in `param`.
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        let mut err = ApiError::invalid(format!("{}", e.inner()), None);
        if let Some(p) = &param {
            err.message = format!("invalid value for '{p}': {}", e.inner());
        }
        err.param = param;
        err
    })
}

/// Turn wire messages into template messages (text parts concatenated).
pub fn convert_messages(messages: Vec<MessageIn>) -> Result<Vec<ChatMessage>, ApiError> {
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match m.content {
                None => String::new(),
                Some(ContentIn::Text(s)) => s,
                Some(ContentIn::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        if p.kind != "text" {
                            return Err(ApiError::invalid(
                                format!("content part type '{}' is not supported", p.kind),
                                Some(&format!("messages[{i}].content")),
                            ));
                        }
                        text.push_str(p.text.as_deref().unwrap_or_default());
                    }
                    text
                }
            };
            // OpenAI's newer name for the system role; templates know `system`.
            let role = if m.role == "developer" {
                "system".to_owned()
            } else {
                m.role
            };
            if role == "tool" && m.tool_call_id.is_none() {
                return Err(ApiError::invalid(
                    "a tool message needs the tool_call_id it answers",
                    Some(&format!("messages[{i}].tool_call_id")),
                ));
            }
            let mut message = ChatMessage::new(role, content);
            message.tool_calls = m.tool_calls.filter(|c| !c.is_empty());
            message.tool_call_id = m.tool_call_id;
            Ok(message)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_json_and_wrong_types_are_openai_errors_with_param() {
        let e = parse_body::<CompletionBody>(b"{not json").expect_err("malformed");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.code, Some("invalid_json"));
        let e = parse_body::<CompletionBody>(br#"{"model":"m","messages":[],"max_tokens":"ten"}"#)
            .expect_err("wrong type");
        assert_eq!(e.param.as_deref(), Some("max_tokens"), "{e:?}");
        let e = parse_body::<CompletionBody>(br#"{"messages":[]}"#).expect_err("missing");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("model"), "{e:?}");
        let body = e.body();
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn stop_and_prompt_forms_parse() {
        let r: CompletionBody = parse_body(
            br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"stop":"x","seed":-1}"#,
        )
        .expect("valid");
        assert_eq!(r.stop.map(StopSpec::into_vec), Some(vec!["x".to_string()]));
        let msgs = convert_messages(r.messages.unwrap_or_default()).expect("text parts");
        assert_eq!(msgs, vec![ChatMessage::new("user", "ab")]);
        let c: CompletionBody =
            parse_body(br#"{"model":"m","prompt":[1,2,3],"stop":["a","b"]}"#).expect("valid");
        assert!(matches!(c.prompt, Some(PromptIn::Tokens(ref t)) if t == &[1, 2, 3]));
        let c: CompletionBody = parse_body(br#"{"model":"m","prompt":["hi"]}"#).expect("valid");
        assert!(matches!(c.prompt, Some(PromptIn::Texts(ref t)) if t.len() == 1));
    }

    #[test]
    fn kv_transfer_params_must_be_an_object() {
        let c: CompletionBody = parse_body(
            br#"{"model":"m","prompt":"hi","kv_transfer_params":{"do_remote_decode":true}}"#,
        )
        .expect("object accepted");
        let params = c.kv_transfer_params.expect("kept");
        assert_eq!(params["do_remote_decode"], json!(true));
        let e =
            parse_body::<CompletionBody>(br#"{"model":"m","prompt":"hi","kv_transfer_params":7}"#)
                .expect_err("a number is not transfer params");
        assert_eq!(e.param.as_deref(), Some("kv_transfer_params"), "{e:?}");
        let c: CompletionBody = parse_body(br#"{"model":"m","prompt":"hi"}"#).expect("absent");
        assert!(c.kv_transfer_params.is_none());
    }
}
