//! The OpenAI HTTP layer against a scripted scheduler stand-in: completions,
//! streaming, stop sequences, sampling parameters and usage.
//!
//! A real axum server on 127.0.0.1:0 (see `http_support`); this tests the
//! HTTP layer only; the model end-to-end test is `http_e2e.rs`.

use kvfabric_testkit::engine::http as http_support;

use http_body_util::BodyExt;
use http_support::*;
use kvfabric_engine::SamplingParams;
use serde_json::{json, Value};

#[tokio::test]
async fn chat_completion_returns_text_usage_and_templated_prompt() {
    let mut server = start().await;
    let (status, v) = call_json(
        server.addr,
        "/v1/chat/completions",
        chat_body("What is the capital of France?"),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], REPLY);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let seen = next_seen(&mut server).await;
    let rendered = server
        .template
        .render(
            &[kvfabric_engine::chat::ChatMessage::new(
                "user",
                "What is the capital of France?",
            )],
            true,
        )
        .expect("renders");
    assert_eq!(seen.prompt, server.tokenizer.encode(&rendered, true));
    assert_eq!(seen.prompt[0], 1, "<|im_start|> parsed as a special id");
    assert_eq!(seen.stop_token_ids, vec![0, 2]);
    assert_eq!(seen.max_tokens, CONTEXT - seen.prompt.len());
    assert_eq!(seen.sampling.temperature, 0.0);
    let usage = &v["usage"];
    assert_eq!(usage["prompt_tokens"], seen.prompt.len());
    assert_eq!(
        usage["completion_tokens"],
        server.tokenizer.encode(REPLY, false).len()
    );
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"],
        seen.prompt.len() / 2
    );
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap_or(0)
                + usage["completion_tokens"].as_u64().unwrap_or(0)
        )
    );
}

#[tokio::test]
async fn streamed_chat_equals_unstreamed_and_ends_with_done_and_usage() {
    let server = start().await;
    let mut body = chat_body("hi");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = send(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &body.to_string(),
        &[("x-session-affinity", "session-42")],
    )
    .await;
    assert_eq!(resp.status(), 200);
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
            .to_vec(),
    )
    .expect("utf-8");
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{text}");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("chunk JSON"))
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, REPLY);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let usage_chunk = &chunks[chunks.len() - 1];
    assert_eq!(usage_chunk["choices"], json!([]));
    assert!(
        usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .is_some_and(|c| c > 0)
    );
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
}

#[tokio::test]
async fn stop_sequence_truncates_and_cancels_the_request() {
    let mut server = start().await;
    let body =
        json!({"model": MODEL, "prompt": "Say it", "stop": ["NOPE", "END"], "temperature": 0});
    let (status, v) = call_json(server.addr, "/v1/completions", body.clone()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(
        v["choices"][0]["text"],
        "The capital of France is Paris. 🚀 "
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let seen = next_seen(&mut server).await;
    let cancelled = seen
        .cancelled_after
        .expect("the receiver was dropped at the stop string");
    assert!(
        cancelled < server.tokenizer.encode(REPLY, false).len(),
        "{cancelled}"
    );
    // Streamed: same text, no stop string, ends with [DONE].
    let mut body = body;
    body["stream"] = json!(true);
    body["stop"] = json!("END");
    let (status, text) = call(server.addr, "POST", "/v1/completions", &body.to_string()).await;
    assert_eq!(status, 200);
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let streamed: String = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).expect("chunk"))
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(streamed, "The capital of France is Paris. 🚀 ");
    assert!(next_seen(&mut server).await.cancelled_after.is_some());
}

#[tokio::test]
async fn max_tokens_ends_with_length_and_sampling_params_pass_through() {
    let mut server = start().await;
    let body = json!({"model": MODEL, "prompt": "x", "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 1234});
    let (status, v) = call_json(server.addr, "/v1/completions", body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], "The c");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    let seen = next_seen(&mut server).await;
    assert_eq!(seen.max_tokens, 5);
    assert_eq!(
        seen.sampling,
        SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            top_k: 40,
            seed: Some(1234),
            constraint: None,
        }
    );
    // OpenAI defaults when absent: temperature 1, top_p 1, no top_k, no seed.
    let (status, _) = call_json(
        server.addr,
        "/v1/completions",
        json!({"model": MODEL, "prompt": [5, 6, 7]}),
    )
    .await;
    assert_eq!(status, 200);
    let seen = next_seen(&mut server).await;
    assert_eq!(seen.prompt, vec![5, 6, 7]);
    assert_eq!(
        seen.sampling,
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            constraint: None,
        }
    );
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

/// Tools through the Hermes fallback (the test template has no tool
/// section): definitions and earlier calls reach the prompt, the reply's
/// `<tool_call>` blocks come back as `tool_calls`, streamed and not.
#[tokio::test]
async fn tool_calls_render_parse_and_stream() {
    let mut server = start().await;
    let a = server.addr;
    let body = json!({
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "TOOLCALL weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "-3C"},
        ],
        "tools": tools(),
    });
    let (s, v) = call_json(a, "/v1/chat/completions", body.clone()).await;
    assert_eq!(s, 200, "{v}");
    let prompt = tokenizer().decode(&next_seen(&mut server).await.prompt);
    assert!(
        prompt.contains("<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather in a city\""),
        "{prompt}"
    );
    assert!(prompt.contains("<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>"), "{prompt}");
    assert!(
        prompt.contains("<tool_response>\n-3C\n</tool_response>"),
        "{prompt}"
    );
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["content"], "Checking.");
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .expect("tool_calls");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
    assert_ne!(calls[0]["id"], calls[1]["id"]);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (s, sse) = call(a, "POST", "/v1/chat/completions", &streamed.to_string()).await;
    assert_eq!(s, 200);
    let chunks: Vec<Value> = sse_data(&sse)
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("chunk"))
        .collect();
    let deltas: Vec<&Value> = chunks
        .iter()
        .flat_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(deltas.len(), 2, "{sse}");
    assert_eq!(deltas[1]["index"], 1);
    assert_eq!(deltas[1]["function"]["arguments"], "{\"city\":\"Rome\"}");
    assert_eq!(
        chunks.last().expect("chunks")["choices"][0]["finish_reason"],
        "tool_calls"
    );

    // parallel_tool_calls false keeps one; tool_choice none leaves tools out.
    let mut one = body.clone();
    one["parallel_tool_calls"] = json!(false);
    let (_, v) = call_json(a, "/v1/chat/completions", one).await;
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    let _ = next_seen(&mut server).await;
    let _ = next_seen(&mut server).await;
    let mut none = body.clone();
    none["tool_choice"] = json!("none");
    let (_, v) = call_json(a, "/v1/chat/completions", none).await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());
    let prompt = tokenizer().decode(&next_seen(&mut server).await.prompt);
    assert!(!prompt.contains("<tools>"), "{prompt}");
    // A named function: the prompt ends inside its call.
    let mut named = body.clone();
    named["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
    let _ = call_json(a, "/v1/chat/completions", named).await;
    let prompt = tokenizer().decode(&next_seen(&mut server).await.prompt);
    assert!(
        prompt.ends_with("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "),
        "{prompt}"
    );
    // A tool message without its call id is refused, by name.
    let mut bad = body;
    bad["messages"][2] = json!({"role": "tool", "content": "x"});
    let (s, v) = call_json(a, "/v1/chat/completions", bad).await;
    assert_openai_error(s, &v, 400, Some("messages[2].tool_call_id"));
}
