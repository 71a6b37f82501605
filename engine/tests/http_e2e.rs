//! End to end: the real scheduler (`kvfabric_engine::EngineBuilder`) behind the
//! OpenAI HTTP API, with the reference model. Greedy chat "What is the
//! capital of France?" mentions Paris; streamed and unstreamed answers are
//! identical; a stop sequence cuts the answer and the engine keeps serving;
//! the same seed gives the same sampled completion.

use kvfabric_testkit::engine::http as http_support;

use http_support::{call, call_json, sse_data};
use kvfabric_testkit::engine::server::{real_server, MODEL_NAME};
use serde_json::{json, Value};

fn streamed_content(sse: &str) -> String {
    let data = sse_data(sse);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{sse}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).expect("chunk JSON"))
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_over_the_real_scheduler_says_paris_streamed_and_not() {
    let server = real_server().await;
    let addr = server.addr;

    let body = json!({
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0,
        "max_tokens": 32,
    });
    let (status, v) = call_json(addr, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(text.contains("Paris"), "answer: {text:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], 37);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, sse) = call(addr, "POST", "/v1/chat/completions", &streamed.to_string()).await;
    assert_eq!(status, 200);
    assert_eq!(streamed_content(&sse), text);
    assert!(sse.contains("\"cached_tokens\""), "{sse}");

    // A stop sequence inside the answer: cut before it, then the engine still serves.
    let mut stopped = body.clone();
    stopped["stop"] = json!("Paris");
    let (status, v) = call_json(addr, "/v1/chat/completions", stopped).await;
    assert_eq!(status, 200, "{v}");
    let cut = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(
        !cut.contains("Paris") && text.starts_with(cut),
        "{cut:?} vs {text:?}"
    );
    // Cut by a stop string, the usage still reports the reused prefix
    // (two full 16-token blocks of the 37-token prompt seen twice before).
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"], 32,
        "{v}"
    );
    let (status, v) = call_json(addr, "/v1/chat/completions", body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], text.as_str());

    // Seeded sampling through the whole stack repeats itself exactly.
    let seeded = json!({
        "model": MODEL_NAME,
        "prompt": "Once upon a time",
        "temperature": 0.9,
        "top_p": 0.95,
        "top_k": 50,
        "seed": 7,
        "max_tokens": 16,
    });
    let (status, first) = call_json(addr, "/v1/completions", seeded.clone()).await;
    assert_eq!(status, 200, "{first}");
    let (_, second) = call_json(addr, "/v1/completions", seeded).await;
    assert_eq!(first["choices"][0]["text"], second["choices"][0]["text"]);
    assert!(first["choices"][0]["text"]
        .as_str()
        .is_some_and(|t| !t.is_empty()));

    server.shut_down().await;
}
