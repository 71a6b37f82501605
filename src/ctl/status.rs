//! `ctl status` and `ctl watch`: every node of the cluster with its tiers,
//! as a table or as JSON carrying every column of the table.
//!
//! Columns (JSON key): node (`node_id`), alive (`alive`), grpc
//! (`grpc_addr`), lookup hit (`lookup_hit_ratio`), served (`served_blocks`),
//! then per tier: tier (`tier`), capacity (`capacity_bytes`), used
//! (`used_bytes`), blocks (`blocks`), tier hits (`hits`). The ratios are
//! defined in the module doc of `ctl`.

use std::time::Duration;

use anyhow::anyhow;
use kvfabric_proto::v1::{ClusterStatusRequest, ClusterStatusResponse, NodeStatus};
use serde_json::{json, Value};

use super::rpc::{authed, tier_name, Client};

/// The cluster's status as the node at the other end sees it.
pub(super) async fn fetch(
    c: &mut Client,
    key: Option<&str>,
) -> anyhow::Result<ClusterStatusResponse> {
    Ok(c.cluster_status(authed(ClusterStatusRequest {}, key)?)
        .await
        .map_err(|s| anyhow!("cluster status: {}", s.message()))?
        .into_inner())
}

/// One node as JSON: every field of the status table and the JSON-only
/// counters (misses, evictions, transfer bytes).
pub(super) fn node_json(n: &NodeStatus) -> Value {
    json!({
        "node_id": n.node_id,
        "grpc_addr": n.grpc_addr,
        "transfer_addr": n.transfer_addr,
        "alive": n.alive,
        "lookup_hit_ratio": n.hit_ratio,
        "served_blocks": n.served_blocks,
        "transfer_in_bytes": n.transfer_in_bytes,
        "transfer_out_bytes": n.transfer_out_bytes,
        "tiers": n.tiers.iter().map(|t| json!({
            "tier": tier_name(t.tier),
            "capacity_bytes": t.capacity_bytes,
            "used_bytes": t.used_bytes,
            "blocks": t.blocks,
            "hits": t.hits,
            "misses": t.misses,
            "evictions": t.evictions,
            "checksum_failures": t.checksum_failures,
        })).collect::<Vec<_>>(),
    })
}

fn status_json(s: &ClusterStatusResponse) -> Value {
    json!({ "nodes": s.nodes.iter().map(node_json).collect::<Vec<_>>() })
}

/// Print the status as a table, or as one line of JSON.
pub(super) fn print(s: &ClusterStatusResponse, json: bool) {
    if json {
        println!("{}", status_json(s));
        return;
    }
    print!("{}", table(s));
}

/// The status table.
fn table(s: &ClusterStatusResponse) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let row = |out: &mut String, c: [&str; 10]| {
        let _ = writeln!(
            out,
            "{:<12}  {:<5}  {:<21}  {:>10}  {:>8}  {:<5}  {:>10}  {:>10}  {:>8}  {:>9}",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9]
        );
    };
    row(
        &mut out,
        [
            "node",
            "alive",
            "grpc",
            "lookup hit",
            "served",
            "tier",
            "capacity",
            "used",
            "blocks",
            "tier hits",
        ],
    );
    for n in &s.nodes {
        let alive = if n.alive { "yes" } else { "no" };
        let ratio = format!("{:.3}", n.hit_ratio);
        let served = n.served_blocks.to_string();
        let node = [
            n.node_id.as_str(),
            alive,
            n.grpc_addr.as_str(),
            &ratio,
            &served,
        ];
        if n.tiers.is_empty() {
            row(
                &mut out,
                [
                    node[0], node[1], node[2], node[3], node[4], "", "", "", "", "",
                ],
            );
        }
        for (i, t) in n.tiers.iter().enumerate() {
            let lead = if i == 0 { node } else { [""; 5] };
            let (cap, used) = (
                bytesize::ByteSize(t.capacity_bytes).to_string(),
                bytesize::ByteSize(t.used_bytes).to_string(),
            );
            let (blocks, hits) = (t.blocks.to_string(), t.hits.to_string());
            row(
                &mut out,
                [
                    lead[0],
                    lead[1],
                    lead[2],
                    lead[3],
                    lead[4],
                    tier_name(t.tier),
                    &cap,
                    &used,
                    &blocks,
                    &hits,
                ],
            );
        }
    }
    out
}

/// The status every `interval`, `count` times (JSON: one object per line).
pub(super) async fn watch(
    c: &mut Client,
    key: Option<&str>,
    interval: Duration,
    count: u32,
    json: bool,
) -> anyhow::Result<()> {
    for i in 0..count {
        if i > 0 {
            tokio::time::sleep(interval).await;
            if !json {
                println!();
            }
        }
        print(&fetch(c, key).await?, json);
    }
    Ok(())
}
