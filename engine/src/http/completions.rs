//! `POST /v1/chat/completions` and `POST /v1/completions`.
//!
//! Validates the body (model, messages/prompt, sampling ranges, context
//! length), renders the chat template, tokenizes, submits a [`Generation`]
//! and answers either one JSON object or an SSE stream of chunks ending with
//! `data: [DONE]`. The SSE stream owns the generation: when the client
//! disconnects axum drops the stream, which drops the event receiver and so
//! cancels the request in the scheduler. A prefill-role engine's answer also
//! carries `kv_transfer_params` (the saved blocks; see `response.rs`) on the
//! object or on the last chunk before `[DONE]`; a request's own
//! `kv_transfer_params` is accepted and only logged.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use kvfabric_tenants::Identity;

use super::generate::{Generation, GenerationPlan, Step, TenantUsage};
use super::openai::{convert_messages, from_value, parse_json, ApiError, CompletionBody, PromptIn};
use super::params;
use super::response::{attach_transfer, Api, ResponseMeta};
use super::{unix_now, HttpState};
use crate::request::SamplingParams;
use crate::EngineError;

/// At most this many stop strings per request.
const MAX_STOP_STRINGS: usize = 16;
/// Longest `cache_salt` accepted, in bytes.
const MAX_CACHE_SALT: usize = 1024;

pub(super) async fn chat_completions(
    State(state): State<Arc<HttpState>>,
    Extension(who): Extension<Identity>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(state, who, headers, body, Api::Chat).await
}

pub(super) async fn completions(
    State(state): State<Arc<HttpState>>,
    Extension(who): Extension<Identity>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(state, who, headers, body, Api::Completion).await
}

async fn handle(
    state: Arc<HttpState>,
    who: Identity,
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
    match run(&state, who, body, meta, arrived).await {
        Ok(response) => response,
        Err(e) => {
            tracing::debug!(status = %e.status, message = %e.message, "request rejected");
            e.into_response()
        }
    }
}

async fn run(
    state: &HttpState,
    who: Identity,
    body: Result<Bytes, BytesRejection>,
    meta: ResponseMeta,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| {
        ApiError::invalid(format!("could not read the request body: {e}"), None)
            .with_status(e.status())
    })?;
    let value = parse_json(&body)?;
    params::check(&value, meta.api)?;
    let mut req: CompletionBody = from_value(value)?;
    if let Some(params) = &req.kv_transfer_params {
        // A hint from the router: the decode side finds saved blocks by itself.
        let params = Value::Object(params.clone());
        tracing::debug!(request_id = %meta.id, kv_transfer_params = %params, "kv_transfer_params received");
    }
    let stream = req.stream;
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let salt = cache_salt(req.cache_salt.take())?;
    let mut plan = plan(state, req, meta.api, arrived)?;
    plan.namespace = who.namespace(salt.as_deref());
    plan.tenant = Some(TenantUsage {
        gate: state.tenants.clone(),
        who,
    });
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
        namespace: Vec::new(),
        tenant: None,
    })
}

/// `cache_salt`: absent, or a non-empty string of at most [`MAX_CACHE_SALT`] bytes.
fn cache_salt(salt: Option<String>) -> Result<Option<String>, ApiError> {
    match salt {
        Some(s) if s.is_empty() || s.len() > MAX_CACHE_SALT => Err(ApiError::invalid(
            format!("cache_salt must be a non-empty string of at most {MAX_CACHE_SALT} bytes"),
            Some("cache_salt"),
        )),
        s => Ok(s),
    }
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
                let mut v = meta.full_response(&text, finish_reason, &usage);
                attach_transfer(&mut v, generation.transfer_params(), &usage);
                return Ok(axum::Json(v).into_response());
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
                    // The last chunk before [DONE] carries kv_transfer_params.
                    let transfer = s.generation.transfer_params();
                    let mut last = s.meta.final_chunk(finish_reason);
                    if s.include_usage {
                        s.outbox.push_back(data(&last));
                        last = s.meta.usage_chunk(&usage);
                    }
                    attach_transfer(&mut last, transfer, &usage);
                    s.outbox.push_back(data(&last));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{EngineHandle, FinishReason, GenerationEvent, TransferParams, Usage};
    use crate::tokenizer::{PreTokenizerKind, Tokenizer, TokenizerSpec};
    use kvfabric_types::BlockKey;
    use tokio::sync::mpsc;

    fn meta(api: Api) -> ResponseMeta {
        ResponseMeta {
            api,
            id: "cmpl-1".into(),
            created: 1,
            model: "m".into(),
        }
    }

    fn params() -> TransferParams {
        TransferParams {
            holder: "node-a".into(),
            block_keys: vec![BlockKey([0xab; 32]), BlockKey([0x01; 32])],
            block_tokens: 64,
        }
    }

    const USAGE: Usage = Usage {
        prompt_tokens: 130,
        completion_tokens: 1,
        cached_tokens: 64,
    };

    fn expected_params() -> Value {
        json!({
            "holder": "node-a",
            "block_keys": ["ab".repeat(32), "01".repeat(32)],
            "block_tokens": 64,
            "cached_tokens": 64,
        })
    }

    /// Every byte one token (ids 0..256), enough to decode what the fake scheduler sends.
    fn byte_tokenizer() -> Tokenizer {
        let mut tokens = Vec::new();
        let mut n = 0u32;
        for b in 0u32..256 {
            let printable = (0x21..=0x7E).contains(&b)
                || (0xA1..=0xAC).contains(&b)
                || (0xAE..=0xFF).contains(&b);
            let c = if printable {
                b
            } else {
                n += 1;
                255 + n
            };
            tokens.push(char::from_u32(c).map(String::from).unwrap_or_default());
        }
        Tokenizer::from_spec(TokenizerSpec {
            token_types: vec![1; tokens.len()],
            tokens,
            merges: Vec::new(),
            pre: Some(PreTokenizerKind::Smollm),
            bos_id: None,
            eos_id: None,
            unknown_id: None,
            add_bos: false,
        })
        .expect("byte tokenizer")
    }

    /// A generation served by a fake prefill scheduler: one token `A`, then
    /// `Saved`, then `Finished`.
    async fn prefill_generation() -> Generation {
        let (submit, mut intake) = mpsc::channel::<crate::request::GenerationRequest>(1);
        tokio::spawn(async move {
            if let Some(req) = intake.recv().await {
                let _ = req
                    .events
                    .send(GenerationEvent::Token {
                        id: u32::from(b'A'),
                        logits: None,
                    })
                    .await;
                let _ = req.events.send(GenerationEvent::Saved(params())).await;
                let _ = req
                    .events
                    .send(GenerationEvent::Finished {
                        reason: FinishReason::Length,
                        usage: USAGE,
                    })
                    .await;
            }
        });
        let plan = GenerationPlan {
            prompt: vec![u32::from(b'x'); 130],
            max_tokens: 1,
            sampling: SamplingParams::default(),
            stop_strings: Vec::new(),
            stop_token_ids: Vec::new(),
            arrived: Instant::now(),
            namespace: Vec::new(),
            tenant: None,
        };
        Generation::start(
            &EngineHandle::new(submit),
            Arc::new(byte_tokenizer()),
            crate::http::EngineMetrics::new(),
            plan,
        )
        .await
        .expect("submitted")
    }

    async fn sse_events(response: Response) -> Vec<Value> {
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        let text = String::from_utf8(bytes.to_vec()).expect("utf8");
        let data: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect();
        assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
        data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).expect("json chunk"))
            .collect()
    }

    #[tokio::test]
    async fn saved_blocks_reach_the_non_streamed_answer() {
        let response = collect_response(prefill_generation().await, meta(Api::Completion))
            .await
            .expect("answer");
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        let v: Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(v["choices"][0]["text"], "A");
        assert_eq!(v["kv_transfer_params"], expected_params());
    }

    #[tokio::test]
    async fn saved_blocks_ride_on_the_last_streamed_chunk() {
        // With include_usage: the usage chunk is last and carries them.
        let response = sse_response(prefill_generation().await, meta(Api::Chat), true);
        let events = sse_events(response).await;
        let last = events.last().expect("chunks");
        assert_eq!(last["usage"]["prompt_tokens"], 130);
        assert_eq!(last["kv_transfer_params"], expected_params());
        let carrying = events
            .iter()
            .filter(|e| e.get("kv_transfer_params").is_some())
            .count();
        assert_eq!(carrying, 1);
        // Without: the finish_reason chunk is last and carries them.
        let response = sse_response(prefill_generation().await, meta(Api::Completion), false);
        let events = sse_events(response).await;
        let last = events.last().expect("chunks");
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert_eq!(last["kv_transfer_params"], expected_params());
    }
}
