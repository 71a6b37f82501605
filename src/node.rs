//! `kvfabric node`: the node daemon.
//!
//! Loads the `[node]` configuration (store tiers, listen addresses) and the
//! `[cluster]` configuration (membership: `--etcd` endpoints, a `--peers`
//! static list, or neither for a single node; the transfer engine's address)
//! and runs the node until SIGINT/SIGTERM, leaving the cluster cleanly.

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

/// Flags of `[cluster]`; unset flags leave the file/env values alone.
#[derive(Args, Debug, Serialize, Default)]
pub struct ClusterFlags {
    /// etcd endpoints, comma-separated (http://host:port,...): etcd membership [default: none].
    #[arg(long, value_name = "URL,...", value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd: Option<Vec<String>>,
    /// Key prefix of this cluster in etcd [default: /kvfabric].
    #[arg(long, value_name = "PREFIX")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_prefix: Option<String>,
    /// etcd lease TTL in milliseconds (whole seconds) [default: 5000].
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ttl_ms: Option<u64>,
    /// Static peers, comma-separated, each node_id=grpc_host:port=transfer_host:port
    /// (this node may be listed too) [default: none].
    #[arg(long, value_name = "ID=GRPC=TRANSFER,...", value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peers: Option<Vec<String>>,
    /// Transfer engine listen address [default: 127.0.0.1:0].
    #[arg(long, value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transfer_listen: Option<String>,
    /// Transfer transport: auto, tcp or shm [default: auto].
    #[arg(long, value_name = "KIND")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transfer_transport: Option<String>,
    /// gRPC address peers use to reach this node [default: the bound gRPC address].
    #[arg(long, value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise_grpc: Option<String>,
    /// Transfer address peers use to reach this node [default: the bound transfer address].
    #[arg(long, value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise_transfer: Option<String>,
    #[command(flatten)]
    #[serde(skip_serializing_if = "SecurityFlags::is_empty")]
    pub security: SecurityFlags,
}

/// Flags of `[cluster.security]`; unset flags leave the file/env values alone.
#[derive(Args, Debug, Serialize, Default)]
pub struct SecurityFlags {
    /// Security mode: none, authenticate or encrypt [default: authenticate once
    /// --tls-cert/--tls-key/--tls-ca are set, else none].
    #[arg(long = "security", env = "KVFABRIC_SECURITY_MODE", value_name = "MODE")]
    #[serde(rename = "mode", skip_serializing_if = "Option::is_none")]
    pub security_mode: Option<String>,
    /// This process's certificate (PEM, from `kvfabric certs init`) [default: none].
    #[arg(long = "tls-cert", env = "KVFABRIC_TLS_CERT", value_name = "PATH")]
    #[serde(rename = "cert", skip_serializing_if = "Option::is_none")]
    pub cert: Option<std::path::PathBuf>,
    /// Its private key (PEM) [default: none].
    #[arg(long = "tls-key", env = "KVFABRIC_TLS_KEY", value_name = "PATH")]
    #[serde(rename = "key", skip_serializing_if = "Option::is_none")]
    pub key: Option<std::path::PathBuf>,
    /// The cluster CA certificate (PEM) [default: none].
    #[arg(long = "tls-ca", env = "KVFABRIC_TLS_CA", value_name = "PATH")]
    #[serde(rename = "ca", skip_serializing_if = "Option::is_none")]
    pub ca: Option<std::path::PathBuf>,
    /// The CA's revocation list (PEM, `kvfabric certs revoke`), re-read every
    /// second [default: none].
    #[arg(long = "tls-crl", env = "KVFABRIC_TLS_CRL", value_name = "PATH")]
    #[serde(rename = "crl", skip_serializing_if = "Option::is_none")]
    pub crl: Option<std::path::PathBuf>,
}

impl SecurityFlags {
    fn is_empty(&self) -> bool {
        self.security_mode.is_none()
            && self.cert.is_none()
            && self.key.is_none()
            && self.ca.is_none()
            && self.crl.is_none()
    }
}

/// Run the node until a shutdown signal.
pub async fn run(
    cfg: kvfabric_store::NodeConfig,
    cluster: kvfabric_node::cluster::ClusterConfig,
) -> anyhow::Result<()> {
    tracing::info!(node = %cfg.node_id, grpc = %cfg.grpc_listen, http = %cfg.http_listen, "starting node");
    kvfabric_node::NodeServer::open(cfg, cluster)
        .await?
        .serve(shutdown_signal())
        .await?;
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
