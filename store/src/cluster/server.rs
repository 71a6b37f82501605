//! `serve_cluster`: one cluster node process — the cluster-wide CacheService,
//! the internal DirectoryService and HolderService and gRPC reflection on one
//! gRPC port, GET /metrics and GET /health on the HTTP port, the transfer
//! engine on its own port. On shutdown the node leaves membership first (with
//! etcd its lease is revoked, so peers see it go at once), then stops serving.

use std::future::Future;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use kvfabric_proto::internal::v1::directory_service_server::DirectoryServiceServer;
use kvfabric_proto::internal::v1::holder_service_server::HolderServiceServer;
use kvfabric_proto::v1::cache_service_server::CacheServiceServer;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::cache_service::CacheServer;
use crate::cluster::cluster_cache_service::ClusterCacheService;
use crate::cluster::cluster_config::ClusterConfig;
use crate::cluster::node::ClusterNode;
use crate::cluster::rpc::{DirectoryRpc, HolderRpc};
use crate::metrics::encode_text;
use crate::node_config::NodeConfig;
use crate::store::Store;
use crate::StoreError;

/// Open the store of `cfg` and run it as a cluster node until `shutdown`.
pub async fn serve_node(
    cfg: NodeConfig,
    cluster: ClusterConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StoreError> {
    cluster.validate()?;
    let grpc = TcpListener::bind(cfg.grpc_listen).await?;
    let http = TcpListener::bind(cfg.http_listen).await?;
    let (store, registry) = tokio::task::spawn_blocking(move || {
        let mut registry = Registry::default();
        Store::open(cfg, &mut registry).map(|s| (s, registry))
    })
    .await
    .map_err(|e| StoreError::Server(format!("store open task: {e}")))??;
    serve_cluster(store, registry, cluster, grpc, http, shutdown).await
}

/// Serve an opened `store` as a cluster node on already bound listeners.
pub async fn serve_cluster(
    store: Store,
    mut registry: Registry,
    cluster: ClusterConfig,
    grpc: TcpListener,
    http: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StoreError> {
    let grpc_addr = grpc.local_addr()?;
    let node = ClusterNode::start(store.clone(), cluster, grpc_addr, &mut registry).await?;
    serve_cluster_node(node, registry, grpc, http, shutdown).await
}

/// Serve an already started cluster `node` (in-process embedders and benches
/// keep the handle to call [`ClusterNode::get`] directly).
pub async fn serve_cluster_node(
    node: Arc<ClusterNode>,
    registry: Registry,
    grpc: TcpListener,
    http: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StoreError> {
    let store = node.store().clone();
    let grpc_addr = grpc.local_addr()?;
    let http_addr = http.local_addr()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    {
        let node = node.clone();
        tokio::spawn(async move {
            shutdown.await;
            node.leave().await;
            let _ = stop_tx.send(true);
        });
    }
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let reflection = crate::server::reflection_service()?;
    let limit = store.config().max_block_size.as_u64() as usize + (1 << 20);
    let local = CacheServer::new(store.clone(), node.info().grpc_addr.clone());
    let cache = CacheServiceServer::new(ClusterCacheService::new(local, node.clone()))
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
    let dir_limit = 256 << 20;
    let directory = DirectoryServiceServer::new(DirectoryRpc(node.clone()))
        .max_decoding_message_size(dir_limit)
        .max_encoding_message_size(dir_limit);
    let holder = HolderServiceServer::new(HolderRpc(node.clone()));
    let grpc_server = crate::server::grpc_builder()
        .add_service(cache)
        .add_service(directory)
        .add_service(holder)
        .add_service(reflection)
        .serve_with_incoming_shutdown(
            crate::server::incoming_nodelay(grpc),
            stopped(stop_rx.clone()),
        );
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { "ok\n" }))
        .with_state(Arc::new((store, registry)));
    let http_server = axum::serve(http, app).with_graceful_shutdown(stopped(stop_rx));
    tracing::info!(node = %node.info().node_id, "cluster node serving gRPC on {grpc_addr}, metrics/health on http://{http_addr}");
    let (g, h) = tokio::join!(grpc_server, http_server);
    g.map_err(|e| StoreError::Server(format!("grpc: {e}")))?;
    h.map_err(|e| StoreError::Server(format!("http: {e}")))?;
    Ok(())
}

async fn metrics(State(state): State<Arc<(Store, Registry)>>) -> impl IntoResponse {
    let (store, registry) = &*state;
    store.stats();
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        encode_text(registry),
    )
}
