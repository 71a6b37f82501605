//! `kvfabric router`: the OpenAI-compatible front over several engines.
//!
//! Disaggregated (`--prefill` and `--decode` URLs: two hops, prefill then
//! decode, token-aware balancing) or plain (`--engines`: one hop, random,
//! least-loaded, affinity or prefix). The routing itself lives in
//! kvfabric-router; this module only resolves the `[router]` configuration
//! (and, for the prefix policy's KV event subscriptions to the nodes, the
//! client TLS of `[cluster.security]`, as `kvfabric ctl` loads it) and runs
//! it until a signal.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use clap::Args;
use kvfabric_node::cluster::{security, ClusterConfig};
use serde::Serialize;

use crate::node::{ClusterFlags, SecurityFlags};

/// Flags of `[router]`; unset flags leave the file/env values alone.
#[derive(Args, Debug, Serialize, Default)]
pub struct RouterFlags {
    /// Listen address of the router's API [env: KVFABRIC_LISTEN] [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Prefill-role engine base URLs, comma-separated (with --decode: disaggregated) [default: none].
    #[arg(long, value_name = "URL,...", value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill: Option<Vec<String>>,
    /// Decode-role engine base URLs, comma-separated [default: none].
    #[arg(long, value_name = "URL,...", value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode: Option<Vec<String>>,
    /// Colocated engine base URLs for plain mode, comma-separated [default: none].
    #[arg(long, value_name = "URL,...", value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engines: Option<Vec<String>>,
    /// How engines are picked: least-loaded, random, affinity (x-session-affinity)
    /// or prefix (longest cached prefix vs load) [env: KVFABRIC_POLICY] [default: least-loaded].
    #[arg(long, value_name = "POLICY")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Limit per upstream hop in milliseconds [env: KVFABRIC_REQUEST_TIMEOUT_MS] [default: 600000].
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_timeout_ms: Option<u64>,
    /// TCP connect limit per engine in milliseconds [env: KVFABRIC_CONNECT_TIMEOUT_MS] [default: 2000].
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_timeout_ms: Option<u64>,
    /// Tenants file: API keys and limits (docs/SECURITY.md); unset = single-tenant
    /// [env: KVFABRIC_TENANTS_FILE].
    #[arg(long, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenants_file: Option<String>,
    /// Prefix policy: each engine's fabric node gRPC address, comma-separated
    /// ENGINE_URL=HOST:PORT pairs (the router follows the node's KV events)
    /// [default: none].
    #[arg(long, value_name = "URL=ADDR,...", value_delimiter = ',')]
    #[serde(skip)]
    pub engine_nodes: Option<Vec<String>>,
    /// Prefix policy: weight of shared prompt tokens an engine lacks [default: 1.0].
    #[arg(long, value_name = "W")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_overlap_weight: Option<f64>,
    /// Prefix policy: weight of a session's own prompt tokens an engine lacks [default: 4.0].
    #[arg(long, value_name = "W")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_session_weight: Option<f64>,
    /// Client certificate for the nodes' KV event streams in a secured cluster
    /// (`[cluster.security]`, as `kvfabric ctl`).
    #[command(flatten)]
    #[serde(skip)]
    pub security: SecurityFlags,
}

/// `kvfabric router`: resolve `[router]` (and `[cluster.security]`), then serve.
pub fn command(mut flags: RouterFlags, file: Option<&Path>) -> anyhow::Result<()> {
    let nodes = flags.engine_nodes.take();
    let cluster_flags = ClusterFlags {
        security: std::mem::take(&mut flags.security),
        ..ClusterFlags::default()
    };
    let mut cfg: kvfabric_router::RouterConfig = crate::config::load("router", file, &flags)?;
    if let Some(pairs) = nodes {
        cfg.engine_nodes = engine_nodes(&pairs)?;
    }
    cfg.validate()?;
    let cluster: ClusterConfig = crate::config::load("cluster", file, &cluster_flags)?;
    let tls = security::load_client(&cluster.security)?.map(|id| security::client_tls(&id, None));
    tokio::runtime::Runtime::new()?.block_on(run(cfg, tls))
}

/// `URL=ADDR` pairs -> the `engine_nodes` map.
fn engine_nodes(pairs: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| {
            let (url, node) = p
                .rsplit_once('=')
                .with_context(|| format!("--engine-nodes: {p:?} is not ENGINE_URL=HOST:PORT"))?;
            Ok((url.to_string(), node.to_string()))
        })
        .collect()
}

/// Run the router until a shutdown signal; `tls`: the client certificate
/// its KV event subscriptions present.
pub async fn run(
    cfg: kvfabric_router::RouterConfig,
    tls: Option<kvfabric_router::ClientTlsConfig>,
) -> anyhow::Result<()> {
    let mode = cfg.validate()?;
    let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
    tracing::info!(listen = %listener.local_addr()?, mode = mode.label(), "router serving");
    kvfabric_router::serve_secured(cfg, listener, tls, crate::node::shutdown_signal()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_nodes_pairs_split_at_the_last_equals() {
        let m = engine_nodes(&["http://127.0.0.1:8001=127.0.0.1:50051".into()]).expect("pairs");
        assert_eq!(
            m.get("http://127.0.0.1:8001").map(String::as_str),
            Some("127.0.0.1:50051")
        );
        assert!(engine_nodes(&["http://127.0.0.1:8001".into()]).is_err());
    }
}
