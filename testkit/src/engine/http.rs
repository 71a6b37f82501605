//! Shared by the engine's HTTP tests: a scripted scheduler stand-in, a server
//! on 127.0.0.1:0 and a small hyper client.
//!
//! The stand-in answers through the `EngineHandle` channel exactly as the
//! scheduler does (token events, then `Finished`) and reports what it received
//! and whether the request was cancelled (its event receiver dropped). Markers
//! in the prompt pick the script: `FAIL` -> an error event, `SLOW` -> a token
//! every 10 ms until cancelled or `max_tokens`, `TOOLCALL` -> a reply
//! with two Hermes-style tool calls.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use kvfabric_engine::chat::ChatTemplate;
use kvfabric_engine::http::{EngineMetrics, HttpState};
use kvfabric_engine::tokenizer::{PreTokenizerKind, Tokenizer, TokenizerSpec};
use kvfabric_engine::{
    EngineHandle, FinishReason, GenerationEvent, GenerationRequest, SamplingParams, Usage,
};
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

pub const MODEL: &str = "smol-test";
pub const CONTEXT: usize = 2048;
pub const REPLY: &str = "The capital of France is Paris. 🚀 END tail";
/// The reply to a prompt containing `TOOLCALL`: text, then two calls.
pub const TOOL_REPLY: &str = "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}</tool_call>";
pub const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// What the stand-in saw for one request.
#[derive(Debug)]
pub struct Seen {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_token_ids: Vec<u32>,
    /// The namespace the request's blocks would be keyed under.
    pub namespace: Vec<u8>,
    /// Tokens sent before the receiver was found dropped (None: ran to the end).
    pub cancelled_after: Option<usize>,
}

/// Byte-level vocabulary (every byte one token) plus three control tokens.
pub fn tokenizer() -> Tokenizer {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut n = 0u32;
    for b in 0u32..256 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let c = if printable {
            b
        } else {
            n += 1;
            255 + n
        };
        tokens.push(char::from_u32(c).expect("valid char").to_string());
    }
    let mut token_types = vec![3; 3];
    token_types.resize(tokens.len(), 1);
    Tokenizer::from_spec(TokenizerSpec {
        tokens,
        token_types,
        merges: Vec::new(),
        pre: Some(PreTokenizerKind::Smollm),
        bos_id: Some(1),
        eos_id: Some(2),
        unknown_id: Some(0),
        add_bos: false,
    })
    .expect("test vocabulary")
}

/// Scripted scheduler: replies REPLY (or an error / a slow endless stream,
/// depending on markers in the prompt).
pub async fn stand_in(
    tokenizer: Arc<Tokenizer>,
    mut intake: mpsc::Receiver<GenerationRequest>,
    seen: mpsc::UnboundedSender<Seen>,
    metrics: EngineMetrics,
) {
    while let Some(req) = intake.recv().await {
        let tokenizer = tokenizer.clone();
        let seen = seen.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            metrics.kv_blocks_used.set(3);
            let prompt_text = tokenizer.decode(&req.prompt);
            let mut record = Seen {
                prompt: req.prompt.clone(),
                max_tokens: req.max_tokens,
                sampling: req.sampling.clone(),
                stop_token_ids: req.stop_token_ids.clone(),
                namespace: req.namespace.clone(),
                cancelled_after: None,
            };
            if prompt_text.contains("FAIL") {
                let _ = req.events.send(GenerationEvent::Error("boom".into())).await;
                let _ = seen.send(record);
                return;
            }
            let slow = prompt_text.contains("SLOW");
            let reply = if prompt_text.contains("TOOLCALL") {
                tokenizer.encode(TOOL_REPLY, false)
            } else {
                tokenizer.encode(REPLY, false)
            };
            let mut sent = 0;
            loop {
                if sent == req.max_tokens || (!slow && sent == reply.len()) {
                    let usage = Usage {
                        prompt_tokens: req.prompt.len(),
                        completion_tokens: sent,
                        cached_tokens: req.prompt.len() / 2,
                    };
                    let reason = if sent == req.max_tokens {
                        FinishReason::Length
                    } else {
                        FinishReason::Stop
                    };
                    if req
                        .events
                        .send(GenerationEvent::Finished { reason, usage })
                        .await
                        .is_err()
                    {
                        record.cancelled_after = Some(sent);
                    }
                    break;
                }
                // A step of "compute" between tokens, as a real step loop has.
                tokio::time::sleep(Duration::from_millis(if slow { 10 } else { 1 })).await;
                let id = reply[sent % reply.len()];
                if req
                    .events
                    .send(GenerationEvent::Token { id, logits: None })
                    .await
                    .is_err()
                {
                    record.cancelled_after = Some(sent);
                    break;
                }
                sent += 1;
            }
            let _ = seen.send(record);
        });
    }
}

pub struct Server {
    pub addr: SocketAddr,
    pub seen: mpsc::UnboundedReceiver<Seen>,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Arc<ChatTemplate>,
    /// Dropping or sending on it starts a graceful shutdown.
    pub shutdown: oneshot::Sender<()>,
    /// The `serve` task.
    pub task: tokio::task::JoinHandle<Result<(), kvfabric_engine::EngineError>>,
}

pub async fn start() -> Server {
    start_with(true).await
}

pub async fn start_with(engine_running: bool) -> Server {
    start_gated(engine_running, None).await
}

/// A server whose `/v1/*` checks the tenants file at `tenants` (reloaded
/// every 50 ms), or single-tenant mode with `None`.
pub async fn start_gated(engine_running: bool, tenants: Option<&std::path::Path>) -> Server {
    let tokenizer = Arc::new(tokenizer());
    let template = Arc::new(
        ChatTemplate::new(SMOLLM2_TEMPLATE, "<|im_start|>", "<|im_end|>").expect("template"),
    );
    let metrics = EngineMetrics::new();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let gate = kvfabric_tenants::TenantGate::from_config(tenants, Default::default(), "test")
        .expect("tenants file");
    gate.metrics().register(&mut registry);
    gate.spawn_reloader(Duration::from_millis(50));
    let (submit, intake) = mpsc::channel(16);
    let (seen_tx, seen) = mpsc::unbounded_channel();
    if engine_running {
        tokio::spawn(stand_in(
            tokenizer.clone(),
            intake,
            seen_tx,
            metrics.clone(),
        ));
    } else {
        drop(intake);
    }
    let state = HttpState::new(
        EngineHandle::new(submit),
        tokenizer.clone(),
        template.clone(),
        MODEL,
        CONTEXT,
        metrics,
        Arc::new(registry),
    )
    .with_tenants(gate);
    let (addr, shutdown_tx, task) = super::serve_on_loopback(state).await;
    Server {
        addr,
        seen,
        tokenizer,
        template,
        shutdown: shutdown_tx,
        task,
    }
}

pub type Resp = hyper::Response<hyper::body::Incoming>;

pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Resp {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    sender.send_request(req).await.expect("response")
}

pub async fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let resp = send(addr, method, path, body, &[]).await;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (
        status,
        String::from_utf8(bytes.to_vec()).expect("utf-8 body"),
    )
}

pub async fn call_json(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    let (status, text) = call(addr, "POST", path, &body.to_string()).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")),
    )
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(str::to_owned)
        .collect()
}

pub async fn next_seen(server: &mut Server) -> Seen {
    tokio::time::timeout(Duration::from_secs(10), server.seen.recv())
        .await
        .expect("stand-in reports in time")
        .expect("stand-in alive")
}

pub fn chat_body(content: &str) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0})
}

pub fn assert_openai_error(status: u16, v: &Value, want_status: u16, param: Option<&str>) {
    assert_eq!(status, want_status, "{v}");
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e.get("code").is_some(), "{v}");
    match param {
        Some(p) => assert_eq!(e["param"], p, "{v}"),
        None => assert!(e.get("param").is_some(), "{v}"),
    }
}
