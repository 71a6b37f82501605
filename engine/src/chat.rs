//! Chat prompt rendering with the model's own Jinja template (`tokenizer.chat_template`).
//!
//! Rendered with minijinja configured like Hugging Face's renderer
//! (`trim_blocks`, `lstrip_blocks`, Python string methods via
//! minijinja-contrib's pycompat, `raise_exception`, `bos_token`/`eos_token`),
//! so the prompt is token-for-token what the model was trained on. SmolLM2's
//! template inserts its default system prompt when the first message is not a
//! system message.
//!
//! Tools: a template that reads `tools` (Hugging Face's convention: a list
//! of `{"type": "function", "function": {...}}`) gets them in its context,
//! and assistant `tool_calls` / tool `tool_call_id` on the messages.
//! [`ChatTemplate::has_tools`] says whether it does; the HTTP layer uses a
//! Hermes-style fallback for templates that do not (see `http/tools.rs`).

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, ErrorKind};
use serde::Serialize;

use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;
use crate::EngineError;

const TEMPLATE_NAME: &str = "chat";

/// One chat turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool` (or what the template accepts).
    pub role: String,
    pub content: String,
    /// An assistant turn's tool calls (OpenAI shape), for templates with tools.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool turn: the call it answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
        }
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    has_tools: bool,
}

#[derive(Serialize)]
struct RenderContext<'a> {
    messages: &'a [ChatMessage],
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a [serde_json::Value]>,
    add_generation_prompt: bool,
    bos_token: &'a str,
    eos_token: &'a str,
}

impl ChatTemplate {
    /// Compile `source`; `bos_token` / `eos_token` are exposed to the template.
    pub fn new(
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, EngineError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| EngineError::ModelPart {
                part: "chat template syntax",
                source: e.into(),
            })?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| EngineError::ModelPart {
                part: "chat template",
                source: e.into(),
            })?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            has_tools: source.contains("tools"),
        })
    }

    /// The template stored in the GGUF file, with the tokenizer's BOS/EOS text.
    pub fn from_gguf(gguf: &GgufFile, tokenizer: &Tokenizer) -> Result<ChatTemplate, EngineError> {
        let source = gguf
            .get_str("tokenizer.chat_template")
            .ok_or_else(|| EngineError::Model("missing tokenizer.chat_template".into()))?;
        let text = |id: Option<u32>| {
            id.and_then(|id| tokenizer.token_text(id))
                .unwrap_or_default()
                .to_owned()
        };
        ChatTemplate::new(source, &text(tokenizer.bos_id()), &text(tokenizer.eos_id()))
    }

    /// The prompt text for `messages`; with `add_generation_prompt` it ends with
    /// the opening of the assistant's turn. A template error (including its own
    /// `raise_exception`, e.g. for unsupported roles) is an invalid request.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// Whether the template reads `tools` (else tools need a fallback).
    pub fn has_tools(&self) -> bool {
        self.has_tools
    }

    /// [`render`](Self::render) with tool definitions in the context.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        let template =
            self.env
                .get_template(TEMPLATE_NAME)
                .map_err(|e| EngineError::ModelPart {
                    part: "chat template",
                    source: e.into(),
                })?;
        template
            .render(minijinja::value::Serde(RenderContext {
                messages,
                tools,
                add_generation_prompt,
                bos_token: &self.bos_token,
                eos_token: &self.eos_token,
            }))
            .map_err(|e| EngineError::InvalidRequest(format!("chat template: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M-Instruct's `tokenizer.chat_template`, verbatim.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2_template_adds_the_default_system_prompt() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").expect("compiles");
        let msgs = [ChatMessage::new("user", "What is the capital of France?")];
        assert_eq!(
            t.render(&msgs, true).expect("renders"),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        );
        let with_system = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
        ];
        assert_eq!(
            t.render(&with_system, false).expect("renders"),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn hf_conventions_trim_blocks_pycompat_and_raise_exception() {
        let src = "{% for m in messages %}\n  {% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}\n{{ bos_token }}{{ m.content.strip() | upper }}{{ eos_token }}\n{% endfor %}";
        let t = ChatTemplate::new(src, "<s>", "</s>").expect("compiles");
        let ok = t
            .render(&[ChatMessage::new("user", "  hi  ")], false)
            .expect("renders");
        assert_eq!(ok, "<s>HI</s>\n");
        let err = t
            .render(&[ChatMessage::new("tool", "x")], false)
            .expect_err("template refuses the role");
        assert!(
            matches!(&err, EngineError::InvalidRequest(m) if m.contains("bad role tool")),
            "{err}"
        );
    }

    #[test]
    fn a_template_with_tools_gets_them_and_the_calls() {
        let src = "{% if tools %}T:{% for t in tools %}{{ t.function.name }};{% endfor %}{% endif %}{% for m in messages %}{{ m.role }}:{% if m.tool_calls %}{{ m.tool_calls[0].function.name }}{% endif %}{{ m.tool_call_id or '' }}{{ m.content }}|{% endfor %}";
        let t = ChatTemplate::new(src, "", "").expect("compiles");
        assert!(t.has_tools());
        assert!(!ChatTemplate::new(SMOLLM2, "", "")
            .expect("compiles")
            .has_tools());
        let tools = [serde_json::json!({"type": "function", "function": {"name": "add"}})];
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = Some(vec![serde_json::json!({"function": {"name": "add"}})]);
        let mut answer = ChatMessage::new("tool", "4");
        answer.tool_call_id = Some("c1".into());
        let out = t
            .render_with_tools(&[call, answer], Some(&tools), false)
            .expect("renders");
        assert_eq!(out, "T:add;assistant:add|tool:c14|");
    }

    #[test]
    fn a_broken_template_is_a_model_error() {
        let err = ChatTemplate::new("{% for %}", "", "").expect_err("syntax error");
        assert!(
            matches!(
                err,
                EngineError::ModelPart {
                    part: "chat template",
                    ..
                }
            ),
            "{err}"
        );
    }
}
