//! `response_format` and forced tool calls, turned into the grammar the
//! sampler enforces (see `crate::grammar`).
//!
//! `{"type": "text"}` (or no `response_format`) constrains nothing;
//! `json_object` is the schema `{"type": "object"}`; `json_schema` takes
//! `json_schema.schema` (absent: any JSON value). `strict: false` is
//! accepted and enforced all the same (the output always follows the
//! schema). A forced tool call (`tool_choice` `required` or a named
//! function) is constrained to a call with valid arguments
//! (`ToolRequest::call_grammar`), whatever `response_format` says (the
//! answer is a call, not content); so is a call the model starts under
//! `tool_choice: auto` (free text until `<tool_call>`). A JSON
//! `response_format` together with `tool_choice: auto` is refused: the
//! grammar would leave the model no way to call a tool. A schema that does not compile is a 400 naming it, with
//! the compiler's reason. Compiling runs on tokio's blocking pool (the
//! first one also builds the vocabulary trie).

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::openai::ApiError;
use super::tools::ToolRequest;
use crate::grammar::{Constraint, GrammarSpec, Grammars};
use crate::EngineError;

/// What a request's grammar comes from, to name it in errors.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Wanted {
    spec: GrammarSpec,
    /// The request field a bad grammar is reported under.
    param: String,
    /// Each tool's own schema (index in `tools`), checked first so a bad one is named.
    tool_schemas: Vec<(usize, Value)>,
}

/// Read `response_format`; None for text (or absent).
pub(super) fn response_format(v: Option<Value>) -> Result<Option<Wanted>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let bad = |m: &str, p: &str| Err(ApiError::invalid(m, Some(p)).with_code("invalid_value"));
    let schema = match v["type"].as_str() {
        Some("text") => return Ok(None),
        Some("json_object") => json!({"type": "object"}),
        Some("json_schema") => {
            let js = &v["json_schema"];
            if !js.is_object() {
                return bad(
                    "json_schema must be an object with name and schema",
                    "response_format.json_schema",
                );
            }
            let name = js["name"].as_str().unwrap_or_default();
            let name_ok = (1..=64).contains(&name.len())
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !name_ok {
                return bad(
                    "json_schema.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -",
                    "response_format.json_schema.name",
                );
            }
            if !(js["strict"].is_null() || js["strict"].is_boolean()) {
                return bad(
                    "json_schema.strict must be a boolean",
                    "response_format.json_schema.strict",
                );
            }
            match &js["schema"] {
                Value::Null => json!({}),
                s @ Value::Object(_) => s.clone(),
                _ => {
                    return bad(
                        "json_schema.schema must be a JSON schema object",
                        "response_format.json_schema.schema",
                    )
                }
            }
        }
        _ => {
            return bad(
                "response_format.type must be text, json_object or json_schema",
                "response_format.type",
            )
        }
    };
    let param = if v["type"] == "json_schema" {
        "response_format.json_schema.schema"
    } else {
        "response_format"
    };
    Ok(Some(Wanted {
        spec: GrammarSpec::json_schema(schema),
        param: param.into(),
        tool_schemas: Vec::new(),
    }))
}

/// The grammar of a request: its tool calls' (forced, or `auto`'s
/// switch at `<tool_call>`), else `format`'s.
pub(super) fn wanted(
    format: Option<Wanted>,
    tools: Option<&ToolRequest>,
) -> Result<Option<Wanted>, ApiError> {
    let Some(tools) = tools else {
        return Ok(format);
    };
    if format.is_some() && tools.is_auto() {
        return Err(ApiError::invalid(
            "a JSON response_format with tools is only supported with tool_choice none, required or a named function",
            Some("response_format"),
        )
        .with_code("unsupported_parameter"));
    }
    let (lark, tool_schemas) = tools.call_grammar();
    Ok(Some(Wanted {
        spec: GrammarSpec::Lark(lark),
        param: "tools".into(),
        tool_schemas,
    }))
}

/// Compile `wanted` (off the async threads); a bad schema is a 400.
pub(super) async fn compile(
    grammars: &Arc<Grammars>,
    wanted: Wanted,
) -> Result<Constraint, ApiError> {
    let g = grammars.clone();
    tokio::task::spawn_blocking(move || compile_now(&g, &wanted))
        .await
        .map_err(|e| ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

fn compile_now(g: &Grammars, wanted: &Wanted) -> Result<Constraint, ApiError> {
    let rejected = |param: &str, e: EngineError| {
        let reason = match e {
            EngineError::Grammar(fault) => fault.to_string(),
            other => other.to_string(),
        };
        ApiError::invalid(
            format!("Invalid schema for '{param}': {reason}"),
            Some(param),
        )
        .with_code("invalid_schema")
    };
    for (i, schema) in &wanted.tool_schemas {
        let param = format!("tools[{i}].function.parameters");
        g.compile(&GrammarSpec::JsonSchema(schema.clone()))
            .map_err(|e| rejected(&param, e))?;
    }
    g.compile(&wanted.spec)
        .map_err(|e| rejected(&wanted.param, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(v: Value) -> Option<String> {
        response_format(Some(v)).err().and_then(|e| e.param)
    }

    #[test]
    fn response_format_forms() {
        assert_eq!(response_format(None).expect("absent"), None);
        assert_eq!(
            response_format(Some(json!({"type": "text"}))).expect("text"),
            None
        );
        let obj = response_format(Some(json!({"type": "json_object"})))
            .expect("ok")
            .expect("a grammar");
        assert_eq!(
            obj.spec,
            GrammarSpec::json_schema(json!({"type": "object"}))
        );
        let s = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}, "strict": false}});
        assert!(response_format(Some(s))
            .expect("strict false accepted")
            .is_some());
        assert_eq!(
            param(json!({"type": "yaml"})).as_deref(),
            Some("response_format.type")
        );
        assert_eq!(
            param(json!({"type": "json_schema", "json_schema": {"schema": {}}})).as_deref(),
            Some("response_format.json_schema.name")
        );
        assert_eq!(
            param(json!({"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}))
                .as_deref(),
            Some("response_format.json_schema.schema")
        );
    }

    #[test]
    fn a_schema_that_does_not_compile_is_named_with_the_reason() {
        let g = Grammars::new(Arc::new(crate::tokenizer::tests::tiny()), vec![1]);
        let w = response_format(Some(json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}})))
            .expect("shape ok")
            .expect("grammar");
        let e = compile_now(&g, &w).expect_err("bad schema");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            e.param.as_deref(),
            Some("response_format.json_schema.schema")
        );
        assert!(e.message.contains("frobnicate"), "{}", e.message);
        // A forced call whose function's parameters do not compile names that tool.
        let tools = json!([
            {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "b", "parameters": {"type": "nope"}}}
        ]);
        let req = super::super::tools::parse_request(Some(tools), Some(json!("required")), None)
            .expect("valid tools")
            .expect("tools");
        let w = wanted(None, Some(&req)).expect("ok").expect("grammar");
        let e = compile_now(&g, &w).expect_err("bad parameters");
        assert_eq!(e.param.as_deref(), Some("tools[1].function.parameters"));
        // JSON output with auto tools is refused; text with auto tools gets
        // the grammar that switches at `<tool_call>`.
        let auto = super::super::tools::parse_request(
            Some(json!([{"type": "function", "function": {"name": "a"}}])),
            None,
            None,
        )
        .expect("ok")
        .expect("tools");
        let json_format = response_format(Some(json!({"type": "json_object"}))).expect("ok");
        assert_eq!(
            wanted(json_format, Some(&auto))
                .expect_err("refused")
                .param
                .as_deref(),
            Some("response_format")
        );
        let w = wanted(None, Some(&auto))
            .expect("ok")
            .expect("auto grammar");
        assert_eq!(w.param, "tools");
        assert!(matches!(&w.spec, GrammarSpec::Lark(l) if l.contains("pre[lazy]")));
    }
}
