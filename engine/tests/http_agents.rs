//! The API agents use, end to end over the real scheduler and the
//! reference model: logprobs (the top alternative is the greedy token,
//! streamed and not), `n` samples from one prefill, tool calls and
//! structured output.

use kvfabric_testkit::engine::http as http_support;

use std::net::SocketAddr;

use http_support::{call, call_json, sse_data};
use kvfabric_testkit::engine::server::{real_server, MODEL_NAME};
use serde_json::{json, Value};

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

/// The value of a counter in the Prometheus text of `GET /metrics`.
async fn counter(addr: SocketAddr, name: &str) -> f64 {
    let (status, text) = call(addr, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in metrics:\n{text}"))
}

const COMPUTED: &str = "kvfabric_engine_prompt_tokens_computed_total";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_samples_share_one_prefill_and_repeat_with_a_seed() {
    let server = real_server().await;
    let addr = server.addr;
    greedy_samples_equal_the_greedy_answer(addr).await;
    sampled_samples_share_one_prefill_and_repeat_with_a_seed(addr).await;
    best_of_keeps_one_of_the_samples(addr).await;
}

/// The text of choice `i` of a chat answer.
fn text_of(v: &Value, i: usize) -> String {
    v["choices"][i]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned()
}

/// Greedy: every sample equals the single greedy answer, which checks that
/// forks read the shared blocks and their copied partial block right.
async fn greedy_samples_equal_the_greedy_answer(addr: SocketAddr) {
    let greedy = json!({
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Name three colours of the rainbow."}],
        "temperature": 0,
        "max_tokens": 24,
    });
    let (status, one) = call_json(addr, "/v1/chat/completions", greedy.clone()).await;
    assert_eq!(status, 200, "{one}");
    let mut four = greedy.clone();
    four["n"] = json!(4);
    let (status, v) = call_json(addr, "/v1/chat/completions", four).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(4));
    for i in 0..4 {
        assert_eq!(v["choices"][i]["index"], i);
        assert_eq!(text_of(&v, i), text_of(&one, 0), "sample {i}");
    }
}

/// A new prompt, n = 4, sampled: the prompt is computed once, the samples
/// differ, and the same seed gives the same four again, streamed.
async fn sampled_samples_share_one_prefill_and_repeat_with_a_seed(addr: SocketAddr) {
    let before = counter(addr, COMPUTED).await;
    let sampled = json!({
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Write a short poem about the sea and the wind."}],
        "temperature": 1.0,
        "seed": 1234,
        "n": 4,
        "max_tokens": 16,
    });
    let (status, first) = call_json(addr, "/v1/chat/completions", sampled.clone()).await;
    assert_eq!(status, 200, "{first}");
    let computed = counter(addr, COMPUTED).await - before;
    let prompt_tokens = first["usage"]["prompt_tokens"].as_f64().expect("usage");
    // The system prompt's leading block is cached from the requests above.
    let cached = first["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_f64()
        .expect("usage");
    assert!(prompt_tokens - cached > 16.0, "a real prefill: {first}");
    assert_eq!(
        computed,
        prompt_tokens - cached,
        "one prefill for four samples"
    );
    let completion: u64 = (0..4)
        .map(|i| {
            first["choices"][i]["finish_reason"]
                .as_str()
                .map_or(0, |_| 1)
        })
        .sum();
    assert_eq!(completion, 4);
    let texts: Vec<String> = (0..4).map(|i| text_of(&first, i)).collect();
    let distinct: std::collections::BTreeSet<&String> = texts.iter().collect();
    assert!(
        distinct.len() > 1,
        "each sample has its own seed: {texts:?}"
    );
    // Seeded: the same four again (now mostly from the prefix cache), streamed.
    let mut streamed = sampled.clone();
    streamed["stream"] = json!(true);
    let (status, sse) = call(addr, "POST", "/v1/chat/completions", &streamed.to_string()).await;
    assert_eq!(status, 200);
    let mut again = vec![String::new(); 4];
    for c in chunks(&sse) {
        let Some(choice) = c["choices"].get(0) else {
            continue;
        };
        let i = choice["index"].as_u64().expect("index") as usize;
        again[i].push_str(choice["delta"]["content"].as_str().unwrap_or_default());
    }
    assert_eq!(again, texts);
}

/// Completions best_of: one sample kept; best_of below n is a 400.
async fn best_of_keeps_one_of_the_samples(addr: SocketAddr) {
    let (status, v) = call_json(
        addr,
        "/v1/completions",
        json!({"model": MODEL_NAME, "prompt": "Once upon a time", "temperature": 1.0, "seed": 5, "n": 1, "best_of": 3, "max_tokens": 8}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(1));
    assert!(v["choices"][0]["logprobs"].is_null(), "not asked for");
    let (status, v) = call_json(
        addr,
        "/v1/completions",
        json!({"model": MODEL_NAME, "prompt": "x", "n": 2, "best_of": 1}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "best_of");
}

/// `tool_choice: auto` on the reference model, sampled (temperature 1, 24
/// samples): whenever the model opens a `<tool_call>`, the grammar takes
/// over at the trigger, so the call parses and its arguments validate
/// against the tool's schema; no broken call is left in the content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_tool_calls_the_model_starts_are_valid_calls() {
    let server = real_server().await;
    let tools = json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
            "additionalProperties": false
        }
    }}]);
    // Two earlier turns that called the tool show the model the format.
    let mut messages = vec![json!({"role": "system", "content": "You answer by calling tools."})];
    for (i, (city, weather)) in [("Rome", "sunny"), ("Berlin", "rainy")].iter().enumerate() {
        let id = format!("call_{i}");
        let args = json!({"city": city}).to_string();
        messages.extend([
            json!({"role": "user", "content": format!("What is the weather in {city}?")}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "get_weather", "arguments": args}}]}),
            json!({"role": "tool", "tool_call_id": id, "content": weather}),
            json!({"role": "assistant", "content": format!("It is {weather} in {city}.")}),
        ]);
    }
    messages.push(json!({"role": "user", "content": "What is the weather in Paris?"}));
    let (mut calls, mut texts) = (0, 0);
    for seed in 0..6 {
        let body = json!({
            "model": MODEL_NAME,
            "messages": messages,
            "tools": tools,
            "temperature": 1.0,
            "seed": seed,
            "n": 4,
            "max_tokens": 96,
        });
        let (status, v) = call_json(server.addr, "/v1/chat/completions", body).await;
        assert_eq!(status, 200, "{v}");
        for c in v["choices"].as_array().expect("choices") {
            let m = &c["message"];
            let content = m["content"].as_str().unwrap_or_default();
            assert!(!content.contains("<tool_call>"), "a broken call: {c}");
            match m["tool_calls"].as_array() {
                Some(list) if !list.is_empty() => {
                    calls += 1;
                    assert_eq!(c["finish_reason"], "tool_calls", "{c}");
                    for call in list {
                        assert_eq!(call["function"]["name"], "get_weather", "{c}");
                        let args: Value = serde_json::from_str(
                            call["function"]["arguments"].as_str().expect("arguments"),
                        )
                        .expect("arguments are JSON");
                        let obj = args.as_object().expect("an object");
                        assert_eq!(obj.len(), 1, "{args}");
                        let city = obj["city"].as_str().expect("city is a string");
                        assert!(city.chars().count() <= 24, "{args}");
                    }
                }
                _ => {
                    texts += 1;
                    eprintln!("text: {content:?}");
                }
            }
        }
    }
    eprintln!("auto: {calls} samples called the tool, {texts} answered in text");
    assert!(
        calls > 0,
        "no sample opened a call: the switch was not exercised"
    );
    server.shut_down().await;
}
