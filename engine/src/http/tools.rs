//! Tool calling: `tools`, `tool_choice`, `parallel_tool_calls`, how tool
//! definitions and earlier calls reach the prompt, and how the model's text
//! becomes `tool_calls`.
//!
//! A chat template that reads `tools` gets them (and assistant
//! `tool_calls`, tool `tool_call_id`) in its context. A template without a
//! tool section (SmolLM2's) gets the Hermes-style fallback that Qwen2.5 and
//! NousResearch's Hermes models are trained on: the definitions as JSON
//! lines inside `<tools></tools>` in the system message, earlier calls as
//! `<tool_call>{"name": .., "arguments": {..}}</tool_call>` in the
//! assistant's content, and tool results as a user turn inside
//! `<tool_response></tool_response>`. Either way the model's calls are read
//! back from `<tool_call>` blocks.
//!
//! `tool_choice`: `none` leaves the tools out of the prompt and parses no
//! calls; `auto` lets the model choose; `required` and a named function
//! end the prompt with the opening of a call (`<tool_call>\n{"name": "`,
//! or with the name and `"arguments": ` filled in), so the model continues
//! inside a call, and constrain the rest of the answer with a grammar
//! ([`ToolRequest::call_grammar`]): one of the allowed names, arguments
//! valid against that function's `parameters` schema, the call's closing,
//! then the end of the answer. A forced answer is exactly one call.
//! `auto` leaves the text free until the model writes `<tool_call>`; from
//! there the same grammar holds (a name of `tools`, valid arguments, the
//! closing), then more calls (`parallel_tool_calls`) or the end: the
//! grammar switches at the trigger, as vLLM's and SGLang's structural tags
//! do. (The trigger is matched as text: a model whose vocabulary has
//! `<tool_call>` as one special token is not covered.)
//!
//! Streaming with tools holds the text back until the sample ends, then
//! sends the content (if any) and every call as `delta.tool_calls`.

use serde_json::{json, Value};

use super::openai::ApiError;
use crate::chat::ChatMessage;

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// What `tool_choice` asked for (with tools present).
#[derive(Clone, Debug, PartialEq)]
enum Choice {
    Auto,
    Required,
    Named(String),
}

/// A request's tools, validated.
#[derive(Clone, Debug)]
pub(super) struct ToolRequest {
    /// The `tools` entries as sent (`{"type": "function", "function": {..}}`).
    tools: Vec<Value>,
    choice: Choice,
    parallel: bool,
}

/// Validate `tools`, `tool_choice` and `parallel_tool_calls`; `None` when
/// no tools are in play (absent, empty, or `tool_choice: "none"`).
pub(super) fn parse_request(
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel: Option<bool>,
) -> Result<Option<ToolRequest>, ApiError> {
    let tools = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(t)) => t,
        Some(_) => return Err(ApiError::invalid("tools must be an array", Some("tools"))),
    };
    let mut names = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let name = t["function"]["name"].as_str().filter(|n| !n.is_empty());
        match (t["type"].as_str(), name) {
            (Some("function"), Some(name)) => names.push(name.to_owned()),
            _ => {
                return Err(ApiError::invalid(
                    "each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    Some(&format!("tools[{i}]")),
                ))
            }
        }
        let params = &t["function"]["parameters"];
        if !(params.is_null() || params.is_object()) {
            return Err(ApiError::invalid(
                "function parameters must be a JSON schema object",
                Some(&format!("tools[{i}].function.parameters")),
            ));
        }
    }
    let choice = match tool_choice {
        None | Some(Value::Null) => Some(Choice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "none" => None,
            "auto" => Some(Choice::Auto),
            "required" => Some(Choice::Required),
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice must be none, auto, required or a named function",
                    Some("tool_choice"),
                ))
            }
        },
        Some(v) => match v["function"]["name"].as_str() {
            Some(name) if names.iter().any(|n| n == name) => Some(Choice::Named(name.to_owned())),
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice names a function that is not in tools",
                    Some("tool_choice"),
                ))
            }
        },
    };
    if tools.is_empty() {
        return match choice {
            Some(Choice::Required | Choice::Named(_)) => Err(ApiError::invalid(
                "tool_choice requires tools",
                Some("tool_choice"),
            )),
            _ => Ok(None),
        };
    }
    Ok(choice.map(|choice| ToolRequest {
        tools,
        choice,
        parallel: parallel.unwrap_or(true),
    }))
}

/// The Hermes-style system text for templates without a tool section.
fn fallback_system(tools: &[Value]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools {
        s.push('\n');
        s.push_str(&t.to_string());
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    s
}

/// One earlier call as the fallback writes it into the assistant's content.
fn fallback_call(call: &Value) -> String {
    let f = &call["function"];
    let args = match &f["arguments"] {
        Value::String(s) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
        other => other.clone(),
    };
    let body = json!({"name": f["name"], "arguments": args});
    format!("{CALL_OPEN}\n{body}\n{CALL_CLOSE}")
}

/// Rewrite tool turns for a template without a tool section (Hermes style).
pub(super) fn fallback_messages(
    messages: Vec<ChatMessage>,
    tools: Option<&[Value]>,
) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = messages
        .into_iter()
        .map(|mut m| {
            if let Some(calls) = m.tool_calls.take() {
                let mut parts: Vec<String> = Vec::new();
                if !m.content.is_empty() {
                    parts.push(m.content.clone());
                }
                parts.extend(calls.iter().map(fallback_call));
                m.content = parts.join("\n");
            }
            if m.role == "tool" {
                m.tool_call_id = None;
                m.role = "user".into();
                m.content = format!("<tool_response>\n{}\n</tool_response>", m.content);
            }
            m
        })
        .collect();
    if let Some(tools) = tools {
        let text = fallback_system(tools);
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                first.content = format!("{}\n\n{text}", first.content);
            }
            _ => out.insert(0, ChatMessage::new("system", text)),
        }
    }
    out
}

impl ToolRequest {
    /// The tool definitions (for the template or the fallback).
    pub(super) fn tools(&self) -> &[Value] {
        &self.tools
    }

    /// Text the prompt ends with to force a call (empty for `auto`).
    pub(super) fn forced_prefix(&self) -> String {
        match &self.choice {
            Choice::Auto => String::new(),
            Choice::Required => format!("{CALL_OPEN}\n{{\"name\": \""),
            Choice::Named(name) => {
                format!("{CALL_OPEN}\n{{\"name\": {}, \"arguments\": ", json!(name))
            }
        }
    }

    /// True for `tool_choice: auto` (the model may answer in text).
    pub(super) fn is_auto(&self) -> bool {
        self.choice == Choice::Auto
    }

    /// The Lark grammar of the answer: for `required` and a named function
    /// the rest of it after [`forced_prefix`](Self::forced_prefix); for
    /// `auto` free text until `<tool_call>`, then calls. With it the
    /// `parameters` schema (compact JSON) of each function it may call, and
    /// each schema's index in `tools` (to name a bad one).
    pub(super) fn call_grammar(&self) -> (String, Vec<(usize, Value)>) {
        let named = |n: &str| {
            self.tools
                .iter()
                .position(|t| t["function"]["name"].as_str() == Some(n))
        };
        let allowed: Vec<usize> = match &self.choice {
            Choice::Auto => return self.auto_grammar(),
            Choice::Required => (0..self.tools.len()).collect(),
            Choice::Named(name) => named(name).into_iter().collect(),
        };
        let close = json!("}\n</tool_call>").to_string();
        let mut lark = String::from("start: ");
        let mut rules = String::new();
        let mut schemas = Vec::new();
        for (k, &i) in allowed.iter().enumerate() {
            let f = &self.tools[i]["function"];
            let schema = match &f["parameters"] {
                Value::Null => json!({"type": "object"}),
                p => p.clone(),
            };
            let schema = crate::grammar::compact(schema);
            rules.push_str(&format!("args{k}: %json {schema}\n"));
            schemas.push((i, schema));
            if k > 0 {
                lark.push_str(" | ");
            }
            if let Choice::Named(_) = self.choice {
                lark.push_str(&format!("args{k} {close}"));
            } else {
                // The prompt ends inside the name's string: the rest of it.
                let name = json!(f["name"]).to_string();
                let head = json!(format!("{}, \"arguments\": ", &name[1..]));
                lark.push_str(&format!("{head} args{k} {close}"));
            }
        }
        (format!("{lark}\n{rules}"), schemas)
    }

    /// `auto`: any text without `<tool_call>` to the end, or text up to
    /// the first `<tool_call>` (a lazy lexeme: it ends at the trigger),
    /// then a call of any tool, then (parallel) more calls.
    fn auto_grammar(&self) -> (String, Vec<(usize, Value)>) {
        let mut rules = String::new();
        let mut names = Vec::new();
        let mut schemas = Vec::new();
        for (i, t) in self.tools.iter().enumerate() {
            let f = &t["function"];
            let schema = match &f["parameters"] {
                Value::Null => json!({"type": "object"}),
                p => p.clone(),
            };
            let schema = crate::grammar::compact(schema);
            let head = json!(format!("{}, \"arguments\": ", json!(f["name"])));
            rules.push_str(&format!("fn{i}: {head} args{i}\nargs{i}: %json {schema}\n"));
            names.push(format!("fn{i}"));
            schemas.push((i, schema));
        }
        let more = if self.parallel { " more*" } else { "" };
        let open = json!(CALL_OPEN);
        let lark = format!(
            "start: TEXT | pre call{more}\n\
             TEXT: /(?s:.*)/ & ~/(?s:.*){CALL_OPEN}(?s:.*)/\n\
             pre[lazy]: /(?s:.*){CALL_OPEN}/\n\
             call: \"\\n\"? {name} ({fns}) \"}}\" \"\\n\"? {close}\n\
             more: \"\\n\"? {open} call\n{rules}",
            name = json!("{\"name\": "),
            fns = names.join(" | "),
            close = json!(CALL_CLOSE),
        );
        (lark, schemas)
    }

    /// How the answer is read back.
    pub(super) fn mode(&self, id: &str) -> ToolMode {
        ToolMode::Parse {
            id_prefix: format!("call_{}", id.rsplit('-').next().unwrap_or(id)),
            parallel: self.parallel,
            forced_prefix: self.forced_prefix(),
        }
    }
}

/// How a chat answer's text is presented.
#[derive(Clone, Debug, Default)]
pub(super) enum ToolMode {
    /// Plain content (no tools in play).
    #[default]
    Off,
    /// Read `<tool_call>` blocks out of the text.
    Parse {
        /// Call ids are `{id_prefix}_{n}`.
        id_prefix: String,
        /// `parallel_tool_calls`: false keeps the first call only.
        parallel: bool,
        /// What the prompt already said of the answer (forced calls).
        forced_prefix: String,
    },
}

/// Split text into content and `<tool_call>` JSON bodies (name, arguments
/// as a JSON string). A block whose JSON does not parse stays content.
fn split_calls(text: &str) -> (String, Vec<(String, String)>) {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(CALL_OPEN) {
        content.push_str(&rest[..at]);
        let after = &rest[at + CALL_OPEN.len()..];
        let (body, next) = match after.find(CALL_CLOSE) {
            Some(end) => (&after[..end], &after[end + CALL_CLOSE.len()..]),
            None => (after, ""),
        };
        match parse_call(body) {
            Some(call) => calls.push(call),
            None => content.push_str(&rest[at..rest.len() - next.len()]),
        }
        rest = next;
    }
    content.push_str(rest);
    (content.trim().to_owned(), calls)
}

fn parse_call(body: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v["name"].as_str()?.to_owned();
    let args = match &v["arguments"] {
        Value::Null => "{}".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    Some((name, args))
}

impl ToolMode {
    /// Streaming: hold the text back until the end (tool calls are parsed whole).
    pub(super) fn holds_text(&self) -> bool {
        matches!(self, ToolMode::Parse { .. })
    }

    /// Content and calls of a finished sample's text.
    fn parse(
        &self,
        text: &str,
        finish_reason: &'static str,
    ) -> (Option<String>, Vec<Value>, &'static str) {
        let ToolMode::Parse {
            id_prefix,
            parallel,
            forced_prefix,
        } = self
        else {
            return (Some(text.to_owned()), Vec::new(), finish_reason);
        };
        let (content, mut calls) = split_calls(&format!("{forced_prefix}{text}"));
        if !parallel {
            calls.truncate(1);
        }
        if calls.is_empty() {
            return (Some(text.to_owned()), Vec::new(), finish_reason);
        }
        let calls = calls
            .into_iter()
            .enumerate()
            .map(|(i, (name, arguments))| {
                json!({"id": format!("{id_prefix}_{i}"), "type": "function", "function": {"name": name, "arguments": arguments}})
            })
            .collect();
        let content = (!content.is_empty()).then_some(content);
        (content, calls, "tool_calls")
    }

    /// The chat `message` object for `text` and the finish reason.
    pub(super) fn message(&self, text: &str, finish_reason: &'static str) -> (Value, &'static str) {
        let (content, calls, reason) = self.parse(text, finish_reason);
        let mut m = json!({"role": "assistant", "content": content});
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        (m, reason)
    }

    /// Streaming with held text: the deltas to send at the end.
    pub(super) fn deltas(
        &self,
        text: &str,
        finish_reason: &'static str,
    ) -> (Vec<Value>, &'static str) {
        let (content, calls, reason) = self.parse(text, finish_reason);
        let mut deltas = Vec::new();
        if let Some(c) = content.filter(|c| !c.is_empty()) {
            deltas.push(json!({"content": c}));
        }
        for (i, mut call) in calls.into_iter().enumerate() {
            call["index"] = json!(i);
            deltas.push(json!({"tool_calls": [call]}));
        }
        (deltas, reason)
    }
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
