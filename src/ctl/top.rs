//! `ctl top`: a live view of the cluster, redrawn in place every
//! `--interval-ms` (`--count` refreshes, 0 = until interrupted).
//!
//! Per node: alive, lookup hit ratio, blocks served to peers, transfer GB/s
//! in and out (the change of the node's transfer byte counters since the
//! last refresh, over the time between the two; 0 on the first), and per
//! tier: used of capacity and blocks. On a terminal each frame clears the
//! screen first; piped, frames follow each other. `--json` prints one object
//! per refresh with the same fields (`in_gbps`, `out_gbps`, ...).

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use kvfabric_proto::v1::ClusterStatusResponse;
use serde_json::{json, Value};

use super::rpc::{tier_name, Client};
use super::status;

/// Transfer bytes (in, out) per node at the last refresh, and when.
#[derive(Default)]
struct Last {
    at: Option<Instant>,
    bytes: HashMap<String, (u64, u64)>,
}

/// Run the live view.
pub(super) async fn run(
    c: &mut Client,
    key: Option<&str>,
    interval: Duration,
    count: u32,
    json: bool,
) -> anyhow::Result<()> {
    let mut last = Last::default();
    let redraw = !json && std::io::stdout().is_terminal();
    let mut i = 0u32;
    while count == 0 || i < count {
        if i > 0 {
            tokio::time::sleep(interval).await;
        }
        let s = status::fetch(c, key).await?;
        let frame = frame_json(&s, &mut last);
        let mut out = std::io::stdout().lock();
        if json {
            writeln!(out, "{frame}")?;
        } else {
            if redraw {
                // Cursor home, clear screen: the frame replaces the last one.
                write!(out, "\x1b[H\x1b[2J")?;
            } else if i > 0 {
                writeln!(out)?;
            }
            write!(out, "{}", frame_table(&frame))?;
        }
        out.flush()?;
        i += 1;
    }
    Ok(())
}

/// One refresh as JSON; `last` moves to this refresh.
fn frame_json(s: &ClusterStatusResponse, last: &mut Last) -> Value {
    let now = Instant::now();
    let secs = last.at.map(|t| now.duration_since(t).as_secs_f64());
    let gbps = |now: u64, before: Option<u64>| match (secs, before) {
        (Some(dt), Some(b)) if dt > 0.0 => now.saturating_sub(b) as f64 / dt / 1e9,
        _ => 0.0,
    };
    let nodes: Vec<Value> = s
        .nodes
        .iter()
        .map(|n| {
            let before = last.bytes.get(&n.node_id).copied();
            let v = json!({
                "node_id": n.node_id,
                "alive": n.alive,
                "lookup_hit_ratio": n.hit_ratio,
                "served_blocks": n.served_blocks,
                "in_gbps": gbps(n.transfer_in_bytes, before.map(|b| b.0)),
                "out_gbps": gbps(n.transfer_out_bytes, before.map(|b| b.1)),
                "tiers": n.tiers.iter().map(|t| json!({
                    "tier": tier_name(t.tier),
                    "used_bytes": t.used_bytes,
                    "capacity_bytes": t.capacity_bytes,
                    "blocks": t.blocks,
                })).collect::<Vec<_>>(),
            });
            last.bytes.insert(
                n.node_id.clone(),
                (n.transfer_in_bytes, n.transfer_out_bytes),
            );
            v
        })
        .collect();
    last.at = Some(now);
    json!({ "interval_s": secs.unwrap_or(0.0), "nodes": nodes })
}

/// The table of one refresh (from its JSON, so both show the same).
fn frame_table(f: &Value) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "kvfabric top  ({} nodes; GB/s over the last {:.1} s)",
        f["nodes"].as_array().map_or(0, Vec::len),
        f["interval_s"].as_f64().unwrap_or(0.0)
    );
    let _ = writeln!(
        out,
        "{:<12}  {:<5}  {:>10}  {:>8}  {:>8}  {:>8}  {:<5}  {:>21}  {:>8}",
        "node", "alive", "lookup hit", "served", "in GB/s", "out GB/s", "tier", "used", "blocks"
    );
    for n in f["nodes"].as_array().into_iter().flatten() {
        let lead = [
            n["node_id"].as_str().unwrap_or("").to_string(),
            if n["alive"] == true { "yes" } else { "no" }.to_string(),
            format!("{:.3}", n["lookup_hit_ratio"].as_f64().unwrap_or(0.0)),
            n["served_blocks"].to_string(),
            format!("{:.3}", n["in_gbps"].as_f64().unwrap_or(0.0)),
            format!("{:.3}", n["out_gbps"].as_f64().unwrap_or(0.0)),
        ];
        let tiers = n["tiers"].as_array().cloned().unwrap_or_default();
        for i in 0..tiers.len().max(1) {
            let l: Vec<&str> = if i == 0 {
                lead.iter().map(String::as_str).collect()
            } else {
                vec![""; 6]
            };
            let (tier, used, blocks) = match tiers.get(i) {
                Some(t) => {
                    let b = |k: &str| bytesize::ByteSize(t[k].as_u64().unwrap_or(0));
                    (
                        t["tier"].as_str().unwrap_or("").to_string(),
                        format!("{} / {}", b("used_bytes"), b("capacity_bytes")),
                        t["blocks"].to_string(),
                    )
                }
                None => Default::default(),
            };
            let _ = writeln!(
                out,
                "{:<12}  {:<5}  {:>10}  {:>8}  {:>8}  {:>8}  {:<5}  {:>21}  {:>8}",
                l[0], l[1], l[2], l[3], l[4], l[5], tier, used, blocks
            );
        }
    }
    out
}
