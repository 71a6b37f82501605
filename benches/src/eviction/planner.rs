//! The capacity planner's estimate against the exact replay.
//!
//! One replay with the planner sampling (`rate`) on a tier that holds every
//! distinct block of the trace gives the node's curve; exact replays on
//! tiers of 25%, 50% and 100% of the distinct blocks give the ratios the
//! curve's points at those scales estimate. Both sides are the node's token
//! hit ratio of its lookups (the store's lookup hit blocks over looked-up
//! blocks: blocks are full, so blocks weigh as tokens), per policy.
//!
//! At 1% the default agentic trace (24 sessions, ~1k distinct blocks)
//! would sample ~10 blocks; `--planner-sessions` scales it (the same
//! generator, more sessions) so the sample holds hundreds.

use kvfabric_store::{EvictionPolicy, KvLayout, NodeConfig, Store};
use serde_json::{json, Value};

use super::replay::{replay_store, POLICIES};
use super::traces::Trace;

/// The scales (fractions of the trace's distinct blocks) compared.
pub const FRACTIONS: [f64; 3] = [0.25, 0.5, 1.0];

/// One policy at one capacity: the exact ratio and the planner's estimate.
#[derive(Clone, Copy, Debug)]
pub struct Compared {
    pub policy: &'static str,
    pub fraction: f64,
    pub exact: f64,
    pub estimate: f64,
}

/// The store's token hit ratio of its lookups.
fn lookup_ratio(s: &Store) -> f64 {
    let st = s.stats();
    st.hit_blocks as f64 / (st.hit_blocks + st.miss_blocks).max(1) as f64
}

/// Each policy's planner estimate (sampling at `rate`) and exact ratio at [`FRACTIONS`].
pub fn compare(
    trace: &Trace,
    layout: KvLayout,
    base: &NodeConfig,
    rate: f64,
) -> anyhow::Result<Vec<Compared>> {
    compare_at(trace, layout, base, rate, &POLICIES, &FRACTIONS)
}

/// [`compare`] for some policies and fractions (each fraction a point of the curve).
pub fn compare_at(
    trace: &Trace,
    layout: KvLayout,
    base: &NodeConfig,
    rate: f64,
    policies: &[(&'static str, EvictionPolicy)],
    fractions: &[f64],
) -> anyhow::Result<Vec<Compared>> {
    let distinct = trace.distinct_blocks();
    let mut out = Vec::new();
    for &(name, policy) in policies {
        let sampling = NodeConfig {
            planner_sample_rate: rate,
            ..base.clone()
        };
        let (_, s) = replay_store(trace, layout, &sampling, policy, Some(distinct))?;
        let curve = s.capacity();
        drop(s);
        let ram = curve
            .tiers
            .iter()
            .find(|t| t.tier == "ram")
            .ok_or_else(|| anyhow::anyhow!("the planner gave no RAM curve"))?;
        let exact_cfg = NodeConfig {
            planner_sample_rate: 0.0,
            ..base.clone()
        };
        for &fraction in fractions {
            let point = ram
                .points
                .iter()
                .find(|p| p.scale == fraction)
                .ok_or_else(|| anyhow::anyhow!("no point at scale {fraction}"))?;
            let cap = ((distinct as f64 * fraction).round() as usize).max(1);
            let (_, s) = replay_store(trace, layout, &exact_cfg, policy, Some(cap))?;
            out.push(Compared {
                policy: name,
                fraction,
                exact: lookup_ratio(&s),
                estimate: point.token_hit_ratio,
            });
        }
    }
    Ok(out)
}

/// [`compare`] as the report's `planner` object.
pub fn report(
    trace: &Trace,
    layout: KvLayout,
    base: &NodeConfig,
    rate: f64,
) -> anyhow::Result<Value> {
    let rows = compare(trace, layout, base, rate)?;
    let worst = |p: &str| {
        rows.iter()
            .filter(|r| r.policy == p)
            .map(|r| (r.estimate - r.exact).abs())
            .fold(0.0, f64::max)
    };
    Ok(json!({
        "sample_rate": rate,
        "sessions_trace_requests": trace.requests.len(),
        "distinct_blocks": trace.distinct_blocks(),
        "points": rows.iter().map(|r| json!({
            "policy": r.policy,
            "capacity_fraction": r.fraction,
            "exact_hit_ratio": r.exact,
            "estimated_hit_ratio": r.estimate,
            "abs_error": (r.estimate - r.exact).abs(),
        })).collect::<Vec<_>>(),
        "max_abs_error": POLICIES.iter().map(|(p, _)| (p.to_string(), json!(worst(p))))
            .collect::<serde_json::Map<_, _>>(),
    }))
}

/// The policies whose estimate the test bounds (LIRS is reported).
pub const BOUNDED: [EvictionPolicy; 2] = [EvictionPolicy::Lru, EvictionPolicy::S3fifo];

#[cfg(test)]
mod tests {
    use kvfabric_store::{KeyChain, ModelFingerprint};

    use super::super::traces::{self, Shape};
    use super::*;

    /// The agentic trace's generator with 2000 sessions (~75k distinct
    /// blocks, so ~750 sampled; bytes as tokens, no model needed): at 1%
    /// sampling the planner's curve is within 0.03 of the exact replay at
    /// 25%, 50% and 100% of the distinct blocks, for LRU and S3-FIFO (LIRS
    /// printed). Measured: LRU within 0.001, S3-FIFO 0.013/0.018/0.000,
    /// LIRS 0.004/0.023/0.000. The first version (mini-caches sized by the
    /// hash's rate, every held key a hit) failed it: S3-FIFO 0.050 off at 50%.
    #[test]
    fn shards_curve_at_one_percent_is_within_003_of_the_exact_replay() {
        let layout = super::super::replay::small_layout(64);
        let chain = KeyChain::new(b"planner", &ModelFingerprint([5; 32]), &layout);
        let shape = Shape {
            sessions: 2000,
            turns: 8,
            system_tokens: 1000,
            history_tokens: 1500,
            answer_tokens: 48,
            scan_prompts: 0,
            seed: 1,
        };
        let bytes = |s: &str| s.bytes().map(u32::from).collect::<Vec<u32>>();
        let trace = traces::agentic(&bytes, &chain, &shape);
        let rows = compare(&trace, layout, &super::super::replay::one_at_a_time(), 0.01).unwrap();
        for r in &rows {
            eprintln!("{r:?}");
        }
        for r in &rows {
            let policy = POLICIES.iter().find(|p| p.0 == r.policy).unwrap().1;
            if BOUNDED.contains(&policy) {
                assert!(
                    (r.estimate - r.exact).abs() <= 0.03,
                    "{} at {}: estimate {} vs exact {}",
                    r.policy,
                    r.fraction,
                    r.estimate,
                    r.exact
                );
            }
        }
    }
}
