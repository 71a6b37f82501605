//! `bench eviction --trace FILE`: an external trace as JSON lines, one
//! request per line, so traces nobody here wrote can be replayed.
//!
//! A line is an object with either `tokens` (the prompt's token ids: its full
//! blocks are keyed by the block-key chain, the prompt's last token is never
//! a hit, as in the generated traces) or `blocks` (the request's block keys in
//! prefix order, strings or integers: all of them are looked up and put), an
//! optional `namespace` (string: a tenant's keys never match another's) and
//! an optional `timestamp` (number; must not decrease, else the line is
//! refused: the replay keeps file order). Blank lines are skipped. A bad line
//! is an error naming its line number and why.

use std::path::Path;

use anyhow::Context;
use kvfabric_store::{KeyChain, KvLayout, ModelFingerprint};
use serde_json::Value;

use super::traces::{Request, Trace};

/// Read and key the trace at `path`.
pub fn load(path: &Path, layout: &KvLayout) -> anyhow::Result<Trace> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading trace {}", path.display()))?;
    from_text(path, &text, layout)
}

/// Key the trace `text` read from `path`.
pub fn from_text(path: &Path, text: &str, layout: &KvLayout) -> anyhow::Result<Trace> {
    let requests = parse(text, layout).with_context(|| format!("trace {}", path.display()))?;
    anyhow::ensure!(
        !requests.is_empty(),
        "trace {} has no request",
        path.display()
    );
    let mut t = Trace {
        name: path
            .file_name()
            .map_or("trace".into(), |n| n.to_string_lossy().into_owned()),
        requests,
        block_tokens: layout.block_tokens as usize,
        capacity_base: 0,
    };
    t.capacity_base = t.distinct_blocks();
    Ok(t)
}

/// The requests of a JSON-lines trace.
pub fn parse(text: &str, layout: &KvLayout) -> anyhow::Result<Vec<Request>> {
    let mut chains: std::collections::HashMap<String, KeyChain> = Default::default();
    let mut last_ts = f64::NEG_INFINITY;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r = parse_line(line, layout, &mut chains, &mut last_ts)
            .with_context(|| format!("line {}", i + 1))?;
        out.push(r);
    }
    Ok(out)
}

fn parse_line(
    line: &str,
    layout: &KvLayout,
    chains: &mut std::collections::HashMap<String, KeyChain>,
    last_ts: &mut f64,
) -> anyhow::Result<Request> {
    let v: Value = serde_json::from_str(line).context("not valid JSON")?;
    let obj = v.as_object().context("not a JSON object")?;
    for k in obj.keys() {
        anyhow::ensure!(
            matches!(k.as_str(), "tokens" | "blocks" | "namespace" | "timestamp"),
            "unknown field `{k}` (expected tokens, blocks, namespace, timestamp)"
        );
    }
    let ns = match obj.get("namespace") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s.as_str(),
        Some(_) => anyhow::bail!("`namespace` must be a string"),
    };
    if let Some(ts) = obj.get("timestamp") {
        let ts = ts.as_f64().context("`timestamp` must be a number")?;
        anyhow::ensure!(
            ts >= *last_ts,
            "timestamp {ts} is earlier than the line before ({last_ts})"
        );
        *last_ts = ts;
    }
    let chain = chains
        .entry(ns.to_string())
        .or_insert_with(|| KeyChain::new(ns.as_bytes(), &ModelFingerprint([9; 32]), layout));
    let bt = chain.block_tokens();
    match (obj.get("tokens"), obj.get("blocks")) {
        (Some(_), Some(_)) => anyhow::bail!("has both `tokens` and `blocks`"),
        (None, None) => anyhow::bail!("has neither `tokens` nor `blocks`"),
        (Some(t), None) => {
            let arr = t.as_array().context("`tokens` must be an array")?;
            let tokens = arr
                .iter()
                .enumerate()
                .map(|(j, x)| {
                    x.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .with_context(|| format!("tokens[{j}] is not a token id (0..2^32)"))
                })
                .collect::<anyhow::Result<Vec<u32>>>()?;
            let keys = chain.keys(&tokens[..tokens.len() / bt * bt]);
            Ok(Request {
                usable: tokens.len().saturating_sub(1) / bt,
                keys,
                prompt_tokens: tokens.len(),
                agent: true,
            })
        }
        (None, Some(b)) => {
            let arr = b.as_array().context("`blocks` must be an array")?;
            let keys = arr
                .iter()
                .enumerate()
                .map(|(j, x)| {
                    let id = match x {
                        Value::String(s) if !s.is_empty() => s.clone(),
                        Value::Number(n) => n.to_string(),
                        _ => anyhow::bail!("blocks[{j}] must be a non-empty string or a number"),
                    };
                    let words: Vec<u32> = id.bytes().map(u32::from).collect();
                    Ok(chain.next(None, &words))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok(Request {
                usable: keys.len(),
                prompt_tokens: keys.len() * bt,
                keys,
                agent: true,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> KvLayout {
        super::super::replay::small_layout(4)
    }

    fn err(text: &str) -> String {
        format!("{:#}", parse(text, &layout()).unwrap_err())
    }

    #[test]
    fn token_and_block_lines_become_requests() {
        let text = "{\"tokens\":[1,2,3,4,5,6,7,8,9]}\n\n{\"blocks\":[\"a\",7],\"namespace\":\"t1\",\"timestamp\":3}\n{\"blocks\":[\"a\"],\"namespace\":\"t2\"}\n";
        let r = parse(text, &layout()).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(
            (r[0].keys.len(), r[0].usable, r[0].prompt_tokens),
            (2, 2, 9)
        );
        assert_eq!(
            (r[1].keys.len(), r[1].usable, r[1].prompt_tokens),
            (2, 2, 8)
        );
        // Same block id, other namespace: another key.
        assert_ne!(r[1].keys[0], r[2].keys[0]);
        // The same text parses to the same keys.
        assert_eq!(r, parse(text, &layout()).unwrap());
    }

    #[test]
    fn bad_lines_name_their_line_and_reason() {
        let ok = "{\"tokens\":[1,2,3,4,5]}\n";
        assert!(err(&format!("{ok}{{\"tokens\":[1,2\n")).contains("line 2: not valid JSON"));
        assert!(err(&format!("{ok}[1,2]\n")).contains("line 2: not a JSON object"));
        assert!(err(&format!("{ok}{ok}{{}}\n")).contains("line 3: has neither"));
        assert!(err("{\"tokens\":[1],\"blocks\":[1]}").contains("line 1: has both"));
        assert!(err("{\"tokens\":[1,-2]}").contains("line 1: tokens[1] is not a token id"));
        assert!(err("{\"tokens\":[1],\"namespace\":3}")
            .contains("line 1: `namespace` must be a string"));
        assert!(err("{\"blocks\":[\"\"]}").contains("line 1: blocks[0] must be"));
        assert!(err("{\"tokens\":[1],\"tenant\":\"x\"}").contains("line 1: unknown field `tenant`"));
        assert!(
            err("{\"tokens\":[1],\"timestamp\":5}\n{\"tokens\":[1],\"timestamp\":4}")
                .contains("line 2: timestamp 4 is earlier")
        );
    }
}
