//! Turning one request's generations (one per choice, `n` of them) into
//! the answer: one JSON object, or an SSE stream of chunks ending with
//! `data: [DONE]`.
//!
//! The SSE stream owns every generation: when the client disconnects axum
//! drops the stream, which drops the event receivers and so cancels every
//! sample in the scheduler. Chunks of different choices interleave as their
//! tokens arrive, each tagged with its `index`. `usage` sums the completion
//! tokens of all choices and counts the prompt once (the samples share it).
//! A prefill-role engine's `kv_transfer_params` rides on the object or on
//! the last chunk before `[DONE]`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, StreamExt};
use serde_json::{json, Value};

use super::generate::{Generation, Step};
use super::logprobs::{chat_json, completion_json, TokenLogprob};
use super::openai::ApiError;
use super::response::{attach_transfer, Api, ResponseMeta};
use super::tools::ToolMode;
use crate::request::{TransferParams, Usage};
use crate::tokenizer::Tokenizer;

/// How the generated text is presented.
pub(super) struct Shape {
    pub meta: ResponseMeta,
    pub tokenizer: Arc<Tokenizer>,
    /// Report logprobs (the generations were started with them).
    pub logprobs: bool,
    /// Choices to return: with `best_of` more samples than this, the
    /// `keep` with the highest total logprob (non-streamed only).
    pub keep: usize,
    /// Completions `echo`: the prompt text, put before each choice's text.
    pub echo: Option<String>,
    /// Streaming: a last chunk with `usage`.
    pub include_usage: bool,
    /// Chat with tools: how the text becomes tool calls.
    pub tools: ToolMode,
}

impl Shape {
    fn logprobs_json(&self, tokens: &[TokenLogprob], offset: usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        match self.meta.api {
            Api::Chat => chat_json(&self.tokenizer, tokens),
            Api::Completion => completion_json(&self.tokenizer, tokens, offset),
        }
    }
}

/// One choice's whole output.
#[derive(Default)]
struct Sample {
    text: String,
    logprobs: Vec<TokenLogprob>,
}

fn add_usage(total: &mut Option<Usage>, u: Usage) {
    match total {
        None => *total = Some(u),
        Some(t) => t.completion_tokens += u.completion_tokens,
    }
}

async fn collect_one(
    mut generation: Generation,
) -> Result<(Sample, &'static str, Usage, Option<TransferParams>), ApiError> {
    let mut sample = Sample::default();
    while let Some(step) = generation.next().await {
        match step {
            Step::Text(t) => sample.text.push_str(&t),
            Step::Logprob(lp) => sample.logprobs.push(lp),
            Step::Done {
                finish_reason,
                usage,
            } => {
                let transfer = generation.transfer_params().cloned();
                return Ok((sample, finish_reason, usage, transfer));
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

/// The non-streamed answer: every choice collected.
pub(super) async fn collect(
    generations: Vec<Generation>,
    shape: Shape,
) -> Result<Response, ApiError> {
    let outs = futures::future::join_all(generations.into_iter().map(collect_one)).await;
    let mut usage = None;
    let mut transfer = None;
    let mut samples = Vec::with_capacity(outs.len());
    for out in outs {
        let (sample, finish_reason, u, t) = out?;
        add_usage(&mut usage, u);
        transfer = transfer.or(t);
        samples.push((sample, finish_reason));
    }
    if samples.len() > shape.keep {
        // best_of: the most likely samples, in sample order among equals.
        let total = |s: &Sample| -> f64 { s.logprobs.iter().map(|t| t.logprob).sum() };
        samples.sort_by(|a, b| total(&b.0).total_cmp(&total(&a.0)));
        samples.truncate(shape.keep);
    }
    let mut choices = Vec::with_capacity(samples.len());
    for (index, (sample, finish_reason)) in samples.into_iter().enumerate() {
        let echo = shape.echo.as_deref().unwrap_or_default();
        let text = format!("{echo}{}", sample.text);
        let logprobs = shape.logprobs_json(&sample.logprobs, echo.len());
        let (message, finish_reason) = shape.tools.message(&sample.text, finish_reason);
        choices.push(
            shape
                .meta
                .choice(index, &text, message, finish_reason, logprobs),
        );
    }
    let usage = usage.unwrap_or_default();
    let mut v = shape.meta.full_response(choices, &usage);
    attach_transfer(&mut v, transfer.as_ref(), &usage);
    Ok(axum::Json(v).into_response())
}

/// What one sample's stream yields: its index, the step, and at `Done` the
/// saved blocks (if any).
type Tagged = (usize, Step, Option<TransferParams>);

fn tagged(index: usize, generation: Generation) -> impl futures::Stream<Item = Tagged> {
    stream::unfold(Some(generation), move |g| async move {
        let mut g = g?;
        let step = g.next().await?;
        let transfer = matches!(step, Step::Done { .. })
            .then(|| g.transfer_params().cloned())
            .flatten();
        Some(((index, step, transfer), Some(g)))
    })
}

/// One SSE response; dropping it drops the generations (cancel).
struct SseState<S> {
    steps: S,
    shape: Shape,
    outbox: VecDeque<Event>,
    /// Per choice: logprobs not yet sent, text length sent so far, tool
    /// text held back, finished.
    pending: Vec<Vec<TokenLogprob>>,
    offsets: Vec<usize>,
    held: Vec<String>,
    open: usize,
    usage: Option<Usage>,
    transfer: Option<TransferParams>,
    ended: bool,
}

fn data(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

impl<S> SseState<S> {
    fn on_step(&mut self, index: usize, step: Step, transfer: Option<TransferParams>) {
        match step {
            Step::Logprob(lp) => self.pending[index].push(lp),
            Step::Text(t) => {
                if self.shape.tools.holds_text() {
                    // Tool calls are only known once the whole text is in.
                    self.held[index].push_str(&t);
                    return;
                }
                let lps = std::mem::take(&mut self.pending[index]);
                let logprobs = self.shape.logprobs_json(&lps, self.offsets[index]);
                self.offsets[index] += t.len();
                let chunk = self.shape.meta.text_chunk(index, &t, logprobs);
                self.outbox.push_back(data(&chunk));
            }
            Step::Done {
                finish_reason,
                usage,
            } => {
                let mut finish_reason = finish_reason;
                if self.shape.tools.holds_text() {
                    let text = std::mem::take(&mut self.held[index]);
                    let (deltas, reason) = self.shape.tools.deltas(&text, finish_reason);
                    for delta in deltas {
                        self.outbox
                            .push_back(data(&self.shape.meta.delta_chunk(index, delta)));
                    }
                    finish_reason = reason;
                }
                let lps = std::mem::take(&mut self.pending[index]);
                if !lps.is_empty() {
                    let logprobs = self.shape.logprobs_json(&lps, self.offsets[index]);
                    let chunk = self.shape.meta.text_chunk(index, "", logprobs);
                    self.outbox.push_back(data(&chunk));
                }
                add_usage(&mut self.usage, usage);
                self.transfer = self.transfer.take().or(transfer);
                self.open -= 1;
                let last = self.shape.meta.final_chunk(index, finish_reason);
                if self.open > 0 {
                    self.outbox.push_back(data(&last));
                    return;
                }
                self.finish(last);
            }
            Step::Failed(message) => {
                let err = ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, message);
                self.outbox.push_back(data(&err.body()));
                self.outbox.push_back(Event::default().data("[DONE]"));
                self.ended = true;
            }
        }
    }

    /// The last choice finished: usage, saved blocks, `[DONE]`.
    fn finish(&mut self, mut last: Value) {
        let usage = self.usage.unwrap_or_default();
        if self.shape.include_usage {
            self.outbox.push_back(data(&last));
            last = self.shape.meta.usage_chunk(&usage);
        }
        // The last chunk before [DONE] carries kv_transfer_params.
        attach_transfer(&mut last, self.transfer.as_ref(), &usage);
        self.outbox.push_back(data(&last));
        self.outbox.push_back(Event::default().data("[DONE]"));
        self.ended = true;
    }
}

/// The streamed answer.
pub(super) fn sse(generations: Vec<Generation>, shape: Shape) -> Response {
    let n = generations.len();
    let mut outbox = VecDeque::new();
    for index in 0..n {
        let mut first = match shape.meta.api {
            Api::Chat => shape
                .meta
                .delta_chunk(index, json!({"role": "assistant", "content": ""})),
            Api::Completion => Value::Null,
        };
        if let Some(echo) = &shape.echo {
            first = shape.meta.text_chunk(index, echo, Value::Null);
        }
        if !first.is_null() {
            outbox.push_back(data(&first));
        }
    }
    let echo_len = shape.echo.as_ref().map_or(0, String::len);
    let steps = stream::select_all(
        generations
            .into_iter()
            .enumerate()
            .map(|(i, g)| Box::pin(tagged(i, g))),
    );
    let state = SseState {
        steps,
        shape,
        outbox,
        pending: vec![Vec::new(); n],
        offsets: vec![echo_len; n],
        held: vec![String::new(); n],
        open: n,
        usage: None,
        transfer: None,
        ended: false,
    };
    let stream = stream::unfold(state, |mut s| async move {
        loop {
            if let Some(event) = s.outbox.pop_front() {
                return Some((Ok::<Event, Infallible>(event), s));
            }
            if s.ended {
                return None;
            }
            match s.steps.next().await {
                Some((index, step, transfer)) => s.on_step(index, step, transfer),
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
    use super::super::generate::GenerationPlan;
    use super::*;
    use crate::request::{EngineHandle, FinishReason, GenerationEvent, SamplingParams, Usage};
    use crate::tokenizer::{PreTokenizerKind, Tokenizer, TokenizerSpec};
    use kvfabric_types::BlockKey;
    use std::time::Instant;
    use tokio::sync::mpsc;

    fn meta(api: Api) -> ResponseMeta {
        ResponseMeta {
            api,
            id: "cmpl-1".into(),
            created: 1,
            model: "m".into(),
        }
    }

    fn shape(api: Api, include_usage: bool) -> Shape {
        Shape {
            meta: meta(api),
            tokenizer: Arc::new(byte_tokenizer()),
            logprobs: false,
            keep: 1,
            echo: None,
            include_usage,
            tools: ToolMode::Off,
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
            top_logprobs: None,
        };
        Generation::start(
            &EngineHandle::new(submit),
            Arc::new(byte_tokenizer()),
            crate::http::EngineMetrics::new(),
            plan,
            1,
        )
        .await
        .expect("submitted")
        .remove(0)
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
        let response = collect(
            vec![prefill_generation().await],
            shape(Api::Completion, false),
        )
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
        let response = sse(vec![prefill_generation().await], shape(Api::Chat, true));
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
        let response = sse(
            vec![prefill_generation().await],
            shape(Api::Completion, false),
        );
        let events = sse_events(response).await;
        let last = events.last().expect("chunks");
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert_eq!(last["kv_transfer_params"], expected_params());
    }
}
