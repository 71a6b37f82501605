//! A minimal blocking HTTP/1.1 client for the soak's driver threads (each
//! inside host 0's network namespace): one request per connection,
//! sized or chunked bodies, and a completion call that retries what a
//! fault broke.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

/// One request; (status, JSON body or Null). Errors are transport errors.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
    timeout: Duration,
) -> Result<(u16, Value), String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(5)))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let payload = body.map(Value::to_string).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("read {addr}: {e}"))?;
    parse(&raw)
}

fn parse(raw: &[u8]) -> Result<(u16, Value), String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no status")?;
    let mut body = raw[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body)?;
    }
    let json = serde_json::from_slice(body.trim_ascii()).unwrap_or(Value::Null);
    Ok((status, json))
}

pub(crate) fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").ok_or("bad chunk")?;
        let size = usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16)
            .map_err(|e| format!("chunk size: {e}"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = b.get(..size).ok_or("short chunk")?;
        out.extend_from_slice(chunk);
        b = b.get(size + 2..).ok_or("short chunk end")?;
    }
}

/// A greedy completion's answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub text: String,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Tries that failed before this one succeeded.
    pub retries: u32,
    pub latency: Duration,
}

/// POST /v1/completions (greedy), retried up to `tries` times on a
/// transport error or a 5xx (what a kill, a partition or a restart
/// produces), `backoff` apart. No try starts after `deadline`, and none
/// waits past it (each waits at most 120 s). Err: every try failed (the
/// last error).
pub fn complete(
    addr: SocketAddr,
    prompt: &str,
    max_tokens: usize,
    (tries, backoff): (u32, Duration),
    deadline: Instant,
) -> Result<Answer, String> {
    let body = serde_json::json!({
        "model": "smollm2",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
    });
    let started = Instant::now();
    let mut last = String::new();
    for attempt in 0..tries.max(1) {
        if attempt > 0 {
            std::thread::sleep(backoff);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            last = format!("deadline passed ({last})");
            break;
        }
        match http(
            addr,
            "POST",
            "/v1/completions",
            Some(&body),
            left.min(Duration::from_secs(120)),
        ) {
            Ok((200, v)) => {
                let usage = &v["usage"];
                return Ok(Answer {
                    text: v["choices"][0]["text"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
                    cached_tokens: usage["prompt_tokens_details"]["cached_tokens"]
                        .as_u64()
                        .unwrap_or(0),
                    retries: attempt,
                    latency: started.elapsed(),
                });
            }
            Ok((status, v)) if status >= 500 => last = format!("{status}: {v}"),
            Ok((status, v)) => return Err(format!("{status}: {v}")),
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sized_and_chunked_bodies_parse() {
        let sized = b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\n{\"a\":1}\n";
        assert_eq!(parse(sized).expect("sized").1["a"], 1);
        let chunked =
            b"HTTP/1.1 503 X\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:2}\r\n0\r\n\r\n";
        let (status, v) = parse(chunked).expect("chunked");
        assert_eq!((status, v["a"].as_u64()), (503, Some(2)));
        assert!(parse(b"garbage").is_err());
    }
}
