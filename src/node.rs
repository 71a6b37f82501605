//! `kvfabric node`: the node daemon.
//!
//! Loads the `[node]` configuration (store tiers, listen addresses) and runs
//! the node until SIGINT/SIGTERM.

use clap::Args;
use serde::Serialize;

/// Flags of `[node]`; unset flags leave the file/env values alone.
#[derive(Args, Debug, Serialize, Default)]
pub struct NodeFlags {
    /// Node id [env: KVFABRIC_NODE_ID] [default: node-0].
    #[arg(long, value_name = "ID")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// gRPC listen address [env: KVFABRIC_GRPC_LISTEN] [default: 127.0.0.1:50051].
    #[arg(long, value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc_listen: Option<String>,
    /// HTTP listen address for /metrics and /health [env: KVFABRIC_HTTP_LISTEN] [default: 127.0.0.1:9464].
    #[arg(long, value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_listen: Option<String>,
    /// RAM tier size, e.g. 8GiB [env: KVFABRIC_RAM_CAPACITY] [default: 1GiB].
    #[arg(long, value_name = "SIZE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ram_capacity: Option<String>,
    /// Disk tier data file or block device; absent = no disk tier [env: KVFABRIC_DISK_PATH].
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_path: Option<std::path::PathBuf>,
    /// Disk tier size, e.g. 64GiB [env: KVFABRIC_DISK_CAPACITY] [default: 8GiB].
    #[arg(long, value_name = "SIZE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_capacity: Option<String>,
}

/// Run the node until a shutdown signal.
pub async fn run(cfg: kvfabric_store::NodeConfig) -> anyhow::Result<()> {
    tracing::info!(node = %cfg.node_id, grpc = %cfg.grpc_listen, http = %cfg.http_listen, "starting node");
    kvfabric_store::serve(cfg, shutdown_signal()).await?;
    Ok(())
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutdown signal received");
}
