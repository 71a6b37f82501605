//! Response bodies of the completion endpoints: the non-streamed object, the
//! SSE chunks, `usage`, and the `kv_transfer_params` a prefill-role engine
//! adds. Pure functions of their inputs, so the wire shapes are tested here
//! without a running generation.

use serde_json::{json, Value};

use crate::request::{TransferParams, Usage};

/// Which endpoint: decides the response shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Api {
    Chat,
    Completion,
}

impl Api {
    pub(super) fn id_prefix(self) -> &'static str {
        match self {
            Api::Chat => "chatcmpl",
            Api::Completion => "cmpl",
        }
    }
}

/// Fixed per-response fields.
#[derive(Clone, Debug)]
pub(super) struct ResponseMeta {
    pub(super) api: Api,
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) model: String,
}

impl ResponseMeta {
    fn envelope(&self, object: &str, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// One streamed chunk of choice `index` carrying `text` (chat: a content
    /// delta) and the logprobs of its tokens (`null` when not asked for).
    pub(super) fn text_chunk(&self, index: usize, text: &str, logprobs: Value) -> Value {
        match self.api {
            Api::Chat => self.envelope(
                "chat.completion.chunk",
                json!([{"index": index, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": null}]),
            ),
            Api::Completion => self.envelope(
                "text_completion",
                json!([{"index": index, "text": text, "logprobs": logprobs, "finish_reason": null}]),
            ),
        }
    }

    /// A chat chunk of choice `index` with this `delta`.
    pub(super) fn delta_chunk(&self, index: usize, delta: Value) -> Value {
        self.envelope(
            "chat.completion.chunk",
            json!([{"index": index, "delta": delta, "logprobs": null, "finish_reason": null}]),
        )
    }

    /// The chunk of choice `index` that carries its finish reason.
    pub(super) fn final_chunk(&self, index: usize, finish_reason: &str) -> Value {
        match self.api {
            Api::Chat => self.envelope(
                "chat.completion.chunk",
                json!([{"index": index, "delta": {}, "logprobs": null, "finish_reason": finish_reason}]),
            ),
            Api::Completion => self.envelope(
                "text_completion",
                json!([{"index": index, "text": "", "logprobs": null, "finish_reason": finish_reason}]),
            ),
        }
    }

    /// The trailing chunk with usage and no choices (`stream_options.include_usage`).
    pub(super) fn usage_chunk(&self, usage: &Usage) -> Value {
        let object = match self.api {
            Api::Chat => "chat.completion.chunk",
            Api::Completion => "text_completion",
        };
        let mut v = self.envelope(object, json!([]));
        v["usage"] = usage_json(usage);
        v
    }

    /// One choice of a non-streamed response; `message` is the chat
    /// message object (ignored for completions, which carry `text`).
    pub(super) fn choice(
        &self,
        index: usize,
        text: &str,
        message: Value,
        finish_reason: &str,
        logprobs: Value,
    ) -> Value {
        match self.api {
            Api::Chat => {
                json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason})
            }
            Api::Completion => {
                json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason})
            }
        }
    }

    /// The whole non-streamed response.
    pub(super) fn full_response(&self, choices: Vec<Value>, usage: &Usage) -> Value {
        let object = match self.api {
            Api::Chat => "chat.completion",
            Api::Completion => "text_completion",
        };
        let mut v = self.envelope(object, Value::Array(choices));
        v["usage"] = usage_json(usage);
        v
    }
}

/// The `kv_transfer_params` object of a prefill engine's response: where the
/// prompt's KV blocks were saved, for the router to hand to a decode engine.
/// `block_keys` are lower-case hex; `cached_tokens` repeats the usage value
/// (prompt tokens the prefill side did not have to compute).
fn kv_transfer_params_json(params: &TransferParams, usage: &Usage) -> Value {
    json!({
        "holder": params.holder,
        "block_keys": params.block_keys.iter().map(|k| k.to_hex()).collect::<Vec<_>>(),
        "block_tokens": params.block_tokens,
        "cached_tokens": usage.cached_tokens,
    })
}

/// Add `kv_transfer_params` to a response object when the engine saved blocks.
pub(super) fn attach_transfer(v: &mut Value, params: Option<&TransferParams>, usage: &Usage) {
    if let Some(params) = params {
        v["kv_transfer_params"] = kv_transfer_params_json(params, usage);
    }
}

fn usage_json(usage: &Usage) -> Value {
    json!({
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvfabric_types::BlockKey;

    #[test]
    fn kv_transfer_params_json_shape() {
        let params = TransferParams {
            holder: "node-a".into(),
            block_keys: vec![BlockKey([0xab; 32]), BlockKey([0x01; 32])],
            block_tokens: 64,
        };
        let usage = Usage {
            prompt_tokens: 130,
            completion_tokens: 1,
            cached_tokens: 64,
        };
        for api in [Api::Completion, Api::Chat] {
            let meta = ResponseMeta {
                api,
                id: "cmpl-1".into(),
                created: 1,
                model: "m".into(),
            };
            let choice = meta.choice(
                0,
                "x",
                json!({"role": "assistant", "content": "x"}),
                "length",
                Value::Null,
            );
            let mut v = meta.full_response(vec![choice.clone()], &usage);
            attach_transfer(&mut v, Some(&params), &usage);
            assert_eq!(
                v["kv_transfer_params"],
                json!({
                    "holder": "node-a",
                    "block_keys": ["ab".repeat(32), "01".repeat(32)],
                    "block_tokens": 64,
                    "cached_tokens": 64,
                })
            );
            assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 64);
            let mut chunk = meta.usage_chunk(&usage);
            attach_transfer(&mut chunk, Some(&params), &usage);
            assert_eq!(chunk["kv_transfer_params"]["block_tokens"], 64);
            let mut v = meta.full_response(vec![choice], &usage);
            attach_transfer(&mut v, None, &usage);
            assert!(
                v.get("kv_transfer_params").is_none(),
                "absent without saved blocks"
            );
        }
    }
}
