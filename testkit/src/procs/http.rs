//! A minimal blocking HTTP/1.1 client for the processes' HTTP ports (the
//! engine's OpenAI API and /metrics, a node's /metrics, /health and
//! console): one request per connection (`Connection: close`), bodies
//! decoded by [`super::parse_response`].

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

use super::parse_response;

/// One request; (status, body bytes). `timeout` bounds each read.
pub fn exchange(
    addr: &str,
    method: &str,
    path: &str,
    headers: &str,
    payload: &str,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    parse_response(&raw)
}

/// GET `path`; the body as text, or an error unless the status is 200.
pub fn get_ok(addr: &str, path: &str) -> Result<String, String> {
    get_ok_as(addr, path, None)
}

/// [`get_ok`] with `Authorization: Bearer <api_key>` when a key is given (a
/// node's HTTP port with a tenants file answers operators' keys only).
pub fn get_ok_as(addr: &str, path: &str, api_key: Option<&str>) -> Result<String, String> {
    let auth = api_key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let (status, body) = exchange(addr, "GET", path, &auth, "", Duration::from_secs(10))?;
    if status != 200 {
        return Err(format!("{path}: HTTP {status}"));
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// [`get_ok`], parsed as JSON.
pub fn get_json(addr: &str, path: &str) -> Result<Value, String> {
    serde_json::from_str(get_ok(addr, path)?.trim()).map_err(|e| e.to_string())
}

/// One JSON request; (status, JSON body or Null).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), String> {
    http_with_key(addr, method, path, body, None)
}

/// [`http`] with `Authorization: Bearer <api_key>` when a key is given.
pub fn http_with_key(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
    api_key: Option<&str>,
) -> Result<(u16, Value), String> {
    let auth = api_key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let headers = format!("{auth}Content-Type: application/json\r\n");
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let (status, body) = exchange(
        addr,
        method,
        path,
        &headers,
        &payload,
        Duration::from_secs(120),
    )?;
    let json = serde_json::from_slice(body.trim_ascii()).unwrap_or(Value::Null);
    Ok((status, json))
}

/// A Prometheus counter or gauge from `addr`'s /metrics: the sum of every
/// series line starting with `name` (0 if absent or unreachable).
pub fn metric(addr: &str, name: &str) -> f64 {
    metric_as(addr, name, None)
}

/// [`metric`] with `Authorization: Bearer <api_key>` when a key is given.
pub fn metric_as(addr: &str, name: &str, api_key: Option<&str>) -> f64 {
    let Ok(body) = get_ok_as(addr, "/metrics", api_key) else {
        return 0.0;
    };
    crate::metrics::prefix_sum(&body, name)
}
