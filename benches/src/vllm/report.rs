//! The report of `bench vllm` from the driver's per-request records: per
//! mode hit ratio (vLLM's `cached_tokens`, from its own cache or loaded
//! through the connector, over prompt tokens), the oracle hit ratio of the
//! mode's own trace (an infinite cache shared by both servers, whole
//! 128-token blocks: [`oracle_cached_tokens`]), TTFT p50/p90, load bytes,
//! answers identical to the `vllm` mode's; and the ratios the issue sets
//! targets on.

use serde_json::{json, Map, Value};

use crate::agentic::stats::percentile;
use crate::agentic::trace::{oracle_cached_tokens, TraceEntry};

/// vLLM's KV block on its CPU backend, in tokens.
pub const BLOCK_TOKENS: usize = 128;
/// The targets.
const HIT_OVER_ORACLE: f64 = 0.95;
const TTFT_OVER_VLLM: f64 = 1.0 / 3.0;

/// The driver's answer when it cannot run: every mode `unavailable`.
pub fn unavailable(modes: &[String], reason: &str) -> Value {
    let m: Map<String, Value> = modes
        .iter()
        .map(|n| {
            (
                n.clone(),
                json!({"status": "unavailable", "reason": reason}),
            )
        })
        .collect();
    json!({ "modes": m })
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .map(|x| x as u32)
                .collect()
        })
        .unwrap_or_default()
}

fn answers(records: &[Value]) -> Vec<((u64, u64), Vec<u32>)> {
    let mut out: Vec<_> = records
        .iter()
        .map(|r| {
            let key = (
                r["session"].as_u64().unwrap_or(0),
                r["turn"].as_u64().unwrap_or(0),
            );
            (key, ids(&r["answer"]))
        })
        .collect();
    out.sort();
    out
}

/// The figures of one mode that ran (`status: ok`).
fn mode_figures(mode: &Value, reference: Option<&[Value]>) -> Value {
    let records = mode["records"].as_array().map_or(&[][..], Vec::as_slice);
    let sum = |k: &str| records.iter().filter_map(|r| r[k].as_u64()).sum::<u64>();
    let (prompt, cached) = (sum("prompt_tokens"), sum("cached_tokens"));
    let trace: Vec<TraceEntry> = records
        .iter()
        .map(|r| TraceEntry {
            prompt: ids(&r["prompt"]),
            answer: ids(&r["answer"]),
        })
        .collect();
    let oracle: usize = oracle_cached_tokens(&trace, BLOCK_TOKENS).iter().sum();
    let ttft: Vec<f64> = records
        .iter()
        .filter_map(|r| r["ttft_ms"].as_f64())
        .collect();
    let ratio = |a: f64| if prompt > 0 { a / prompt as f64 } else { 0.0 };
    let mut out = json!({
        "status": "ok",
        "requests": records.len(),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_ratio": ratio(cached as f64),
        "oracle_hit_ratio": ratio(oracle as f64),
        "ttft_p50_ms": percentile(&ttft, 0.5),
        "ttft_p90_ms": percentile(&ttft, 0.9),
        "load_bytes": mode["load_bytes"],
        "answers_identical": reference.map(|r| answers(r) == answers(records)),
    });
    for k in ["load_bytes_note", "wall_s"] {
        if !mode[k].is_null() {
            out[k] = mode[k].clone();
        }
    }
    out
}

/// The whole report: `workload`, `modes.<name>` in `order`, `ratios` and `targets`.
pub fn assemble(workload: Value, order: &[String], driver: &Value) -> Value {
    let reference = driver["modes"]["vllm"]
        .get("records")
        .and_then(Value::as_array)
        .map(Vec::as_slice);
    let mut modes = Map::new();
    for name in order {
        let m = &driver["modes"][name.as_str()];
        let figures = if m["status"] == "ok" {
            mode_figures(m, reference)
        } else {
            let mut f = json!({
                "status": m["status"].as_str().unwrap_or("failed"),
                "reason": m["reason"].as_str().unwrap_or("the driver did not report this mode"),
                "hit_ratio": null, "oracle_hit_ratio": null, "ttft_p50_ms": null,
                "ttft_p90_ms": null, "load_bytes": null, "answers_identical": null,
            });
            if let Some(logs) = m["logs"].as_str() {
                f["logs"] = logs.into();
            }
            f
        };
        modes.insert(name.clone(), figures);
    }
    let (ratios, targets) = ratios(&modes);
    json!({"workload": workload, "modes": modes, "ratios": ratios, "targets": targets})
}

fn ratios(modes: &Map<String, Value>) -> (Value, Value) {
    let get = |m: &str, k: &str| modes.get(m).and_then(|v| v[k].as_f64());
    let div = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let hit = div(
        get("kvfabric", "hit_ratio"),
        get("kvfabric", "oracle_hit_ratio"),
    );
    let vs_vllm = div(get("kvfabric", "ttft_p50_ms"), get("vllm", "ttft_p50_ms"));
    let p50 = div(
        get("kvfabric", "ttft_p50_ms"),
        get("mooncake", "ttft_p50_ms"),
    );
    let p90 = div(
        get("kvfabric", "ttft_p90_ms"),
        get("mooncake", "ttft_p90_ms"),
    );
    let ratios = json!({
        "kvfabric_hit_over_oracle": hit,
        "kvfabric_ttft_p50_over_vllm": vs_vllm,
        "kvfabric_over_mooncake_ttft_p50": p50,
        "kvfabric_over_mooncake_ttft_p90": p90,
    });
    let targets = json!({
        "hit_ratio_ge_0_95_oracle": hit.map(|x| x >= HIT_OVER_ORACLE),
        "ttft_p50_le_third_of_vllm": vs_vllm.map(|x| x <= TTFT_OVER_VLLM),
        "ttft_p50_p90_le_mooncake": p50.zip(p90).map(|(a, b)| a <= 1.0 && b <= 1.0),
    });
    (ratios, targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(s: u64, t: u64, prompt: Vec<u32>, cached: u64, ttft: f64, answer: &[u32]) -> Value {
        json!({"session": s, "turn": t, "server": 0, "prompt_tokens": prompt.len(),
               "prompt": prompt, "answer": answer, "cached_tokens": cached, "ttft_ms": ttft})
    }

    /// Two sessions sharing a 300-token system prompt: the second request
    /// can reuse its 2 whole blocks, the third (session 0's turn 1, which
    /// extends turn 0's prompt and answer) 3 of its 3 usable blocks.
    fn trace(cached: [u64; 3], answer0: &[u32]) -> Vec<Value> {
        let system: Vec<u32> = (0..300).collect();
        let p0: Vec<u32> = system.iter().copied().chain(1000..1100).collect();
        let p1: Vec<u32> = system.iter().copied().chain(2000..2050).collect();
        let mut p2 = p0.clone();
        p2.extend_from_slice(&[7, 8]);
        p2.extend(3000..3100);
        vec![
            record(0, 0, p0, cached[0], 100.0, answer0),
            record(1, 0, p1, cached[1], 50.0, &[9]),
            record(0, 1, p2, cached[2], 30.0, &[5]),
        ]
    }

    fn driver(modes: Value) -> Value {
        json!({ "modes": modes })
    }

    #[test]
    fn figures_from_records() {
        let modes = driver(json!({
            "vllm": {"status": "ok", "records": trace([0, 256, 0], &[7, 8, 9]), "load_bytes": 0.0},
            "kvfabric": {"status": "ok", "records": trace([0, 256, 384], &[7, 8, 9]), "load_bytes": 1e6},
            "mooncake": {"status": "ok", "records": trace([0, 256, 256], &[7, 1, 9]), "load_bytes": null,
                         "load_bytes_note": "none"},
            "lmcache": {"status": "refused", "reason": "not installed"},
        }));
        let order: Vec<String> = ["vllm", "kvfabric", "mooncake", "lmcache"]
            .map(String::from)
            .into();
        let r = assemble(json!({}), &order, &modes);
        let k = &r["modes"]["kvfabric"];
        let prompt = 400 + 350 + 502;
        assert_eq!(k["prompt_tokens"], prompt);
        assert!((k["hit_ratio"].as_f64().unwrap() - 640.0 / prompt as f64).abs() < 1e-12);
        // Oracle: 0, 256 (system blocks), 384 (turn 0's prompt + answer).
        assert!((k["oracle_hit_ratio"].as_f64().unwrap() - 640.0 / prompt as f64).abs() < 1e-12);
        assert_eq!(k["ttft_p50_ms"], 50.0);
        assert_eq!(k["answers_identical"], true);
        assert_eq!(r["modes"]["mooncake"]["answers_identical"], false);
        assert_eq!(r["modes"]["mooncake"]["load_bytes"], Value::Null);
        assert_eq!(r["modes"]["lmcache"]["status"], "refused");
        assert_eq!(r["modes"]["lmcache"]["hit_ratio"], Value::Null);
        assert_eq!(r["ratios"]["kvfabric_hit_over_oracle"], 1.0);
        assert_eq!(r["ratios"]["kvfabric_ttft_p50_over_vllm"], 1.0);
        assert_eq!(r["targets"]["hit_ratio_ge_0_95_oracle"], true);
        assert_eq!(r["targets"]["ttft_p50_le_third_of_vllm"], false);
        assert_eq!(r["targets"]["ttft_p50_p90_le_mooncake"], true);
    }

    #[test]
    fn missing_modes_and_venv() {
        let order: Vec<String> = ["vllm", "kvfabric"].map(String::from).into();
        let r = assemble(json!({}), &order, &unavailable(&order, "no venv"));
        assert_eq!(r["modes"]["kvfabric"]["status"], "unavailable");
        assert_eq!(r["modes"]["vllm"]["reason"], "no venv");
        assert_eq!(r["ratios"]["kvfabric_hit_over_oracle"], Value::Null);
        assert_eq!(r["targets"]["ttft_p50_p90_le_mooncake"], Value::Null);
        let r = assemble(json!({}), &order, &driver(json!({})));
        assert_eq!(r["modes"]["vllm"]["status"], "failed");
    }
}
