//! An input file's lines: `{custom_id, method, url, body}` each, checked
//! against the batch's endpoint. A bad line becomes an error-file line of
//! its own; the other lines still run.

use serde_json::{json, Value};

/// One non-blank line of an input file.
#[derive(Debug, PartialEq)]
pub struct InputLine {
    pub custom_id: Option<String>,
    /// The request body to send to the endpoint, or why the line cannot run
    /// (`code`, `message`).
    pub body: Result<Vec<u8>, (&'static str, String)>,
}

/// The non-blank lines of `content`, in order, each checked for `endpoint`.
pub fn parse(content: &[u8], endpoint: &str) -> Vec<InputLine> {
    content
        .split(|&b| b == b'\n')
        .filter(|l| !l.trim_ascii().is_empty())
        .map(|l| parse_line(l, endpoint))
        .collect()
}

fn parse_line(line: &[u8], endpoint: &str) -> InputLine {
    let value: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            return InputLine {
                custom_id: None,
                body: Err(("invalid_json", format!("the line is not valid JSON: {e}"))),
            }
        }
    };
    let custom_id = value
        .get("custom_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let body = check(&value, endpoint, custom_id.is_some());
    InputLine { custom_id, body }
}

fn check(v: &Value, endpoint: &str, has_id: bool) -> Result<Vec<u8>, (&'static str, String)> {
    let bad = |m: String| Err(("invalid_request", m));
    if !v.is_object() {
        return bad("the line must be a JSON object".into());
    }
    if !has_id {
        return bad("custom_id must be a string".into());
    }
    match v.get("method").and_then(Value::as_str) {
        Some("POST") => {}
        other => return bad(format!("method must be POST, got {other:?}")),
    }
    match v.get("url").and_then(Value::as_str) {
        Some(u) if u == endpoint => {}
        other => {
            return bad(format!(
                "url must be the batch's endpoint {endpoint}, got {other:?}"
            ))
        }
    }
    let Some(body) = v.get("body").filter(|b| b.is_object()) else {
        return bad("body must be a JSON object".into());
    };
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        return bad("stream is not supported in a batch".into());
    }
    serde_json::to_vec(body).map_err(|e| ("invalid_request", e.to_string()))
}

/// An output- or error-file line for a response.
pub fn response_line(
    id: &str,
    custom_id: Option<&str>,
    status: u16,
    request_id: &str,
    body: Value,
) -> Value {
    json!({
        "id": id,
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": null,
    })
}

/// An error-file line for a line that could not run.
pub fn error_line(id: &str, custom_id: Option<&str>, code: &str, message: &str) -> Value {
    json!({
        "id": id,
        "custom_id": custom_id,
        "response": null,
        "error": {"code": code, "message": message},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lines_are_errors_of_their_own() {
        let ep = "/v1/chat/completions";
        let content = b"{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\"}}\n\n{not json\n{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}\n{\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{}}\n{\"custom_id\":\"e\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"stream\":true}}\n";
        let lines = parse(content, ep);
        assert_eq!(lines.len(), 5, "the blank line is skipped");
        assert_eq!(lines[0].body, Ok(b"{\"model\":\"m\"}".to_vec()));
        assert_eq!(lines[1].body.as_ref().map_err(|e| e.0), Err("invalid_json"));
        assert_eq!(lines[2].custom_id.as_deref(), Some("c"));
        assert!(lines[2].body.as_ref().is_err_and(|e| e.1.contains("url")));
        assert!(lines[3]
            .body
            .as_ref()
            .is_err_and(|e| e.1.contains("custom_id")));
        assert!(lines[4]
            .body
            .as_ref()
            .is_err_and(|e| e.1.contains("stream")));
    }
}
