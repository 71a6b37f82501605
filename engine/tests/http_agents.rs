//! The API agents use, end to end over the real scheduler and the
//! reference model: logprobs (the top alternative is the greedy token,
//! streamed and not), `n` samples from one prefill, tool calls and
//! structured output.

mod common;
mod http_support;

use std::net::SocketAddr;
use std::sync::Arc;

use bytesize::ByteSize;
use common::model_path;
use http_support::{call, call_json, sse_data};
use kvfabric_engine::chat::ChatTemplate;
use kvfabric_engine::gguf::GgufFile;
use kvfabric_engine::http::{serve, EngineMetrics, HttpState};
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::tokenizer::Tokenizer;
use kvfabric_engine::EngineConfig;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};

const MODEL_NAME: &str = "smollm2";

/// The engine and its API on 127.0.0.1:0; dropped with the test's runtime.
struct RealServer {
    addr: SocketAddr,
    _engine: kvfabric_engine::RunningEngine,
}

async fn real_server() -> RealServer {
    let path = model_path();
    let gguf = GgufFile::open(&path).expect("GGUF opens");
    let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf).expect("tokenizer"));
    let template = Arc::new(ChatTemplate::from_gguf(&gguf, &tokenizer).expect("template"));
    let model = Arc::new(LlamaModel::load(&path, |_, _| {}).expect("model loads"));
    let context = model.config.context_length;
    let cfg = EngineConfig {
        threads: 2,
        block_tokens: 16,
        kv_pool: ByteSize::mib(64),
        ..EngineConfig::default()
    };
    let engine = kvfabric_engine::EngineBuilder::new(cfg)
        .start(model)
        .expect("engine starts");
    let metrics = EngineMetrics::new();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let state = HttpState::new(
        engine.handle.clone(),
        tokenizer,
        template,
        MODEL_NAME,
        context,
        metrics,
        Arc::new(registry),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(serve(listener, state, std::future::pending()));
    RealServer {
        addr,
        _engine: engine,
    }
}

fn chunks(sse: &str) -> Vec<Value> {
    let data = sse_data(sse);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{sse}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).expect("chunk JSON"))
        .collect()
}

/// Every chat logprobs entry: its top alternative is itself (greedy).
fn assert_top_is_greedy(content: &[Value]) {
    assert!(!content.is_empty());
    for e in content {
        let top = e["top_logprobs"].as_array().expect("top_logprobs");
        assert_eq!(top.len(), 3, "{e}");
        assert_eq!(top[0]["token"], e["token"], "{e}");
        assert_eq!(top[0]["logprob"], e["logprob"], "{e}");
        let lp = e["logprob"].as_f64().expect("number");
        assert!(
            lp <= 0.0 && top[1]["logprob"].as_f64().expect("number") <= lp,
            "{e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_top_token_is_the_greedy_token_streamed_and_not() {
    let server = real_server().await;
    let addr = server.addr;
    let body = json!({
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0,
        "max_tokens": 12,
        "logprobs": true,
        "top_logprobs": 3,
    });
    let (status, v) = call_json(addr, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs.content");
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().expect("usage")
    );
    assert_top_is_greedy(content);
    let joined: String = content
        .iter()
        .map(|e| e["token"].as_str().unwrap_or_default())
        .collect();
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("text");
    assert_eq!(joined, text, "tokens spell the answer");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, sse) = call(addr, "POST", "/v1/chat/completions", &streamed.to_string()).await;
    assert_eq!(status, 200);
    let streamed_content: Vec<Value> = chunks(&sse)
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(&streamed_content, content, "same logprobs streamed");

    // Completions: parallel arrays, top alternative = the chosen token.
    let (status, v) = call_json(
        addr,
        "/v1/completions",
        json!({"model": MODEL_NAME, "prompt": "The capital of France is", "temperature": 0, "max_tokens": 6, "logprobs": 2}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().expect("tokens");
    assert_eq!(tokens.len(), 6);
    for (i, t) in tokens.iter().enumerate() {
        let top = lp["top_logprobs"][i].as_object().expect("top map");
        assert_eq!(top.len(), 2, "{lp}");
        let best = top
            .iter()
            .max_by(|a, b| {
                a.1.as_f64()
                    .unwrap_or(f64::MIN)
                    .total_cmp(&b.1.as_f64().unwrap_or(f64::MIN))
            })
            .expect("entries");
        assert_eq!(best.0.as_str(), t.as_str().expect("token"), "{lp}");
        assert_eq!(best.1, &lp["token_logprobs"][i]);
    }
    // Echo puts the prompt first; echo with logprobs is refused, by name.
    let (status, v) = call_json(
        addr,
        "/v1/completions",
        json!({"model": MODEL_NAME, "prompt": "The capital of France is", "temperature": 0, "max_tokens": 4, "echo": true}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert!(v["choices"][0]["text"]
        .as_str()
        .is_some_and(|t| t.starts_with("The capital of France is")));
    let (status, v) = call_json(
        addr,
        "/v1/completions",
        json!({"model": MODEL_NAME, "prompt": "x", "max_tokens": 4, "echo": true, "logprobs": 1}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "echo");
}
