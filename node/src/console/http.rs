//! The console over HTTP: the page and its assets (embedded in the binary,
//! uPlot vendored from the npm registry with its license: no CDN, works on
//! an air-gapped cluster) and the JSON API the page polls:
//!
//! - `GET /api/v1/cluster`: every member (state, hit ratio, tiers);
//! - `GET /api/v1/history`: every alive member's history ring, column-wise
//!   (`t` in Unix seconds and one array per series, `null` = no value);
//! - `GET /api/v1/top-prefixes`: the prefixes hit most, merged over members.
//!
//! `GET /api/v1/capacity` (the capacity planner's miss-ratio curves) is
//! served by the planner; the page shows "planner not available" on a 404.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use axum::Router;
use kvfabric_proto::internal::v1::SummaryResponse;
use kvfabric_proto::v1::Tier;
use serde::Deserialize;
use serde_json::{json, Value};

use super::cluster::Member;
use super::series::SERIES;
use super::Console;

const INDEX_HTML: &str = include_str!("../../assets/console/index.html");
const APP_JS: &str = include_str!("../../assets/console/app.js");
const APP_CSS: &str = include_str!("../../assets/console/app.css");
const UPLOT_JS: &str = include_str!("../../assets/console/vendor/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../assets/console/vendor/uplot/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("../../assets/console/vendor/uplot/LICENSE");

/// How often the page refreshes the cluster table (ms).
const REFRESH_MS: u64 = 2000;

/// The console's routes, state included (merge them into the node's HTTP app).
pub fn routes(console: Arc<Console>) -> Router {
    Router::new()
        .route("/", get(|| asset("text/html; charset=utf-8", INDEX_HTML)))
        .route(
            "/console/app.js",
            get(|| asset("text/javascript; charset=utf-8", APP_JS)),
        )
        .route(
            "/console/app.css",
            get(|| asset("text/css; charset=utf-8", APP_CSS)),
        )
        .route(
            "/console/vendor/uplot/uPlot.iife.min.js",
            get(|| asset("text/javascript; charset=utf-8", UPLOT_JS)),
        )
        .route(
            "/console/vendor/uplot/uPlot.min.css",
            get(|| asset("text/css; charset=utf-8", UPLOT_CSS)),
        )
        .route(
            "/console/vendor/uplot/LICENSE",
            get(|| asset("text/plain; charset=utf-8", UPLOT_LICENSE)),
        )
        .route("/api/v1/cluster", get(cluster))
        .route("/api/v1/history", get(history))
        .route("/api/v1/top-prefixes", get(top_prefixes))
        .with_state(console)
}

async fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, content_type), (CACHE_CONTROL, "no-cache")],
        body,
    )
}

fn tier_name(t: i32) -> String {
    Tier::try_from(t)
        .map(|t| {
            t.as_str_name()
                .trim_start_matches("TIER_")
                .to_ascii_lowercase()
        })
        .unwrap_or_else(|_| format!("tier-{t}"))
}

fn tiers_json(s: &SummaryResponse) -> Vec<Value> {
    s.tiers
        .iter()
        .map(|t| {
            json!({
                "tier": tier_name(t.tier),
                "capacity_bytes": t.capacity_bytes,
                "used_bytes": t.used_bytes,
                "blocks": t.blocks,
                "hits": t.hits,
                "misses": t.misses,
                "evictions": t.evictions,
                "promotions": t.promotions,
                "demotions": t.demotions,
                "checksum_failures": t.checksum_failures,
            })
        })
        .collect()
}

fn member_json(m: &Member) -> Value {
    let mut v = json!({
        "node_id": m.node_id,
        "grpc_addr": m.grpc_addr,
        "state": m.state.as_str(),
    });
    if let Some(s) = &m.summary {
        v["hit_ratio"] = json!(s.hit_ratio);
        v["hit_blocks"] = json!(s.hit_blocks);
        v["miss_blocks"] = json!(s.miss_blocks);
        v["hit_tokens"] = json!(s.hit_tokens);
        v["miss_tokens"] = json!(s.miss_tokens);
        v["tiers"] = json!(tiers_json(s));
    }
    v
}

/// `GET /api/v1/cluster`.
async fn cluster(State(c): State<Arc<Console>>) -> Json<Value> {
    let members = c.members(false).await;
    Json(json!({
        "node_id": c.summary_node_id(),
        "refresh_ms": REFRESH_MS,
        "interval_ms": c.interval().as_millis() as u64,
        "nodes": members.iter().map(member_json).collect::<Vec<_>>(),
    }))
}

/// `GET /api/v1/history`.
async fn history(State(c): State<Arc<Console>>) -> Json<Value> {
    let members = c.members(true).await;
    let nodes: Vec<Value> = members
        .iter()
        .filter_map(|m| {
            let h = m.summary.as_ref()?.history.as_ref()?;
            let values: serde_json::Map<String, Value> = h
                .series
                .iter()
                .map(|s| (s.name.clone(), json!(s.values)))
                .collect();
            Some(json!({
                "node_id": m.node_id,
                "state": m.state.as_str(),
                "interval_ms": h.interval_ms,
                "t": h.unix_ms.iter().map(|t| *t as f64 / 1000.0).collect::<Vec<_>>(),
                "values": values,
            }))
        })
        .collect();
    let series: Vec<Value> = SERIES
        .iter()
        .map(|s| json!({"name": s.name, "title": s.title, "unit": s.unit}))
        .collect();
    Json(json!({ "series": series, "nodes": nodes }))
}

#[derive(Deserialize)]
struct TopQuery {
    n: Option<usize>,
    namespace: Option<String>,
}

/// `GET /api/v1/top-prefixes[?n=20][&namespace=tenant]`: merged over the
/// alive members (hits summed: each member counts the lookups it answered).
async fn top_prefixes(State(c): State<Arc<Console>>, Query(q): Query<TopQuery>) -> Json<Value> {
    let members = c.members(false).await;
    let mut merged: BTreeMap<(String, String), Value> = BTreeMap::new();
    let mut namespaces: Vec<String> = Vec::new();
    for m in &members {
        let Some(s) = &m.summary else { continue };
        for p in &s.top_prefixes {
            namespaces.push(p.namespace.clone());
            if q.namespace.as_ref().is_some_and(|ns| *ns != p.namespace) {
                continue;
            }
            let e = merged
                .entry((p.namespace.clone(), p.tip_key.clone()))
                .or_insert_with(|| {
                    json!({
                        "namespace": p.namespace, "tip_key": p.tip_key,
                        "depth_blocks": p.depth_blocks, "depth_tokens": 0u64,
                        "hits": 0u64, "holders": Vec::<String>::new(),
                        "size_bytes": p.size_bytes,
                    })
                });
            e["hits"] = json!(e["hits"].as_u64().unwrap_or(0) + p.hits);
            let tokens = e["depth_tokens"].as_u64().unwrap_or(0).max(p.depth_tokens);
            e["depth_tokens"] = json!(tokens);
            let mut holders: Vec<String> = e["holders"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|h| h.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            holders.extend(p.holders.iter().cloned());
            holders.sort();
            holders.dedup();
            e["holders"] = json!(holders);
        }
    }
    let mut list: Vec<Value> = merged.into_values().collect();
    list.sort_by_key(|v| std::cmp::Reverse(v["hits"].as_u64().unwrap_or(0)));
    list.truncate(q.n.unwrap_or(20).min(500));
    namespaces.sort();
    namespaces.dedup();
    Json(json!({ "prefixes": list, "namespaces": namespaces }))
}
