//! `kvfabric ctl capacity`: the capacity planner's curves of one node (the
//! token hit ratio it would have at 0.25x..4x each tier; docs/OPERATIONS.md).
//!
//! Columns (JSON key): tier (`tiers[].tier`), policy (`policy`), scale
//! (`points[].scale`), capacity (`capacity_bytes`), hit ratio
//! (`token_hit_ratio`); the header line: `sample_rate`, `lookups`,
//! `sampled_lookups`, and below `min_samples` sampled lookups a "too few
//! samples" line. `--json` prints the report as one line.

use anyhow::anyhow;

use super::rpc::{authed, Client};

/// Print the planner's curves of the node at `--addr`, as a table or JSON.
pub(super) async fn run(c: &mut Client, key: Option<&str>, json: bool) -> anyhow::Result<()> {
    let r = kvfabric_node::wire::capacity_from_proto(
        c.capacity(authed(kvfabric_proto::v1::CapacityRequest {}, key)?)
            .await
            .map_err(|s| anyhow!("capacity: {}", s.message()))?
            .into_inner(),
    );
    if json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    if r.tiers.is_empty() {
        println!("capacity planner off (planner_sample_rate = 0)");
        return Ok(());
    }
    println!(
        "sample {:.2}% of keys, {} lookups ({} sampled); token hit ratio of this node's lookups",
        r.sample_rate * 100.0,
        r.lookups,
        r.sampled_lookups
    );
    if r.sampled_lookups < r.min_samples {
        println!(
            "too few samples: {} of {} needed; the curve below is noise until then",
            r.sampled_lookups, r.min_samples
        );
    }
    if r.dropped_samples > 0 {
        println!(
            "{} samples dropped (the planner's queue was full)",
            r.dropped_samples
        );
    }
    println!(
        "{:<5}  {:<7}  {:>6}  {:>12}  {:>9}",
        "tier", "policy", "scale", "capacity", "hit ratio"
    );
    for t in &r.tiers {
        for p in &t.points {
            let now = if p.scale == 1.0 { "  <- now" } else { "" };
            println!(
                "{:<5}  {:<7}  {:>5}x  {:>12}  {:>9.3}{now}",
                t.tier,
                t.policy,
                p.scale,
                bytesize::ByteSize::b(p.capacity_bytes).to_string(),
                p.token_hit_ratio
            );
        }
    }
    Ok(())
}
