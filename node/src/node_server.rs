//! `NodeServer`: the one way a node is served. It owns the gRPC services
//! (CacheService, plus the internal DirectoryService and HolderService when
//! the node is in a cluster, and reflection) and the HTTP port (GET /metrics,
//! GET /health, and the browser console at / with its JSON API: see
//! [`crate::console`]), and stops both on one shutdown future. A cluster node leaves
//! membership first on shutdown (with etcd its lease is revoked, so peers see
//! it go at once), then stops serving. Also the gRPC builder/endpoint twins
//! every server and client uses (large HTTP/2 windows, TCP_NODELAY).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use kvfabric_proto::internal::v1::console_service_server::ConsoleServiceServer;
use kvfabric_proto::internal::v1::directory_service_server::DirectoryServiceServer;
use kvfabric_proto::internal::v1::holder_service_server::HolderServiceServer;
use kvfabric_proto::v1::cache_service_server::CacheServiceServer;
use kvfabric_proto::v1::kv_event_service_server::KvEventServiceServer;
use kvfabric_tenants::{TenantGate, TenantMetrics};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Status};

use crate::cache_service::CacheServer;
use crate::cluster::cluster_cache_service::ClusterCacheService;
use crate::cluster::cluster_config::ClusterConfig;
use crate::cluster::kv_events::KvEventRpc;
use crate::cluster::rpc::{DirectoryRpc, HolderRpc};
use crate::cluster::ClusterNode;
use crate::console::cluster::ConsoleRpc;
use crate::console::Console;
use crate::exposition::encode_text;
use crate::tenant_scope::{self, TenantScoped};
use crate::{BadNodeConfig, NodeError};
use kvfabric_store::ChangeFeed;
use kvfabric_store::NodeConfig;
use kvfabric_store::Store;

/// HTTP/2 stream flow-control window of the gRPC server (clients should match it).
const GRPC_STREAM_WINDOW: u32 = 16 << 20;
/// Largest HTTP/2 frame either side accepts: a 1 MiB Get chunk goes out as
/// one DATA frame instead of 64 frames of the 16 KiB default.
const GRPC_MAX_FRAME: u32 = 1 << 20;
/// HTTP/2 connection flow-control window of the gRPC server.
const GRPC_CONNECTION_WINDOW: u32 = 64 << 20;
/// Message limit of the internal DirectoryService (batched announces/locates).
const DIRECTORY_MESSAGE_LIMIT: usize = 256 << 20;

/// A node ready to serve: its store, its cluster side (if any), its metrics
/// registry and its two bound listeners. Build it with [`NodeServer::open`]
/// (what `kvfabric node` runs), [`NodeServer::join`], [`NodeServer::cluster`]
/// (an already started [`ClusterNode`] the caller keeps a handle to) or
/// [`NodeServer::standalone`] (one node, no directory, no transfer server),
/// then run it with [`NodeServer::serve`].
pub struct NodeServer {
    store: Store,
    node: Option<Arc<ClusterNode>>,
    registry: Registry,
    console_sources: Vec<Arc<Registry>>,
    grpc: TcpListener,
    http: TcpListener,
}

impl NodeServer {
    /// Bind `cfg`'s listeners, open its store and join the cluster.
    pub async fn open(cfg: NodeConfig, cluster: ClusterConfig) -> Result<Self, NodeError> {
        cluster.validate()?;
        if cfg.vram_capacity.as_u64() > 0 {
            // Refused, not ignored: nothing in a node process fills VRAM.
            return Err(NodeError::Config(BadNodeConfig::VramInNode));
        }
        let grpc = TcpListener::bind(cfg.grpc_listen).await?;
        let http = TcpListener::bind(cfg.http_listen).await?;
        let (store, registry) = tokio::task::spawn_blocking(move || {
            let mut registry = Registry::default();
            Store::open(cfg, &mut registry).map(|s| (s, registry))
        })
        .await
        .map_err(|e| NodeError::Server {
            what: "store open task",
            source: e.into(),
        })??;
        Self::join(store, registry, cluster, grpc, http).await
    }

    /// Start the cluster side of an opened `store` on already bound listeners.
    pub async fn join(
        store: Store,
        mut registry: Registry,
        cluster: ClusterConfig,
        grpc: TcpListener,
        http: TcpListener,
    ) -> Result<Self, NodeError> {
        let grpc_addr = grpc.local_addr()?;
        let node = ClusterNode::start(store, cluster, grpc_addr, &mut registry).await?;
        Ok(Self::cluster(node, registry, grpc, http))
    }

    /// Serve an already started cluster `node` (in-process embedders and
    /// benches keep the handle to call [`ClusterNode::get`] directly).
    pub fn cluster(
        node: Arc<ClusterNode>,
        registry: Registry,
        grpc: TcpListener,
        http: TcpListener,
    ) -> Self {
        Self {
            store: node.store().clone(),
            node: Some(node),
            registry,
            console_sources: Vec::new(),
            grpc,
            http,
        }
    }

    /// Serve an opened `store` as a standalone single node (no directory, no
    /// transfer server); tests and the store bench use it.
    pub fn standalone(
        store: Store,
        registry: Registry,
        grpc: TcpListener,
        http: TcpListener,
    ) -> Self {
        Self {
            store,
            node: None,
            registry,
            console_sources: Vec::new(),
            grpc,
            http,
        }
    }

    /// Let the console also sample `sources`: registries of this process
    /// that `/metrics` does not serve (an embedding engine's, which serves
    /// them on its own port), so its engine plots have data.
    pub fn console_sources(mut self, sources: Vec<Arc<Registry>>) -> Self {
        self.console_sources = sources;
        self
    }

    /// The cluster side, when this node has one.
    pub fn node(&self) -> Option<&Arc<ClusterNode>> {
        self.node.as_ref()
    }

    /// Serve gRPC and HTTP until `shutdown` resolves: the tenant gate, the
    /// stop signal, the console, then both servers on one stop.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), NodeError> {
        let Self {
            store,
            node,
            mut registry,
            console_sources,
            grpc,
            http,
        } = self;
        let gate = tenant_gate(&store, &mut registry)?;
        let identity = node.as_ref().and_then(|n| n.shared_identity());
        let auth = tenant_scope::authenticate(gate.clone(), identity);
        let grpc_addr = grpc.local_addr()?;
        let http_addr = http.local_addr()?;
        let stop_rx = stop_signal(shutdown, node.clone());
        let console = Console::start(
            store.clone(),
            registry,
            console_sources,
            node.clone(),
            stop_rx.clone(),
        );
        let router = grpc_router(&store, node.as_ref(), &console, auth, grpc_addr)?;
        let grpc_server =
            router.serve_with_incoming_shutdown(incoming_nodelay(grpc), stopped(stop_rx.clone()));
        let http_server =
            axum::serve(http, http_app(console, gate)).with_graceful_shutdown(stopped(stop_rx));

        let node_id = node
            .as_ref()
            .map(|n| n.info().node_id.clone())
            .unwrap_or_default();
        tracing::info!(node = %node_id, "node serving gRPC on {grpc_addr}, console/metrics/health on http://{http_addr}");
        let (g, h) = tokio::join!(grpc_server, http_server);
        g.map_err(|e| NodeError::Server {
            what: "grpc",
            source: e.into(),
        })?;
        h.map_err(|e| NodeError::Server {
            what: "http",
            source: e.into(),
        })?;
        Ok(())
    }
}

/// The node's tenant gate (its file reloaded in the background, its
/// metrics in `registry`, its tier shares given to `store` now and on each
/// reload): the CacheService's interceptor and the HTTP port's gate.
fn tenant_gate(store: &Store, registry: &mut Registry) -> Result<TenantGate, NodeError> {
    let cfg = store.config();
    let tenants = TenantGate::from_config(
        cfg.tenants_file.as_deref(),
        TenantMetrics::default(),
        "grpc-cache-service",
    )?;
    tenants.metrics().register(registry);
    let shares_of = store.clone();
    tenants.watch(move |t| shares_of.set_shares(t));
    tenants.spawn_reloader(Duration::from_millis(cfg.tenants_reload_ms));
    Ok(tenants)
}

/// Set once `shutdown` resolved and a cluster node left membership (with
/// etcd its lease is revoked, so peers see it go at once).
fn stop_signal(
    shutdown: impl Future<Output = ()> + Send + 'static,
    node: Option<Arc<ClusterNode>>,
) -> watch::Receiver<bool> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        if let Some(node) = node {
            node.leave().await;
        }
        let _ = stop_tx.send(true);
    });
    stop_rx
}

/// Resolves once the stop signal is set.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// The gRPC services: reflection and the CacheService (local, or
/// cluster-wide with the internal Directory, Holder and Console services),
/// over mutual TLS when the node has an identity.
fn grpc_router<A>(
    store: &Store,
    node: Option<&Arc<ClusterNode>>,
    console: &Arc<Console>,
    auth: A,
    grpc_addr: std::net::SocketAddr,
) -> Result<tonic::transport::server::Router, NodeError>
where
    A: FnMut(Request<()>) -> Result<Request<()>, Status> + Clone + Send + Sync + 'static,
{
    let limit = store.config().max_block_size.as_u64() as usize + (1 << 20);
    let mut builder = match node.and_then(|n| n.identity()) {
        Some(id) => grpc_builder()
            .tls_config(crate::cluster::security::server_tls(id))
            .map_err(|e| NodeError::Server {
                what: "grpc tls",
                source: e.into(),
            })?,
        None => grpc_builder(),
    };
    let (reflect_v1, reflect_v1alpha) = reflection_services()?;
    let router = builder
        .add_service(reflect_v1)
        .add_service(reflect_v1alpha)
        .add_service(InterceptedService::new(
            KvEventServiceServer::new(kv_event_rpc(store, node, grpc_addr)),
            auth.clone(),
        ));
    Ok(match node {
        None => {
            let local = CacheServer::new(store.clone(), grpc_addr.to_string());
            router.add_service(InterceptedService::new(
                CacheServiceServer::new(TenantScoped::new(local))
                    .max_decoding_message_size(limit)
                    .max_encoding_message_size(limit),
                auth,
            ))
        }
        Some(node) => {
            let local = CacheServer::new(store.clone(), node.info().grpc_addr.clone());
            let cache = CacheServiceServer::new(TenantScoped::new(
                ClusterCacheService::new(local, node.clone())
                    .with_prefix_tracker(console.prefixes().clone()),
            ))
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
            let cache = InterceptedService::new(cache, auth);
            let directory = DirectoryServiceServer::new(DirectoryRpc(node.clone()))
                .max_decoding_message_size(DIRECTORY_MESSAGE_LIMIT)
                .max_encoding_message_size(DIRECTORY_MESSAGE_LIMIT);
            router
                .add_service(cache)
                .add_service(directory)
                .add_service(HolderServiceServer::new(HolderRpc(node.clone())))
                .add_service(
                    ConsoleServiceServer::new(ConsoleRpc(console.clone()))
                        .max_encoding_message_size(DIRECTORY_MESSAGE_LIMIT),
                )
        }
    })
}

/// KV events: the cluster node's change feed; a standalone node gets an
/// events-only feed (nothing else subscribes to its store).
fn kv_event_rpc(
    store: &Store,
    node: Option<&Arc<ClusterNode>>,
    grpc_addr: std::net::SocketAddr,
) -> KvEventRpc {
    match node {
        Some(n) => KvEventRpc::new(n.change_feed().clone(), n.info().node_id.clone()),
        None => {
            let feed = Arc::new(ChangeFeed::events_only());
            store.watch_changes(feed.clone());
            KvEventRpc::new(feed, grpc_addr.to_string())
        }
    }
}

/// The node's HTTP app: `/metrics`, `/health` and the console, behind the
/// operator gate when the node has a tenants file (`operator_gate.rs`).
fn http_app(console: Arc<Console>, gate: TenantGate) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { "ok\n" }))
        .route("/api/v1/capacity", get(capacity))
        .with_state(console.clone())
        .merge(crate::console::http::routes(console))
        .layer(axum::middleware::from_fn_with_state(
            gate,
            crate::operator_gate::require_operator,
        ))
}

async fn metrics(State(console): State<Arc<Console>>) -> impl IntoResponse {
    console.store().stats(); // refreshes the per-tier gauges
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        encode_text(console.registry()),
    )
}

/// GET /api/v1/capacity: the capacity planner's curves (`planner`).
async fn capacity(State(console): State<Arc<Console>>) -> impl IntoResponse {
    axum::Json(console.store().capacity())
}

/// The gRPC server builder every node uses. Blocks are MiBs: HTTP/2's default
/// 64 KiB windows would stall every transfer.
pub(crate) fn grpc_builder() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .initial_stream_window_size(GRPC_STREAM_WINDOW)
        .initial_connection_window_size(GRPC_CONNECTION_WINDOW)
        .max_frame_size(GRPC_MAX_FRAME)
        .tcp_nodelay(true)
}

/// A client endpoint with the server's windows and frame size (the twin of
/// [`grpc_builder`]): HTTP/2's defaults would stall every block transfer.
pub(crate) fn grpc_endpoint(e: tonic::transport::Endpoint) -> tonic::transport::Endpoint {
    e.initial_stream_window_size(GRPC_STREAM_WINDOW)
        .initial_connection_window_size(GRPC_CONNECTION_WINDOW)
        .max_frame_size(GRPC_MAX_FRAME)
        .tcp_nodelay(true)
}

/// Accepted connections with Nagle off: the builder's `tcp_nodelay` only
/// applies to listeners it binds itself, and small replies would wait 40 ms.
pub(crate) fn incoming_nodelay(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |conn| {
            if let Ok(c) = &conn {
                let _ = c.set_nodelay(true);
            }
            conn
        },
    )
}

/// gRPC server reflection over every kvfabric proto, so `grpcurl` works
/// against a node: `grpc.reflection.v1` and `grpc.reflection.v1alpha` (the
/// only one older grpcurl and grpcio-reflection's client speak).
pub(crate) fn reflection_services() -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    NodeError,
> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(kvfabric_proto::FILE_DESCRIPTOR_SET)
    };
    let err = |e: tonic_reflection::server::Error| NodeError::Server {
        what: "reflection",
        source: e.into(),
    };
    Ok((
        builder().build_v1().map_err(err)?,
        builder().build_v1alpha().map_err(err)?,
    ))
}
