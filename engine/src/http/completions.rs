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

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use kvfabric_tenants::Identity;

use super::answer::{self, Shape};
use super::generate::{Generation, GenerationPlan, TenantUsage};
use super::logprobs::{MAX_TOP_LOGPROBS_CHAT, MAX_TOP_LOGPROBS_COMPLETION};
use super::openai::{convert_messages, from_value, parse_json, ApiError, CompletionBody, PromptIn};
use super::params;
use super::response::{Api, ResponseMeta};
use super::state::HttpState;
use super::structured;
use super::tools::{self, fallback_messages, ToolMode, ToolRequest};
use crate::clock::unix_now;
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

/// A request body checked as `run` checks it, before anything is started:
/// the plan (prompt tokens, namespace) and what shapes the answer. Shared
/// with `POST /v1/kvfabric/keys` (`keys.rs`), so a body's block keys come
/// from exactly the prompt and namespace its completion would run with.
pub(super) struct Checked {
    pub plan: GenerationPlan,
    pub samples: Samples,
    pub stream: bool,
    pub include_usage: bool,
    pub echo: Option<String>,
    pub tools: Option<ToolRequest>,
    pub wanted: Option<structured::Wanted>,
}

/// Check `body` for `api` as the completion endpoints do (every rejection
/// is the same OpenAI-style 4xx), render and tokenize its prompt, and key
/// it under `who`'s namespace.
pub(super) fn check(
    state: &HttpState,
    who: &Identity,
    body: Result<Bytes, BytesRejection>,
    api: Api,
    request_id: &str,
    arrived: Instant,
) -> Result<Checked, ApiError> {
    let body = body.map_err(|e| {
        ApiError::invalid(format!("could not read the request body: {e}"), None)
            .with_status(e.status())
    })?;
    let value = parse_json(&body)?;
    params::check(&value, api)?;
    let mut req: CompletionBody = from_value(value)?;
    if let Some(params) = &req.kv_transfer_params {
        // A hint from the router: the decode side finds saved blocks by itself.
        let params = Value::Object(params.clone());
        tracing::debug!(request_id, kv_transfer_params = %params, "kv_transfer_params received");
    }
    let stream = req.stream;
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let salt = cache_salt(req.cache_salt.take())?;
    let echo = echo_text(state, &req);
    let samples = samples(&req)?;
    let stream_best_of = stream && samples.best_of > samples.n;
    if stream_best_of {
        return Err(ApiError::invalid(
            "best_of greater than n cannot be streamed",
            Some("best_of"),
        ));
    }
    let tools = tools::parse_request(
        req.tools.take(),
        req.tool_choice.take(),
        req.parallel_tool_calls,
    )?;
    let format = structured::response_format(req.response_format.take())?;
    let wanted = structured::wanted(format, tools.as_ref())?;
    let mut plan = plan(state, req, api, arrived, tools.as_ref())?;
    plan.namespace = who.namespace(salt.as_deref());
    Ok(Checked {
        plan,
        samples,
        stream,
        include_usage,
        echo,
        tools,
        wanted,
    })
}

async fn run(
    state: &HttpState,
    who: Identity,
    body: Result<Bytes, BytesRejection>,
    meta: ResponseMeta,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let Checked {
        mut plan,
        samples,
        stream,
        include_usage,
        echo,
        tools,
        wanted,
    } = check(state, &who, body, meta.api, &meta.id, arrived)?;
    if let Some(w) = wanted {
        plan.sampling.constraint = Some(structured::compile(&state.grammars, w).await?);
    }
    plan.tenant = Some(TenantUsage {
        gate: state.tenants.clone(),
        who,
    });
    let shape = Shape {
        tokenizer: state.tokenizer.clone(),
        logprobs: plan.top_logprobs.is_some(),
        keep: samples.n,
        echo,
        include_usage,
        tools: tools.map_or(ToolMode::Off, |t| t.mode(&meta.id)),
        meta,
    };
    if samples.best_of > samples.n {
        // Ranking the samples needs every token's logprob.
        plan.top_logprobs.get_or_insert(0);
    }
    let generations = Generation::start(
        &state.engine,
        state.tokenizer.clone(),
        state.metrics.clone(),
        plan,
        samples.best_of,
    )
    .await?;
    if stream {
        Ok(answer::sse(generations, shape))
    } else {
        answer::collect(generations, shape).await
    }
}

/// Validate a body and turn it into a plan; every rejection is a 4xx.
fn plan(
    state: &HttpState,
    req: CompletionBody,
    api: Api,
    arrived: Instant,
    tools: Option<&ToolRequest>,
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
    let sampling = sampling_params(&req)?;
    let top_logprobs = top_logprobs(&req, api)?;
    let stop_strings = req.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop_strings.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            format!("at most {MAX_STOP_STRINGS} stop sequences are supported"),
            Some("stop"),
        ));
    }
    let (prompt, prompt_param) = match api {
        Api::Chat => (chat_prompt(state, req.messages, tools)?, "messages"),
        Api::Completion => (completion_prompt(state, req.prompt)?, "prompt"),
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
        top_logprobs,
    })
}

/// Most samples per request (`n`, `best_of`).
const MAX_SAMPLES: u64 = 16;

/// How many samples to generate (`best_of`, default `n`) and return (`n`).
pub(super) struct Samples {
    pub n: usize,
    pub best_of: usize,
}

fn samples(req: &CompletionBody) -> Result<Samples, ApiError> {
    let n = req.n.unwrap_or(1);
    if !(1..=MAX_SAMPLES).contains(&n) {
        return Err(ApiError::invalid(
            format!("n must be between 1 and {MAX_SAMPLES}"),
            Some("n"),
        ));
    }
    let best_of = req.best_of.unwrap_or(n);
    if best_of < n || best_of > MAX_SAMPLES {
        return Err(ApiError::invalid(
            format!("best_of must be between n and {MAX_SAMPLES}"),
            Some("best_of"),
        ));
    }
    Ok(Samples {
        n: n as usize,
        best_of: best_of as usize,
    })
}

/// Completions `echo`: the prompt as text (decoded when sent as token ids).
fn echo_text(state: &HttpState, req: &CompletionBody) -> Option<String> {
    if !req.echo {
        return None;
    }
    match &req.prompt {
        Some(PromptIn::Text(t)) => Some(t.clone()),
        Some(PromptIn::Texts(t)) => t.first().cloned(),
        Some(PromptIn::Tokens(ids)) => Some(state.tokenizer.decode(ids)),
        None => None,
    }
}

/// How many alternatives to report per token (None: no logprobs). Chat:
/// `logprobs: true` and `top_logprobs` 0..=20; completions: `logprobs` 0..=5.
fn top_logprobs(req: &CompletionBody, api: Api) -> Result<Option<usize>, ApiError> {
    let logprobs = req.logprobs.as_ref().filter(|v| !v.is_null());
    match api {
        Api::Chat => {
            let on = match logprobs {
                None => false,
                Some(v) => v.as_bool().ok_or_else(|| {
                    ApiError::invalid("logprobs must be a boolean", Some("logprobs"))
                })?,
            };
            match req.top_logprobs {
                Some(k) if k as usize > MAX_TOP_LOGPROBS_CHAT => Err(ApiError::invalid(
                    format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS_CHAT}"),
                    Some("top_logprobs"),
                )),
                Some(_) if !on => Err(ApiError::invalid(
                    "top_logprobs requires logprobs to be true",
                    Some("top_logprobs"),
                )),
                k => Ok(on.then_some(k.unwrap_or(0) as usize)),
            }
        }
        Api::Completion => {
            let Some(v) = logprobs else { return Ok(None) };
            let k = v
                .as_u64()
                .filter(|&k| k as usize <= MAX_TOP_LOGPROBS_COMPLETION)
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!("logprobs must be an integer between 0 and {MAX_TOP_LOGPROBS_COMPLETION}"),
                        Some("logprobs"),
                    )
                })?;
            if req.echo {
                return Err(ApiError::invalid(
                    "logprobs with echo needs the prompt's logprobs, which this server does not compute",
                    Some("echo"),
                )
                .with_code("unsupported_parameter"));
            }
            Ok(Some(k as usize))
        }
    }
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
        constraint: None,
    })
}

fn chat_prompt(
    state: &HttpState,
    messages: Option<Vec<super::openai::MessageIn>>,
    tools: Option<&ToolRequest>,
) -> Result<Vec<u32>, ApiError> {
    let messages =
        messages.ok_or_else(|| ApiError::invalid("messages is required", Some("messages")))?;
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    let mut messages = convert_messages(messages)?;
    let template = &state.chat_template;
    let defs = tools.map(ToolRequest::tools);
    let native = template.has_tools();
    if !native {
        // Hermes-style fallback: tools in the system text, calls in content.
        messages = fallback_messages(messages, defs);
    }
    let mut text = template
        .render_with_tools(&messages, defs.filter(|_| native), true)
        .map_err(|e| match e {
            EngineError::InvalidRequest(m) => ApiError::invalid(m, Some("messages")),
            other => ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        })?;
    if let Some(t) = tools {
        text.push_str(&t.forced_prefix());
    }
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
