//! Per-configuration figures of `kvfabric bench agentic`: token hit ratio
//! against the oracle, TTFT / end-to-end percentiles and throughput, from the
//! records of one run of the trace.

use std::time::Duration;

use serde_json::{json, Value};

use super::trace::{oracle_cached_tokens, TraceEntry};

/// What one request of a run measured.
#[derive(Clone, Debug)]
pub struct RequestRecord {
    pub session: usize,
    pub turn: usize,
    pub engine: usize,
    pub prompt: Vec<u32>,
    pub answer: Vec<u32>,
    pub cached_tokens: usize,
    /// Submit -> first token.
    pub ttft: Duration,
    /// Submit -> finished.
    pub e2e: Duration,
}

/// Linear-interpolated percentile (`p` in 0..=1) of unsorted values; 0 when empty.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let pos = p.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// Summary of one configuration's run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSummary {
    pub requests: usize,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub oracle_cached_tokens: usize,
    pub hit_ratio: f64,
    pub oracle_hit_ratio: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p90_ms: f64,
    pub e2e_p50_ms: f64,
    pub e2e_p90_ms: f64,
    /// (prompt + completion tokens) / wall time of the run.
    pub tokens_per_s: f64,
    pub wall_s: f64,
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl RunSummary {
    /// Summarize `records` (in submission order) of a run that took `wall`.
    pub fn new(records: &[RequestRecord], block_tokens: usize, wall: Duration) -> RunSummary {
        let trace: Vec<TraceEntry> = records
            .iter()
            .map(|r| TraceEntry {
                prompt: r.prompt.clone(),
                answer: r.answer.clone(),
            })
            .collect();
        let oracle: usize = oracle_cached_tokens(&trace, block_tokens).iter().sum();
        let prompt_tokens: usize = records.iter().map(|r| r.prompt.len()).sum();
        let cached_tokens: usize = records.iter().map(|r| r.cached_tokens).sum();
        let completion_tokens: usize = records.iter().map(|r| r.answer.len()).sum();
        let ms = |d: &Duration| d.as_secs_f64() * 1e3;
        let ttft: Vec<f64> = records.iter().map(|r| ms(&r.ttft)).collect();
        let e2e: Vec<f64> = records.iter().map(|r| ms(&r.e2e)).collect();
        let wall_s = wall.as_secs_f64();
        RunSummary {
            requests: records.len(),
            prompt_tokens,
            cached_tokens,
            completion_tokens,
            oracle_cached_tokens: oracle,
            hit_ratio: ratio(cached_tokens, prompt_tokens),
            oracle_hit_ratio: ratio(oracle, prompt_tokens),
            ttft_p50_ms: percentile(&ttft, 0.5),
            ttft_p90_ms: percentile(&ttft, 0.9),
            e2e_p50_ms: percentile(&e2e, 0.5),
            e2e_p90_ms: percentile(&e2e, 0.9),
            tokens_per_s: if wall_s > 0.0 {
                (prompt_tokens + completion_tokens) as f64 / wall_s
            } else {
                0.0
            },
            wall_s,
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "oracle_cached_tokens": self.oracle_cached_tokens,
            "hit_ratio": self.hit_ratio,
            "oracle_hit_ratio": self.oracle_hit_ratio,
            "ttft_p50_ms": self.ttft_p50_ms,
            "ttft_p90_ms": self.ttft_p90_ms,
            "e2e_p50_ms": self.e2e_p50_ms,
            "e2e_p90_ms": self.e2e_p90_ms,
            "tokens_per_s": self.tokens_per_s,
            "wall_s": self.wall_s,
        })
    }
}

/// True when two runs produced the same answer for every (session, turn):
/// greedy decoding over bit-exact KV must not depend on where KV came from.
pub fn same_answers(a: &[RequestRecord], b: &[RequestRecord]) -> bool {
    let key = |r: &[RequestRecord]| {
        let mut v: Vec<_> = r
            .iter()
            .map(|x| ((x.session, x.turn), x.answer.clone()))
            .collect();
        v.sort();
        v
    };
    a.len() == b.len() && key(a) == key(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(
        session: usize,
        turn: usize,
        prompt: Vec<u32>,
        cached: usize,
        ttft_ms: u64,
    ) -> RequestRecord {
        RequestRecord {
            session,
            turn,
            engine: 0,
            prompt,
            answer: vec![9, 9],
            cached_tokens: cached,
            ttft: Duration::from_millis(ttft_ms),
            e2e: Duration::from_millis(ttft_ms * 2),
        }
    }

    #[test]
    fn percentiles_interpolate() {
        let v = [5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 3.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 1.0), 5.0);
        assert!((percentile(&v, 0.9) - 4.6).abs() < 1e-9);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn summary_counts_hits_against_the_oracle() {
        let a: Vec<u32> = (0..20).collect();
        let b: Vec<u32> = (0..30).collect();
        let records = vec![rec(0, 0, a, 0, 10), rec(0, 1, b, 16, 30)];
        let s = RunSummary::new(&records, 8, Duration::from_secs(1));
        // b shares a's 20 prompt tokens + 1 answer token with KV -> 16 (2 blocks of 8).
        assert_eq!(s.oracle_cached_tokens, 16);
        assert_eq!(s.cached_tokens, 16);
        assert_eq!(s.prompt_tokens, 50);
        assert!((s.hit_ratio - 0.32).abs() < 1e-9);
        assert_eq!(s.ttft_p50_ms, 20.0);
        assert_eq!(s.tokens_per_s, 54.0);
        let mut other = records.clone();
        assert!(same_answers(&records, &other));
        other[1].answer = vec![9, 8];
        assert!(!same_answers(&records, &other));
    }
}
