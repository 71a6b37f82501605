//! `kvfabric engine`: the bundled engine serving the OpenAI API.
//!
//! Loads the `[engine]` configuration, resolves `--model` (a GGUF path, or
//! `smollm2` for the reference model, fetched and verified on first use) and
//! runs the engine until SIGINT/SIGTERM. With `[connector] mode = embedded`
//! (the default) the process is also a fabric node (`[node]`, `[cluster]`):
//! the engine reuses prefixes any node of the cluster computed and saves its
//! own blocks into the fabric. With `mode = remote` it is a client of the
//! node at `node_addr`, over mutual TLS when `[cluster.security]` (the
//! `--tls-*` flags) gives it a certificate.

use std::path::Path;

use clap::Args;
use serde::Serialize;

/// Flags of `[engine]`; unset flags leave the file/env values alone.
#[derive(Args, Debug, Serialize, Default)]
pub struct EngineFlags {
    /// Kernel threads, 0 = one per core [env: KVFABRIC_THREADS] [default: 0].
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// Tokens per KV block, the unit shared with the fabric [env: KVFABRIC_BLOCK_TOKENS] [default: 64].
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_tokens: Option<usize>,
    /// Memory of the paged KV pool, e.g. 1GiB [env: KVFABRIC_KV_POOL] [default: 512MiB].
    #[arg(long, value_name = "SIZE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_pool: Option<String>,
    /// Most tokens in one forward step [env: KVFABRIC_MAX_BATCH_TOKENS] [default: 2048].
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_batch_tokens: Option<usize>,
    /// Most sequences running at once [env: KVFABRIC_MAX_SEQS] [default: 16].
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_seqs: Option<usize>,
    /// both | prefill | decode [env: KVFABRIC_ROLE] [default: both].
    #[arg(long, value_name = "ROLE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// HTTP listen address of the OpenAI API [env: KVFABRIC_LISTEN] [default: 127.0.0.1:8000].
    #[arg(long, value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Model id the API answers to [env: KVFABRIC_MODEL_NAME] [default: smollm2].
    #[arg(long, value_name = "NAME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
    /// Reuse blocks of earlier requests in this engine's pool [env: KVFABRIC_PREFIX_CACHE] [default: true].
    #[arg(long, value_name = "BOOL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<bool>,
    /// Kernel instruction set: auto | scalar | avx2 | avx512 (same bits, different speed)
    /// [env: KVFABRIC_ISA] [default: auto].
    #[arg(long, value_name = "ISA")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isa: Option<String>,
    /// Tenants file: API keys, namespaces, limits (docs/SECURITY.md); unset = single-tenant
    /// [env: KVFABRIC_TENANTS_FILE].
    #[arg(long, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenants_file: Option<String>,
    /// Element type of K and V in the KV pool: f16 | bf16 | f32
    /// [env: KVFABRIC_KV_DTYPE] [default: f16].
    #[arg(long, value_name = "DTYPE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_dtype: Option<String>,
}

/// Flags of `[connector]`; unset flags leave the file/env values alone.
#[derive(Args, Debug, Serialize, Default)]
pub struct ConnectorFlags {
    /// embedded (this process is a fabric node), remote (use the node at --fabric-node) or off
    /// [env: KVFABRIC_MODE] [default: embedded].
    #[arg(long = "fabric", value_name = "MODE")]
    #[serde(rename = "mode", skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// remote mode: gRPC address of the kvfabric node [env: KVFABRIC_NODE_ADDR] [default: 127.0.0.1:50051].
    #[arg(long = "fabric-node", value_name = "ADDR")]
    #[serde(rename = "node_addr", skip_serializing_if = "Option::is_none")]
    pub node_addr: Option<String>,
    /// Save computed blocks into the fabric [env: KVFABRIC_SAVE] [default: true].
    #[arg(long = "fabric-save", value_name = "BOOL")]
    #[serde(rename = "save", skip_serializing_if = "Option::is_none")]
    pub save: Option<bool>,
}

/// The fabric side of an engine process.
pub struct FabricSettings {
    pub node: kvfabric_store::NodeConfig,
    pub cluster: kvfabric_node::cluster::ClusterConfig,
    pub connector: kvfabric_connector::ConnectorConfig,
}

/// Run the engine on `model` (with its embedded fabric node unless the
/// connector is off) until a shutdown signal.
pub async fn run(
    cfg: kvfabric_engine::EngineConfig,
    model: &Path,
    fabric: FabricSettings,
) -> anyhow::Result<()> {
    tracing::info!(listen = %cfg.listen, model = %model.display(), fabric = %fabric.connector.mode, "starting engine");
    // The engine's metrics, registered once more for the embedded node's
    // console (its TTFT and cached-prompt plots); the engine's own /metrics
    // serves them, the node's does not (no double counting in Prometheus).
    let metrics = kvfabric_engine::EngineMetrics::new();
    let mut engine_registry = kvfabric_store::Registry::default();
    metrics.register(&mut engine_registry);
    // A remote connector's client certificate: the `[cluster.security]` settings.
    let remote_identity = match fabric.connector.mode.as_str() {
        "remote" => kvfabric_node::cluster::security::load_client(&fabric.cluster.security)?,
        _ => None,
    };
    let embedded = if fabric.connector.embedded() {
        let node = kvfabric_connector::EmbeddedNode::start_with_console_sources(
            fabric.node,
            fabric.cluster,
            vec![std::sync::Arc::new(engine_registry)],
        )
        .await?;
        tracing::info!(node = %node.node().info().node_id, grpc = %node.grpc_addr(), metrics = %node.http_addr(), "embedded fabric node started");
        Some(node)
    } else {
        None
    };
    let connect = match (&embedded, fabric.connector.mode.as_str()) {
        (Some(e), _) => Some(kvfabric_connector::FabricConnector::connect_fn(
            e.node().clone(),
            fabric.connector.clone(),
        )),
        (None, "remote") => Some(kvfabric_connector::RemoteConnector::connect_fn(
            fabric.connector.node_addr.clone(),
            fabric.connector.clone(),
            remote_identity,
        )),
        _ => None,
    };
    let mut builder = kvfabric_engine::EngineBuilder::new(cfg.clone())
        .metrics(metrics)
        .connector(connect);
    if let Some(dir) = &cfg.batch.dir {
        // Batch jobs (files, batches, results) survive restarts in RocksDB.
        let store = crate::batch_store::RocksBatchStore::open(dir)?;
        tracing::info!(dir = %dir.display(), "batch jobs stored");
        builder = builder.batch_store(std::sync::Arc::new(store));
    }
    let served = builder.serve(model, crate::node::shutdown_signal()).await;
    if let Some(e) = embedded {
        e.stop().await;
    }
    served?;
    Ok(())
}
