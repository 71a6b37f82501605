//! `tools.rs`'s unit tests: `tool_choice` forms, parsing calls back, the
//! call grammars (forced and `auto`) on the tiny vocabulary, the Hermes fallback.
use super::*;

fn weather() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
}

#[test]
fn tool_choice_forms_are_validated() {
    let p = |tools: Option<Value>, choice: Option<Value>| {
        parse_request(tools, choice, None).map(|r| r.map(|r| r.choice))
    };
    assert_eq!(p(Some(weather()), None).expect("ok"), Some(Choice::Auto));
    assert_eq!(p(Some(weather()), Some(json!("none"))).expect("ok"), None);
    assert_eq!(
        p(Some(weather()), Some(json!("required"))).expect("ok"),
        Some(Choice::Required)
    );
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    assert_eq!(
        p(Some(weather()), Some(named)).expect("ok"),
        Some(Choice::Named("get_weather".into()))
    );
    let other = json!({"type": "function", "function": {"name": "nope"}});
    assert_eq!(
        p(Some(weather()), Some(other))
            .expect_err("unknown")
            .param
            .as_deref(),
        Some("tool_choice")
    );
    assert_eq!(
        p(None, Some(json!("required")))
            .expect_err("no tools")
            .param
            .as_deref(),
        Some("tool_choice")
    );
    assert_eq!(
        p(Some(json!([{"type": "x"}])), None)
            .expect_err("bad")
            .param
            .as_deref(),
        Some("tools[0]")
    );
    assert_eq!(
        p(Some(weather()), Some(json!("sometimes")))
            .expect_err("bad")
            .param
            .as_deref(),
        Some("tool_choice")
    );
}

#[test]
fn calls_are_parsed_and_bad_blocks_stay_content() {
    let mode = ToolMode::Parse {
        id_prefix: "call_x".into(),
        parallel: true,
        forced_prefix: String::new(),
    };
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}";
    let (m, reason) = mode.message(text, "stop");
    assert_eq!(reason, "tool_calls");
    assert_eq!(m["content"], "Let me check.");
    assert_eq!(m["tool_calls"][0]["id"], "call_x_0");
    assert_eq!(
        m["tool_calls"][0]["function"]["arguments"],
        "{\"city\":\"Paris\"}"
    );
    assert_eq!(
        m["tool_calls"][1]["function"]["arguments"], "{\"city\":\"Rome\"}",
        "unclosed at the end"
    );
    let single = ToolMode::Parse {
        id_prefix: "c".into(),
        parallel: false,
        forced_prefix: String::new(),
    };
    assert_eq!(
        single.message(text, "stop").0["tool_calls"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    let (m, reason) = mode.message("<tool_call>not json</tool_call>", "stop");
    assert_eq!(
        (m["content"].as_str(), reason),
        (Some("<tool_call>not json</tool_call>"), "stop")
    );
    assert!(m.get("tool_calls").is_none());
    // A forced prefix completes the call the model continued.
    let forced = ToolMode::Parse {
        id_prefix: "c".into(),
        parallel: true,
        forced_prefix: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ".into(),
    };
    let (deltas, reason) = forced.deltas("{\"city\": \"Oslo\"}}\n</tool_call>", "stop");
    assert_eq!(reason, "tool_calls");
    assert_eq!(deltas.len(), 1);
    assert_eq!(deltas[0]["tool_calls"][0]["index"], 0);
    assert_eq!(
        deltas[0]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
}

/// `text`'s tokens through the matcher, each allowed by its mask.
fn feed(m: &mut crate::grammar::GrammarMatcher, t: &crate::tokenizer::Tokenizer, text: &str) {
    for id in t.encode(text, false) {
        let mut row = vec![0.0f32; t.vocab_size()];
        m.mask(&mut row).expect("mask");
        assert!(
            row[id as usize].is_finite(),
            "{:?} allowed in {text:?}",
            t.decode(&[id])
        );
        m.advance(id).expect("advance");
    }
}

#[test]
fn forced_calls_are_constrained_to_a_name_and_valid_arguments() {
    use crate::grammar::{GrammarSpec, Grammars};
    let t = std::sync::Arc::new(crate::tokenizer::tests::tiny());
    let g = Grammars::new(t.clone(), vec![1]);
    let mut tools = weather();
    tools
        .as_array_mut()
        .expect("array")
        .push(json!({"type": "function", "function": {"name": "noop"}}));
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let req = parse_request(Some(tools.clone()), Some(named), None)
        .expect("ok")
        .expect("tools");
    let (lark, schemas) = req.call_grammar();
    assert_eq!(schemas.len(), 1);
    let c = g.compile(&GrammarSpec::Lark(lark)).expect("compiles");
    let mut m = c.matcher();
    feed(&mut m, &t, "{\"city\": \"Oslo\"}}\n</tool_call>");
    assert!(m.is_stopped() || m.is_accepting(), "the call is complete");
    // A wrong type for `city` is never allowed.
    let mut m = c.matcher();
    feed(&mut m, &t, "{\"city\": ");
    let mut row = vec![0.0f32; t.vocab_size()];
    m.mask(&mut row).expect("mask");
    assert!(row[t.encode("7", false)[0] as usize].is_infinite());
    // `required`: the name is one of the tools', then its own arguments.
    let req = parse_request(Some(tools), Some(json!("required")), None)
        .expect("ok")
        .expect("tools");
    let (lark, schemas) = req.call_grammar();
    assert_eq!(schemas.len(), 2);
    let c = g.compile(&GrammarSpec::Lark(lark)).expect("compiles");
    let mut m = c.matcher();
    feed(&mut m, &t, "noop\", \"arguments\": {}}\n</tool_call>");
    let mut m = c.matcher();
    let mut row = vec![0.0f32; t.vocab_size()];
    m.mask(&mut row).expect("mask");
    assert!(
        row[t.encode("x", false)[0] as usize].is_infinite(),
        "no tool starts with x"
    );
}

#[test]
fn auto_is_free_text_until_the_trigger_then_a_valid_call() {
    use crate::grammar::{GrammarSpec, Grammars};
    let t = std::sync::Arc::new(crate::tokenizer::tests::tiny());
    let g = Grammars::new(t.clone(), vec![1]);
    let auto = parse_request(Some(weather()), None, None)
        .expect("ok")
        .expect("tools");
    let (lark, schemas) = auto.call_grammar();
    assert_eq!(schemas.len(), 1);
    let c = g.compile(&GrammarSpec::Lark(lark)).expect("compiles");
    let allowed = |m: &mut crate::grammar::GrammarMatcher, s: &str| {
        let mut row = vec![0.0f32; t.vocab_size()];
        m.mask(&mut row).expect("mask");
        row[t.encode(s, false)[0] as usize].is_finite()
    };
    // Plain text is free, and may end anywhere.
    let mut m = c.matcher();
    feed(&mut m, &t, "It is 7 degrees {or so} \"x\": ");
    assert!(allowed(&mut m, "7") && allowed(&mut m, "}"));
    assert!(m.is_accepting(), "a text answer may end");
    // After the trigger: the call's JSON only, with valid arguments.
    let mut m = c.matcher();
    feed(&mut m, &t, "Let me check.<tool_call>\n");
    assert!(!allowed(&mut m, "7"), "a call starts with {{");
    assert!(!m.is_accepting(), "an open call cannot end the answer");
    feed(
        &mut m,
        &t,
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": ",
    );
    assert!(!allowed(&mut m, "7"), "city is a string");
    feed(&mut m, &t, "\"Oslo\"}}\n</tool_call>");
    assert!(m.is_stopped() || m.is_accepting(), "the call is complete");
    // A second call (parallel_tool_calls defaults to true).
    feed(&mut m, &t, "\n<tool_call>{\"name\": \"get_weather\"");
    // An unknown tool name is never allowed.
    let mut m = c.matcher();
    feed(&mut m, &t, "<tool_call>\n{\"name\": \"");
    assert!(!allowed(&mut m, "x"), "no tool starts with x");
}

#[test]
fn fallback_renders_tools_calls_and_results_hermes_style() {
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls = Some(vec![
        json!({"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}),
    ]);
    let mut result = ChatMessage::new("tool", "18C");
    result.tool_call_id = Some("c1".into());
    let tools = weather();
    let out = fallback_messages(
        vec![ChatMessage::new("user", "Weather?"), call, result],
        tools.as_array().map(Vec::as_slice),
    );
    assert_eq!(out[0].role, "system");
    assert!(
        out[0].content.contains("<tools>\n{\"type\":\"function\""),
        "{}",
        out[0].content
    );
    assert_eq!(
        out[2].content,
        "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>"
    );
    assert_eq!(out[3].role, "user");
    assert_eq!(out[3].content, "<tool_response>\n18C\n</tool_response>");
}
