//! `kvfabric router`: the OpenAI-compatible front over several engines.
//!
//! Disaggregated (`--prefill` and `--decode` URLs: two hops, prefill then
//! decode, token-aware balancing) or plain (`--engines`: one hop, random or
//! least-loaded). The routing itself lives in kvfabric-router; this module
//! only resolves the `[router]` configuration and runs it until a signal.

use clap::Args;
use serde::Serialize;

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
    /// How engines are picked: least-loaded, random or affinity (x-session-affinity)
    /// [env: KVFABRIC_POLICY] [default: least-loaded].
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
}

/// Run the router until a shutdown signal.
pub async fn run(cfg: kvfabric_router::RouterConfig) -> anyhow::Result<()> {
    let mode = cfg.validate()?;
    let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
    tracing::info!(listen = %listener.local_addr()?, mode = mode.label(), "router serving");
    kvfabric_router::serve(cfg, listener, crate::node::shutdown_signal()).await?;
    Ok(())
}
