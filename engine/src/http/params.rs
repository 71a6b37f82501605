//! Which OpenAI request parameters this server honours, per endpoint.
//!
//! serde ignores fields it does not know, so without this table a request
//! with `tools` or `logit_bias` would be answered as if they were absent,
//! a different answer from the one the client asked for. Every top-level
//! key is checked against the endpoint's table before the body is
//! deserialized: a supported key passes, a key OpenAI defines that we do not
//! implement passes only with its neutral value (e.g. `presence_penalty: 0`,
//! which changes nothing), and everything else is a 400 naming the key in
//! `param`. A `null` value means "absent" (OpenAI's own reading), so clients
//! that send every field with `null` defaults are accepted. The same holds
//! for the fields of each chat message. docs/API.md lists the tables.

use serde_json::Value;

use super::openai::ApiError;
use super::response::Api;

/// How a key is treated.
#[derive(Clone, Copy)]
enum Support {
    /// Honoured.
    Yes,
    /// Defined by OpenAI, not implemented: accepted only when `neutral` holds.
    Neutral(fn(&Value) -> bool),
}

fn zero(v: &Value) -> bool {
    v.as_f64() == Some(0.0)
}

fn is_false(v: &Value) -> bool {
    v == &Value::Bool(false)
}

fn empty_object(v: &Value) -> bool {
    v.as_object().is_some_and(|o| o.is_empty())
}

/// Keys both endpoints share.
const COMMON: &[(&str, Support)] = &[
    ("model", Support::Yes),
    ("max_tokens", Support::Yes),
    ("temperature", Support::Yes),
    ("top_p", Support::Yes),
    ("top_k", Support::Yes),
    ("seed", Support::Yes),
    ("stop", Support::Yes),
    ("stream", Support::Yes),
    ("stream_options", Support::Yes),
    ("n", Support::Yes),
    ("logprobs", Support::Yes),
    ("kv_transfer_params", Support::Yes),
    ("cache_salt", Support::Yes),
    // An end-user id for abuse tracking: logged, changes nothing in the output.
    ("user", Support::Yes),
    ("frequency_penalty", Support::Neutral(zero)),
    ("presence_penalty", Support::Neutral(zero)),
    ("logit_bias", Support::Neutral(empty_object)),
];

/// Keys only the chat endpoint has.
const CHAT: &[(&str, Support)] = &[
    ("messages", Support::Yes),
    ("max_completion_tokens", Support::Yes),
    ("top_logprobs", Support::Yes),
    ("tools", Support::Yes),
    ("tool_choice", Support::Yes),
    ("parallel_tool_calls", Support::Yes),
    ("response_format", Support::Yes),
    ("store", Support::Neutral(is_false)),
    ("metadata", Support::Neutral(empty_object)),
];

/// Keys only the completions endpoint has.
const COMPLETION: &[(&str, Support)] = &[
    ("prompt", Support::Yes),
    ("echo", Support::Yes),
    ("best_of", Support::Yes),
    // An extension (vLLM's): the same grammars as chat's.
    ("response_format", Support::Yes),
    ("suffix", Support::Neutral(|v| v.as_str() == Some(""))),
];

/// Fields of one chat message.
const MESSAGE: &[(&str, Support)] = &[
    ("role", Support::Yes),
    ("content", Support::Yes),
    ("tool_calls", Support::Yes),
    ("tool_call_id", Support::Yes),
    ("name", Support::Neutral(|_| false)),
    ("refusal", Support::Neutral(|_| false)),
];

/// Roles a message may have (`developer` is OpenAI's newer `system`).
pub(super) const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

fn lookup(key: &str, api: Api) -> Option<Support> {
    let own = match api {
        Api::Chat => CHAT,
        Api::Completion => COMPLETION,
    };
    COMMON
        .iter()
        .chain(own)
        .find(|(k, _)| *k == key)
        .map(|(_, s)| *s)
}

fn check_key(
    key: &str,
    value: &Value,
    support: Option<Support>,
    param: String,
) -> Result<(), ApiError> {
    if value.is_null() {
        return Ok(());
    }
    match support {
        Some(Support::Yes) => Ok(()),
        Some(Support::Neutral(neutral)) if neutral(value) => Ok(()),
        Some(Support::Neutral(_)) => Err(ApiError::invalid(
            format!("'{key}' is not supported by this server (only its default value is accepted)"),
            Some(&param),
        )
        .with_code("unsupported_parameter")),
        None => Err(ApiError::invalid(
            format!("Unrecognized request argument supplied: {key}"),
            Some(&param),
        )
        .with_code("unsupported_parameter")),
    }
}

/// Reject every key of `body` (and of its messages) that this server would
/// otherwise ignore, and any message role it does not know.
pub(super) fn check(body: &Value, api: Api) -> Result<(), ApiError> {
    let Some(obj) = body.as_object() else {
        return Ok(());
    };
    for (key, value) in obj {
        check_key(key, value, lookup(key, api), key.clone())?;
    }
    let Some(messages) = obj.get("messages").and_then(Value::as_array) else {
        return Ok(());
    };
    for (i, m) in messages.iter().enumerate() {
        let Some(m) = m.as_object() else { continue };
        for (key, value) in m {
            let support = MESSAGE.iter().find(|(k, _)| k == key).map(|(_, s)| *s);
            check_key(key, value, support, format!("messages[{i}].{key}"))?;
        }
        if let Some(role) = m.get("role").and_then(Value::as_str) {
            if !ROLES.contains(&role) {
                return Err(ApiError::invalid(
                    format!(
                        "Invalid value for 'messages[{i}].role': '{role}'; expected one of {}",
                        ROLES.join(", ")
                    ),
                    Some(&format!("messages[{i}].role")),
                )
                .with_code("invalid_value"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(body: Value, api: Api) -> Option<String> {
        check(&body, api).err().and_then(|e| e.param)
    }

    #[test]
    fn unknown_and_unsupported_keys_are_named() {
        let chat = |extra: Value| {
            let mut b = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
            for (k, v) in extra.as_object().expect("object") {
                b[k] = v.clone();
            }
            param(b, Api::Chat)
        };
        assert_eq!(chat(json!({})), None);
        assert_eq!(
            chat(json!({"logit_bias": {"5": 10}})).as_deref(),
            Some("logit_bias")
        );
        assert_eq!(chat(json!({"logit_bias": {}})), None);
        assert_eq!(
            chat(json!({"presence_penalty": 0.5})).as_deref(),
            Some("presence_penalty")
        );
        assert_eq!(chat(json!({"presence_penalty": 0})), None);
        assert_eq!(
            chat(json!({"frequency_penalty": null})),
            None,
            "null is absent"
        );
        assert_eq!(
            chat(json!({"audio": {"voice": "x"}})).as_deref(),
            Some("audio")
        );
        assert_eq!(
            chat(json!({"modalities": ["text"]})).as_deref(),
            Some("modalities")
        );
        assert_eq!(
            chat(json!({"echo": true})).as_deref(),
            Some("echo"),
            "completions only"
        );
        assert_eq!(
            chat(json!({"best_of": 2})).as_deref(),
            Some("best_of"),
            "completions only"
        );
        let completion = |extra: Value| {
            let mut b = json!({"model": "m", "prompt": "hi"});
            for (k, v) in extra.as_object().expect("object") {
                b[k] = v.clone();
            }
            param(b, Api::Completion)
        };
        assert_eq!(
            completion(json!({"suffix": "tail"})).as_deref(),
            Some("suffix")
        );
        assert_eq!(
            completion(json!({"tools": []})).as_deref(),
            Some("tools"),
            "chat only"
        );
        assert_eq!(completion(json!({"echo": false, "best_of": 1})), None);
    }

    #[test]
    fn message_fields_and_roles_are_checked() {
        let body =
            |m: Value| json!({"model": "m", "messages": [{"role": "user", "content": "a"}, m]});
        assert_eq!(
            param(body(json!({"role": "wizard", "content": "x"})), Api::Chat).as_deref(),
            Some("messages[1].role")
        );
        assert_eq!(
            param(
                body(json!({"role": "user", "content": "x", "name": "bob"})),
                Api::Chat
            )
            .as_deref(),
            Some("messages[1].name")
        );
        assert_eq!(
            param(
                body(json!({"role": "assistant", "content": null, "refusal": null})),
                Api::Chat
            ),
            None
        );
        assert_eq!(
            param(
                body(json!({"role": "developer", "content": "4"})),
                Api::Chat
            ),
            None
        );
    }
}
