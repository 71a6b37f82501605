//! Tool calling: how `tools` reach the prompt and how the model's text
//! becomes `tool_calls`.

use serde_json::{json, Value};

/// How a chat answer's text is presented.
#[derive(Clone, Debug, Default)]
pub(super) enum ToolMode {
    /// Plain content (no tools in the request, or `tool_choice: "none"`).
    #[default]
    Off,
}

impl ToolMode {
    /// Streaming: hold the text back until the end (tool calls are parsed whole).
    pub(super) fn holds_text(&self) -> bool {
        false
    }

    /// The chat `message` object for `text` and the finish reason.
    pub(super) fn message(&self, text: &str, finish_reason: &'static str) -> (Value, &'static str) {
        (json!({"role": "assistant", "content": text}), finish_reason)
    }

    /// Streaming with held text: the deltas to send at the end.
    pub(super) fn deltas(
        &self,
        text: &str,
        finish_reason: &'static str,
    ) -> (Vec<Value>, &'static str) {
        (vec![json!({"content": text})], finish_reason)
    }
}
