//! A small WebDriver client for the console test: `chromedriver` (Debian's
//! `chromium-driver`) driving a headless Debian `chromium`, spoken to over
//! the W3C WebDriver protocol (JSON over HTTP/1.1 on loopback). Just what the
//! test needs: a session, navigation, scripts, the browser log, screenshots.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The browser and its driver, when both are installed.
pub fn find_browser() -> Option<(PathBuf, PathBuf)> {
    let which = |names: &[&str]| {
        names.iter().find_map(|n| {
            let out = Command::new("which").arg(n).output().ok()?;
            let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (out.status.success() && !p.is_empty()).then(|| PathBuf::from(p))
        })
    };
    Some((
        which(&["chromium", "chromium-browser", "google-chrome"])?,
        which(&["chromedriver"])?,
    ))
}

/// A running chromedriver and one browser session.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

impl Browser {
    /// Start `chromedriver` on a free port and open a headless session of `chromium`.
    pub async fn start(chromium: &Path, chromedriver: &Path, port: u16) -> Browser {
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let mut b = Browser {
            driver,
            port,
            session: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while b.request("GET", "/status", None).await.is_err() {
            assert!(Instant::now() < deadline, "chromedriver never answered");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.display().to_string(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1500,2300"],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let v = b
            .request("POST", "/session", Some(caps))
            .await
            .expect("new session");
        b.session = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id in {v}"))
            .to_string();
        b
    }

    /// Open `url`.
    pub async fn goto(&self, url: &str) {
        self.cmd("url", json!({ "url": url })).await;
    }

    /// Run `script` (a function body; `return` gives the result) in the page.
    pub async fn eval(&self, script: &str) -> Value {
        self.cmd("execute/sync", json!({"script": script, "args": []}))
            .await
    }

    /// The browser log since the last call (level, source, message of each entry).
    pub async fn log(&self) -> Vec<Value> {
        match self.cmd("se/log", json!({"type": "browser"})).await {
            Value::Array(v) => v,
            other => panic!("browser log: {other}"),
        }
    }

    /// A PNG screenshot of the viewport.
    pub async fn screenshot(&self) -> Vec<u8> {
        let v = self
            .request(
                "GET",
                &format!("/session/{}/screenshot", self.session),
                None,
            )
            .await
            .expect("screenshot");
        base64_decode(v.as_str().expect("base64 screenshot"))
    }

    async fn cmd(&self, what: &str, body: Value) -> Value {
        let path = format!("/session/{}/{what}", self.session);
        match self.request("POST", &path, Some(body)).await {
            Ok(v) => v,
            Err(e) => panic!("webdriver {what}: {e}"),
        }
    }

    /// One WebDriver call: the response's `value`, or its error.
    async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut s = TcpStream::connect(("127.0.0.1", self.port))
            .await
            .map_err(|e| e.to_string())?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let (head, payload) = tokio::time::timeout(Duration::from_secs(60), read_response(&mut s))
            .await
            .map_err(|_| format!("{method} {path}: no answer in 60 s"))??;
        let v: Value = serde_json::from_str(&payload).map_err(|e| format!("{e}: {payload}"))?;
        let value = v.get("value").cloned().unwrap_or(Value::Null);
        if !head.starts_with("HTTP/1.1 200") {
            return Err(format!("{}: {value}", head.lines().next().unwrap_or("")));
        }
        Ok(value)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Closing the session ends chromium; then the driver.
        let port = self.port;
        let path = format!("/session/{}", self.session);
        let _ = std::net::TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
            use std::io::{Read, Write};
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            write!(
                s,
                "DELETE {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            )?;
            let mut sink = Vec::new();
            s.read_to_end(&mut sink).map(|_| ())
        });
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// One HTTP/1.1 response: its head and body (by Content-Length, chunked, or to EOF;
/// chromedriver may keep the connection open after answering).
async fn read_response(s: &mut TcpStream) -> Result<(String, String), String> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 64 << 10];
    loop {
        let n = s.read(&mut buf).await.map_err(|e| e.to_string())?;
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let lower = head.to_ascii_lowercase();
            let length = lower.lines().find_map(|l| {
                l.strip_prefix("content-length:")
                    .and_then(|v| v.trim().parse::<usize>().ok())
            });
            let chunked = lower.contains("transfer-encoding: chunked");
            let done = match length {
                Some(len) => body.len() >= len,
                None => n == 0 || (chunked && body.ends_with("0\r\n\r\n")),
            };
            if done {
                let body = if chunked {
                    dechunk(body)
                } else {
                    body.to_string()
                };
                return Ok((head.to_string(), body));
            }
        }
        if n == 0 {
            return Err("connection closed before a full response".into());
        }
    }
}

fn dechunk(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in s.bytes().filter_map(val) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}
