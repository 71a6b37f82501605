//! `multipart/form-data` bodies (RFC 7578), enough for `POST /v1/files`:
//! the parts' names, file names and contents. The whole body is in memory
//! (its size is capped by `[engine.batch] max_file_bytes`).

/// One part of a form.
#[derive(Debug, PartialEq)]
pub struct Part<'a> {
    pub name: String,
    pub filename: Option<String>,
    pub data: &'a [u8],
}

/// The boundary of a `multipart/form-data; boundary=...` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let mut params = content_type.split(';');
    let kind = params.next()?.trim();
    if !kind.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_string())
            .filter(|b| !b.is_empty())
    })
}

/// Split `body` into its parts; `Err` names what is malformed.
pub fn parse<'a>(body: &'a [u8], boundary: &str) -> Result<Vec<Part<'a>>, String> {
    let delim = format!("--{boundary}");
    let finder = aho_corasick::AhoCorasick::new([delim.as_bytes()])
        .map_err(|e| format!("bad boundary: {e}"))?;
    let starts: Vec<(usize, usize)> = finder
        .find_iter(body)
        .map(|m| (m.start(), m.end()))
        .collect();
    if starts.is_empty() {
        return Err("no multipart boundary in the body".into());
    }
    let mut parts = Vec::new();
    for w in starts.windows(2) {
        let (start, end) = (w[0].1, w[1].0);
        // Each part: CRLF, headers, CRLF CRLF, data, CRLF (before the next delimiter).
        let chunk = &body[start..end];
        let chunk = chunk.strip_prefix(b"\r\n").unwrap_or(chunk);
        let chunk = chunk.strip_suffix(b"\r\n").unwrap_or(chunk);
        let split = chunk
            .windows(4)
            .position(|x| x == b"\r\n\r\n")
            .ok_or("a part without a header block")?;
        let headers = std::str::from_utf8(&chunk[..split]).map_err(|_| "non-UTF-8 part headers")?;
        let data = &chunk[split + 4..];
        let disposition = headers
            .split("\r\n")
            .find_map(|h| {
                let (k, v) = h.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-disposition")
                    .then_some(v)
            })
            .ok_or("a part without Content-Disposition")?;
        let name = param(disposition, "name").ok_or("a part without a name")?;
        parts.push(Part {
            name,
            filename: param(disposition, "filename"),
            data,
        });
    }
    let last = starts[starts.len() - 1].1;
    if !body[last..].starts_with(b"--") {
        return Err("the body does not end with the closing boundary".into());
    }
    Ok(parts)
}

/// `key="value"` (or unquoted) in a Content-Disposition value.
fn param(disposition: &str, key: &str) -> Option<String> {
    disposition.split(';').skip(1).find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_with_a_file_and_a_field_parses() {
        let ct = "multipart/form-data; boundary=\"xyz\"";
        let b = boundary(ct).expect("boundary");
        let body = b"--xyz\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\nContent-Type: application/octet-stream\r\n\r\n{\"a\":1}\r\n{\"b\":2}\n\r\n--xyz--\r\n";
        let parts = parse(body, &b).expect("parts");
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name, "purpose");
        assert_eq!(parts[0].data, b"batch");
        assert_eq!(parts[1].filename.as_deref(), Some("in.jsonl"));
        assert_eq!(parts[1].data, b"{\"a\":1}\r\n{\"b\":2}\n");
    }

    #[test]
    fn malformed_forms_are_refused() {
        assert_eq!(boundary("application/json"), None);
        assert!(parse(b"no boundary here", "xyz").is_err());
        let cut = b"--xyz\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nv\r\n--xyz";
        assert!(parse(cut, "xyz").is_err(), "no closing boundary");
        let nameless = b"--xyz\r\nContent-Disposition: form-data\r\n\r\nv\r\n--xyz--";
        assert!(parse(nameless, "xyz").is_err());
    }
}
