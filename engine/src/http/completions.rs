//! `POST /v1/chat/completions` and `POST /v1/completions`.
//!
//! Validates the body (model, messages/prompt, sampling ranges, context
//! length), renders the chat template, tokenizes, submits a [`Generation`]
//! and answers either one JSON object or an SSE stream of chunks ending with
//! `data: [DONE]`. The SSE stream owns the generation: when the client
//! disconnects axum drops the stream, which drops the event receiver and so
//! cancels the request in the scheduler.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::generate::{Generation, GenerationPlan, Step};
use super::openai::{convert_messages, parse_body, ApiError, CompletionBody, PromptIn};
use super::{unix_now, HttpState};
use crate::request::{SamplingParams, Usage};
use crate::EngineError;

/// At most this many stop strings per request.
const MAX_STOP_STRINGS: usize = 16;

/// Which endpoint: decides the response shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Chat,
    Completion,
}

impl Api {
    fn id_prefix(self) -> &'static str {
        match self {
            Api::Chat => "chatcmpl",
            Api::Completion => "cmpl",
        }
    }
}

/// Fixed per-response fields.
#[derive(Clone, Debug)]
struct ResponseMeta {
    api: Api,
    id: String,
    created: u64,
    model: String,
}

impl ResponseMeta {
    fn envelope(&self, object: &str, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// One streamed chunk carrying `text` (chat: a content delta).
    fn text_chunk(&self, text: &str) -> Value {
        match self.api {
            Api::Chat => self.envelope(
                "chat.completion.chunk",
                json!([{"index": 0, "delta": {"content": text}, "logprobs": null, "finish_reason": null}]),
            ),
            Api::Completion => self.envelope(
                "text_completion",
                json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": null}]),
            ),
        }
    }

    /// The chunk that carries the finish reason.
    fn final_chunk(&self, finish_reason: &str) -> Value {
        match self.api {
            Api::Chat => self.envelope(
                "chat.completion.chunk",
                json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_reason}]),
            ),
            Api::Completion => self.envelope(
                "text_completion",
                json!([{"index": 0, "text": "", "logprobs": null, "finish_reason": finish_reason}]),
            ),
        }
    }

    /// The trailing chunk with usage and no choices (`stream_options.include_usage`).
    fn usage_chunk(&self, usage: &Usage) -> Value {
        let object = match self.api {
            Api::Chat => "chat.completion.chunk",
            Api::Completion => "text_completion",
        };
        let mut v = self.envelope(object, json!([]));
        v["usage"] = usage_json(usage);
        v
    }

    /// The whole non-streamed response.
    fn full_response(&self, text: &str, finish_reason: &str, usage: &Usage) -> Value {
        let (object, choice) = match self.api {
            Api::Chat => (
                "chat.completion",
                json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": finish_reason}),
            ),
            Api::Completion => (
                "text_completion",
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason}),
            ),
        };
        let mut v = self.envelope(object, json!([choice]));
        v["usage"] = usage_json(usage);
        v
    }
}

fn usage_json(usage: &Usage) -> Value {
    json!({
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    })
}

pub(super) async fn chat_completions(
    State(state): State<Arc<HttpState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(state, headers, body, Api::Chat).await
}

pub(super) async fn completions(
    State(state): State<Arc<HttpState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(state, headers, body, Api::Completion).await
}

async fn handle(
    state: Arc<HttpState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    api: Api,
) -> Response {
    let arrived = Instant::now();
    let meta = ResponseMeta {
        api,
        id: state.request_id(api.id_prefix()),
        created: unix_now(),
        model: state.model_name.clone(),
    };
    if let Some(hint) = headers.get("x-session-affinity") {
        // A hint only: any node can reuse any prefix through the fabric.
        tracing::info!(
            request_id = %meta.id,
            session_affinity = hint.to_str().unwrap_or("<non-ascii>"),
            "session affinity hint received"
        );
    }
    match run(&state, body, meta, arrived).await {
        Ok(response) => response,
        Err(e) => {
            tracing::debug!(status = %e.status, message = %e.message, "request rejected");
            e.into_response()
        }
    }
}

async fn run(
    state: &HttpState,
    body: Result<Bytes, BytesRejection>,
    meta: ResponseMeta,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| {
        ApiError::invalid(format!("could not read the request body: {e}"), None)
            .with_status(e.status())
    })?;
    let req: CompletionBody = parse_body(&body)?;
    let stream = req.stream;
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let plan = plan(state, req, meta.api, arrived)?;
    let generation = Generation::start(
        &state.engine,
        state.tokenizer.clone(),
        state.metrics.clone(),
        plan,
    )
    .await?;
    if stream {
        Ok(sse_response(generation, meta, include_usage))
    } else {
        collect_response(generation, meta).await
    }
}

/// Validate a body and turn it into a plan; every rejection is a 4xx.
fn plan(
    state: &HttpState,
    req: CompletionBody,
    api: Api,
    arrived: Instant,
) -> Result<GenerationPlan, ApiError> {
    if req.model != state.model_name {
        return Err(ApiError::invalid(
            format!(
                "The model `{}` does not exist; this server serves `{}`",
                req.model, state.model_name
            ),
            Some("model"),
        )
        .with_status(StatusCode::NOT_FOUND)
        .with_code("model_not_found"));
    }
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("only n=1 is supported", Some("n")));
    }
    let sampling = sampling_params(&req)?;
    let stop_strings = req.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop_strings.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            format!("at most {MAX_STOP_STRINGS} stop sequences are supported"),
            Some("stop"),
        ));
    }
    let (prompt, prompt_param) = match api {
        Api::Chat => (chat_prompt(state, req.messages)?, "messages"),
        Api::Completion => {
            if req.echo {
                return Err(ApiError::invalid("echo is not supported", Some("echo")));
            }
            (completion_prompt(state, req.prompt)?, "prompt")
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid("the prompt is empty", Some(prompt_param)));
    }
    let ctx = state.context_length;
    if prompt.len() >= ctx {
        return Err(ApiError::invalid(
            format!(
                "This model's maximum context length is {ctx} tokens; the prompt has {} tokens",
                prompt.len()
            ),
            Some(prompt_param),
        )
        .with_code("context_length_exceeded"));
    }
    let requested = req.max_completion_tokens.or(req.max_tokens);
    let max_tokens = match requested {
        Some(0) => return Err(ApiError::invalid("max_tokens must be at least 1", Some("max_tokens"))),
        Some(m) if m.saturating_add(prompt.len() as u64) > ctx as u64 => {
            return Err(ApiError::invalid(
                format!(
                    "This model's maximum context length is {ctx} tokens. However, you requested {} tokens ({} in the prompt, {m} for the completion)",
                    m.saturating_add(prompt.len() as u64),
                    prompt.len()
                ),
                Some("max_tokens"),
            )
            .with_code("context_length_exceeded"))
        }
        Some(m) => m as usize,
        None => ctx - prompt.len(),
    };
    Ok(GenerationPlan {
        prompt,
        max_tokens,
        sampling,
        stop_strings,
        stop_token_ids: state.stop_token_ids.clone(),
        arrived,
    })
}

fn sampling_params(req: &CompletionBody) -> Result<SamplingParams, ApiError> {
    // OpenAI's defaults: temperature 1, top_p 1.
    let temperature = req.temperature.unwrap_or(1.0);
    if !(temperature.is_finite() && (0.0..=2.0).contains(&temperature)) {
        return Err(ApiError::invalid(
            "temperature must be between 0 and 2",
            Some("temperature"),
        ));
    }
    let top_p = req.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid("top_p must be in (0, 1]", Some("top_p")));
    }
    let top_k = match req.top_k {
        None | Some(0) | Some(-1) => 0,
        Some(k) if k > 0 => k as usize,
        Some(_) => {
            return Err(ApiError::invalid(
                "top_k must be positive, 0 or -1",
                Some("top_k"),
            ))
        }
    };
    let seed = match &req.seed {
        None => None,
        Some(n) => Some(
            n.as_u64()
                .or_else(|| n.as_i64().map(|v| v as u64))
                .ok_or_else(|| ApiError::invalid("seed must be an integer", Some("seed")))?,
        ),
    };
    Ok(SamplingParams {
        temperature,
        top_p,
        top_k,
        seed,
    })
}

fn chat_prompt(
    state: &HttpState,
    messages: Option<Vec<super::openai::MessageIn>>,
) -> Result<Vec<u32>, ApiError> {
    let messages =
        messages.ok_or_else(|| ApiError::invalid("messages is required", Some("messages")))?;
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    let messages = convert_messages(messages)?;
    let text = state
        .chat_template
        .render(&messages, true)
        .map_err(|e| match e {
            EngineError::InvalidRequest(m) => ApiError::invalid(m, Some("messages")),
            other => ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        })?;
    Ok(state.tokenizer.encode_prompt(&text))
}

fn completion_prompt(state: &HttpState, prompt: Option<PromptIn>) -> Result<Vec<u32>, ApiError> {
    match prompt {
        None => Err(ApiError::invalid("prompt is required", Some("prompt"))),
        Some(PromptIn::Text(text)) => Ok(state.tokenizer.encode_prompt(&text)),
        Some(PromptIn::Texts(mut texts)) if texts.len() == 1 => {
            Ok(state.tokenizer.encode_prompt(&texts.remove(0)))
        }
        Some(PromptIn::Texts(_)) => Err(ApiError::invalid(
            "exactly one prompt per request is supported",
            Some("prompt"),
        )),
        Some(PromptIn::Tokens(ids)) => {
            let vocab = state.tokenizer.vocab_size();
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::invalid(
                    format!("token id {bad} is outside the vocabulary (size {vocab})"),
                    Some("prompt"),
                ));
            }
            Ok(ids)
        }
    }
}

async fn collect_response(
    mut generation: Generation,
    meta: ResponseMeta,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(step) = generation.next().await {
        match step {
            Step::Text(t) => text.push_str(&t),
            Step::Done {
                finish_reason,
                usage,
            } => {
                return Ok(
                    axum::Json(meta.full_response(&text, finish_reason, &usage)).into_response()
                )
            }
            Step::Failed(message) => {
                return Err(ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, message))
            }
        }
    }
    Err(ApiError::server(
        StatusCode::INTERNAL_SERVER_ERROR,
        "generation ended without a result",
    ))
}

/// State of one SSE response; dropping it drops the generation (cancel).
struct SseState {
    generation: Generation,
    meta: ResponseMeta,
    include_usage: bool,
    outbox: VecDeque<Event>,
    ended: bool,
}

fn data(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

fn sse_response(generation: Generation, meta: ResponseMeta, include_usage: bool) -> Response {
    let mut outbox = VecDeque::new();
    if meta.api == Api::Chat {
        let mut first = meta.text_chunk("");
        first["choices"][0]["delta"] = json!({"role": "assistant", "content": ""});
        outbox.push_back(data(&first));
    }
    let state = SseState {
        generation,
        meta,
        include_usage,
        outbox,
        ended: false,
    };
    let stream = futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(event) = s.outbox.pop_front() {
                return Some((Ok::<Event, Infallible>(event), s));
            }
            if s.ended {
                return None;
            }
            match s.generation.next().await {
                Some(Step::Text(t)) => s.outbox.push_back(data(&s.meta.text_chunk(&t))),
                Some(Step::Done {
                    finish_reason,
                    usage,
                }) => {
                    s.outbox.push_back(data(&s.meta.final_chunk(finish_reason)));
                    if s.include_usage {
                        s.outbox.push_back(data(&s.meta.usage_chunk(&usage)));
                    }
                    s.outbox.push_back(Event::default().data("[DONE]"));
                    s.ended = true;
                }
                Some(Step::Failed(message)) => {
                    let err = ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, message);
                    s.outbox.push_back(data(&err.body()));
                    s.outbox.push_back(Event::default().data("[DONE]"));
                    s.ended = true;
                }
                None => {
                    let err = ApiError::server(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "generation ended without a result",
                    );
                    s.outbox.push_back(data(&err.body()));
                    s.outbox.push_back(Event::default().data("[DONE]"));
                    s.ended = true;
                }
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
