//! `bench eviction --trace FILE --trace-format mooncake`: the traces of the
//! Mooncake FAST'25 release (github.com/kvcache-ai/Mooncake,
//! FAST25-release/traces/), one request per line: `timestamp` (ms, not
//! decreasing), `input_length`, `output_length` (tokens) and `hash_ids`, the
//! ids of the prompt's 512-token blocks in prefix order, equal ids being
//! the same prefix block. Each line is replayed as a `blocks` line of
//! `file` (every id looked up, then the misses put; the hit ratio is per
//! block, as the tokens of a block count alike), so the keys and checks are
//! `file`'s. Unknown fields are refused, as there.

use std::path::Path;

use anyhow::Context;
use kvfabric_store::KvLayout;
use serde_json::{json, Value};

use super::file;
use super::traces::Trace;

/// Read and key the Mooncake trace at `path`.
pub fn load(path: &Path, layout: &KvLayout) -> anyhow::Result<Trace> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading trace {}", path.display()))?;
    let lines = to_block_lines(&text).with_context(|| format!("trace {}", path.display()))?;
    file::from_text(path, &lines, layout)
}

/// The trace's lines as `file`'s `blocks` lines (blank lines kept, so
/// errors name the original line).
pub fn to_block_lines(text: &str) -> anyhow::Result<String> {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.lines().enumerate() {
        if !line.trim().is_empty() {
            let l = convert(line).with_context(|| format!("line {}", i + 1))?;
            out.push_str(&l);
        }
        out.push('\n');
    }
    Ok(out)
}

fn convert(line: &str) -> anyhow::Result<String> {
    let v: Value = serde_json::from_str(line).context("not valid JSON")?;
    let obj = v.as_object().context("not a JSON object")?;
    for k in obj.keys() {
        anyhow::ensure!(
            matches!(
                k.as_str(),
                "timestamp" | "input_length" | "output_length" | "hash_ids"
            ),
            "unknown field `{k}` (expected timestamp, input_length, output_length, hash_ids)"
        );
    }
    let ids = obj
        .get("hash_ids")
        .context("has no `hash_ids`")?
        .as_array()
        .context("`hash_ids` must be an array")?;
    anyhow::ensure!(!ids.is_empty(), "`hash_ids` is empty");
    for (j, id) in ids.iter().enumerate() {
        anyhow::ensure!(id.is_u64(), "hash_ids[{j}] is not a non-negative integer");
    }
    let mut o = json!({ "blocks": ids });
    if let Some(ts) = obj.get("timestamp") {
        o["timestamp"] = ts.clone();
    }
    Ok(o.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mooncake_lines_become_block_requests() {
        let text = "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 6, \"hash_ids\": [0, 1, 2]}\n\n{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 9, \"hash_ids\": [0, 3]}\n";
        let layout = super::super::replay::small_layout(4);
        let r = file::parse(&to_block_lines(text).unwrap(), &layout).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].keys.len(), r[0].usable), (3, 3));
        // Equal ids, equal keys.
        assert_eq!(r[0].keys[0], r[1].keys[0]);
        assert_ne!(r[0].keys[1], r[1].keys[1]);
    }

    #[test]
    fn bad_mooncake_lines_name_their_line() {
        let err = |t: &str| format!("{:#}", to_block_lines(t).unwrap_err());
        assert!(
            err("{\"hash_ids\": [1]}\n{\"hash_ids\": []}").contains("line 2: `hash_ids` is empty")
        );
        assert!(err("{\"hash_ids\": [1, -2]}").contains("line 1: hash_ids[1]"));
        assert!(err("{\"timestamp\": 1}").contains("line 1: has no `hash_ids`"));
        assert!(err("{\"hash_ids\": [1], \"tokens\": [1]}").contains("unknown field `tokens`"));
        // A decreasing timestamp is refused by the block lines' parser.
        let layout = super::super::replay::small_layout(4);
        let lines = to_block_lines(
            "{\"timestamp\": 5, \"hash_ids\": [1]}\n{\"timestamp\": 4, \"hash_ids\": [1]}",
        )
        .unwrap();
        assert!(format!("{:#}", file::parse(&lines, &layout).unwrap_err()).contains("line 2"));
    }
}
