//! Rewriting the decode engine's answer: `usage.prompt_tokens_details.cached_tokens`
//! becomes the prefill side's value.
//!
//! Why: in a two-hop request the decode engine's count says how much it
//! loaded from the fabric, but the number the client cares about is how much
//! of its prompt the cluster did not have to compute, which the prefill hop
//! measured. Non-streamed answers are one JSON object; streamed answers are
//! rewritten event by event ([`SseRewriter`]): bytes are held back only until
//! the end of the current event (`\n\n`), never for the whole stream, and
//! events without usage pass through untouched, byte for byte.

use bytes::Bytes;
use serde_json::Value;

/// Replace the cached-token count in an object that has `usage`; true when changed.
pub(crate) fn replace_cached_tokens(v: &mut Value, cached_tokens: u64) -> bool {
    let Some(usage) = v.get_mut("usage").and_then(Value::as_object_mut) else {
        return false;
    };
    let details = usage
        .entry("prompt_tokens_details")
        .or_insert_with(|| Value::Object(Default::default()));
    match details.as_object_mut() {
        Some(d) => {
            d.insert("cached_tokens".into(), Value::from(cached_tokens));
            true
        }
        None => false,
    }
}

/// Rewrites an SSE byte stream event by event.
#[derive(Debug)]
pub(crate) struct SseRewriter {
    cached_tokens: u64,
    /// Bytes of the event not yet complete.
    pending: Vec<u8>,
}

impl SseRewriter {
    pub fn new(cached_tokens: u64) -> SseRewriter {
        SseRewriter {
            cached_tokens,
            pending: Vec::new(),
        }
    }

    /// Feed bytes as they arrive; returns every event completed by them.
    pub fn push(&mut self, chunk: &[u8]) -> Bytes {
        self.pending.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(end) = event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end).collect();
            out.extend_from_slice(&self.rewrite_event(&event));
        }
        Bytes::from(out)
    }

    /// The incomplete tail at the end of the stream, as is.
    pub fn finish(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.pending))
    }

    /// One event (including its blank-line terminator).
    fn rewrite_event(&self, event: &[u8]) -> Vec<u8> {
        let Ok(text) = std::str::from_utf8(event) else {
            return event.to_vec();
        };
        if !text.contains("\"usage\"") {
            return event.to_vec();
        }
        let mut out = String::with_capacity(text.len());
        let mut changed = false;
        for line in text.split_inclusive('\n') {
            let body = line.trim_end_matches(['\r', '\n']);
            let ending = &line[body.len()..];
            if let Some(data) = body.strip_prefix("data:") {
                if let Ok(mut v) = serde_json::from_str::<Value>(data.trim_start()) {
                    if replace_cached_tokens(&mut v, self.cached_tokens) {
                        out.push_str("data: ");
                        out.push_str(&v.to_string());
                        out.push_str(ending);
                        changed = true;
                        continue;
                    }
                }
            }
            out.push_str(line);
        }
        if changed {
            out.into_bytes()
        } else {
            event.to_vec()
        }
    }
}

/// End (exclusive) of the first complete event: after `\n\n` or `\r\n\r\n`.
fn event_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_answer_gets_the_prefill_count() {
        let mut v =
            json!({"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 0}}});
        assert!(replace_cached_tokens(&mut v, 64));
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 64);
        assert_eq!(v["usage"]["prompt_tokens"], 9);
        let mut no_usage = json!({"choices": []});
        assert!(!replace_cached_tokens(&mut no_usage, 64));
        assert_eq!(no_usage, json!({"choices": []}));
    }

    #[test]
    fn sse_events_pass_through_and_usage_is_rewritten_across_split_chunks() {
        let text = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n";
        let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n";
        let done = "data: [DONE]\n\n";
        let stream = format!("{text}{usage}{done}");
        let mut r = SseRewriter::new(3);
        let mut out = Vec::new();
        // Feed in awkward pieces: events split mid-line and mid-terminator.
        for piece in stream.as_bytes().chunks(7) {
            let got = r.push(piece);
            // Only whole events come out.
            if !got.is_empty() {
                assert!(got.ends_with(b"\n\n"), "{got:?}");
            }
            out.extend_from_slice(&got);
        }
        out.extend_from_slice(&r.finish());
        let out = String::from_utf8(out).expect("utf8");
        let events: Vec<&str> = out.split_inclusive("\n\n").collect();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0], text, "non-usage events are byte-identical");
        let v: Value =
            serde_json::from_str(events[1].trim_start_matches("data: ").trim()).expect("json");
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
        assert_eq!(events[2], done);
    }

    #[test]
    fn first_event_comes_out_before_the_stream_ends() {
        let mut r = SseRewriter::new(1);
        let got = r.push(b"data: {\"x\":1}\n\ndata: {\"y\"");
        assert_eq!(&got[..], b"data: {\"x\":1}\n\n");
        assert_eq!(&r.finish()[..], b"data: {\"y\"");
        assert_eq!(event_end(b"a\r\n\r\nb"), Some(5));
    }
}
