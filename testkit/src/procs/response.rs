//! HTTP/1.1 response framing for the test client: the status line, and a body
//! framed by `Transfer-Encoding: chunked`, `Content-Length`, or the end of the
//! connection (the client always sends `Connection: close`). Chunked bodies
//! are decoded, not handed back with their size lines (axum streams some
//! responses that way, and the client then saw no JSON at all).

/// (status, body) from a whole response as read until the server closed.
pub fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let end = find(raw, b"\r\n\r\n").ok_or("no HTTP header end")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "header is not UTF-8")?;
    let rest = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or("bad status line")?;
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        let (name, value) = line.split_once(':').ok_or("bad header line")?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            // The last coding frames the body; only chunked is understood.
            let last = value.rsplit(',').next().unwrap_or("").trim();
            chunked = last.eq_ignore_ascii_case("chunked");
            if !chunked {
                return Err(format!("unsupported transfer-encoding {value:?}"));
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value.parse().map_err(|_| "bad content-length")?;
            length = Some(n);
        }
    }
    let body = if chunked {
        decode_chunked(rest)?
    } else if let Some(n) = length {
        rest.get(..n)
            .ok_or("body shorter than content-length")?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok((status, body))
}

/// The payload of a chunked body: each chunk is a hex size (optionally
/// `;extensions`), CRLF, that many bytes, CRLF; a zero size ends it, then
/// trailer lines up to an empty line.
pub fn decode_chunked(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let (line, rest) = split_line(data).ok_or("chunk size line without CRLF")?;
        let size = line.split(|&b| b == b';').next().unwrap_or(b"");
        let size = std::str::from_utf8(size).map_err(|_| "chunk size is not text")?;
        let size = size.trim_matches(|c| c == ' ' || c == '\t');
        if size.is_empty() || !size.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("bad chunk size {size:?}"));
        }
        let size = usize::from_str_radix(size, 16).map_err(|e| format!("chunk size: {e}"))?;
        if size == 0 {
            return skip_trailers(rest).map(|()| body);
        }
        let chunk = rest.get(..size).ok_or("chunk shorter than its size")?;
        body.extend_from_slice(chunk);
        data = rest[size..]
            .strip_prefix(b"\r\n")
            .ok_or("chunk data not followed by CRLF")?;
    }
}

/// Trailer fields after the last chunk, up to the empty line that ends the body.
fn skip_trailers(mut data: &[u8]) -> Result<(), String> {
    loop {
        let (line, rest) = split_line(data).ok_or("body ends inside its trailers")?;
        if line.is_empty() {
            return Ok(());
        }
        if !line.contains(&b':') {
            return Err("bad trailer line".into());
        }
        data = rest;
    }
}

/// (the line before the first CRLF, what follows it).
fn split_line(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = find(data, b"\r\n")?;
    Some((&data[..i], &data[i + 2..]))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(headers: &str, body: &str) -> Vec<u8> {
        format!("HTTP/1.1 200 OK\r\n{headers}\r\n\r\n{body}").into_bytes()
    }

    #[test]
    fn chunked_body_with_extensions_and_trailers() {
        let body = "7;name=value\r\n{\"a\": 1\r\nA\r\n, \"b\": [2]\r\n1 ; x\r\n}\r\n\
                    0;last\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n";
        let raw = response(
            "Content-Type: application/json\r\nTransfer-Encoding: chunked",
            body,
        );
        let (status, got) = parse_response(&raw).unwrap();
        assert_eq!(status, 200);
        assert_eq!(got, br#"{"a": 1, "b": [2]}"#);
        let v: serde_json::Value = serde_json::from_slice(&got).unwrap();
        assert_eq!(v["b"][0], 2);
    }

    #[test]
    fn chunked_body_without_trailers_and_in_upper_case() {
        let raw = response("transfer-encoding: Chunked", "3\r\nabc\r\n0\r\n\r\n");
        assert_eq!(parse_response(&raw).unwrap().1, b"abc");
    }

    #[test]
    fn content_length_and_close_delimited_bodies() {
        let raw = response("Content-Length: 5", "hello, and more");
        assert_eq!(parse_response(&raw).unwrap(), (200, b"hello".to_vec()));
        let raw = response("Content-Type: text/plain", "all of it");
        assert_eq!(parse_response(&raw).unwrap().1, b"all of it");
        let raw = response("Content-Length: 50", "short");
        assert!(parse_response(&raw).is_err());
    }

    #[test]
    fn malformed_chunks_are_errors() {
        for bad in [
            "zz\r\nabc\r\n0\r\n\r\n",      // size is not hex
            "\r\nabc\r\n0\r\n\r\n",        // no size
            "5\r\nabc\r\n0\r\n\r\n",       // data shorter than its size
            "3\r\nabcd\r\n0\r\n\r\n",      // data longer than its size
            "3\r\nabc",                    // cut off after the data
            "3\r\nabc\r\n",                // no last chunk
            "3\r\nabc\r\n0\r\nX-T: t\r\n", // cut off in the trailers
            "ffffffffffffffffffff\r\n",    // size overflows
        ] {
            assert!(decode_chunked(bad.as_bytes()).is_err(), "{bad:?} decoded");
        }
        let raw = response("Transfer-Encoding: chunked", "3\r\nabc");
        assert!(parse_response(&raw).is_err());
    }

    /// The client end to end: a loopback server answers with a chunked JSON
    /// body, which the client decodes whole (not as Null).
    #[test]
    fn the_client_reads_a_chunked_json_response() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut req = Vec::new();
            while !req.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8; 1];
                s.read_exact(&mut byte).unwrap();
                req.push(byte[0]);
            }
            s.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                  transfer-encoding: chunked\r\n\r\n\
                  8\r\n{\"ok\": t\r\n5\r\nrue}\n\r\n0\r\n\r\n",
            )
            .unwrap();
        });
        let (status, v) = super::super::http(&addr, "GET", "/v1/models", None).unwrap();
        server.join().unwrap();
        assert_eq!(status, 200);
        assert_eq!(v["ok"], true, "{v}");
    }
}
