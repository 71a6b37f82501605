//! Serving pieces shared by every node: the gRPC builder (large HTTP/2
//! windows, TCP_NODELAY), server reflection, and [`serve_store`], a standalone
//! single node (gRPC CacheService + GET /metrics + GET /health) stopped by one
//! shutdown future.

use std::future::Future;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use kvfabric_proto::v1::cache_service_server::CacheServiceServer;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::cache_service::CacheServer;
use crate::metrics::encode_text;
use crate::store::Store;
use crate::StoreError;

/// HTTP/2 stream flow-control window of the gRPC server (clients should match it).
const GRPC_STREAM_WINDOW: u32 = 16 << 20;
/// Largest HTTP/2 frame either side accepts: a 1 MiB Get chunk goes out as
/// one DATA frame instead of 64 frames of the 16 KiB default.
const GRPC_MAX_FRAME: u32 = 1 << 20;
/// HTTP/2 connection flow-control window of the gRPC server.
const GRPC_CONNECTION_WINDOW: u32 = 64 << 20;

/// Serve an opened `store` as a standalone single node (no directory, no
/// transfer server) on already bound listeners; tests and the store bench
/// use it. `kvfabric node` runs [`crate::cluster::serve_node`].
pub async fn serve_store(
    store: Store,
    registry: Registry,
    grpc: TcpListener,
    http: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StoreError> {
    let grpc_addr = grpc.local_addr()?;
    let http_addr = http.local_addr()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let reflection = crate::server::reflection_service()?;
    let limit = store.config().max_block_size.as_u64() as usize + (1 << 20);
    let cache = CacheServiceServer::new(CacheServer::new(store.clone(), grpc_addr.to_string()))
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
    let grpc_server = grpc_builder()
        .add_service(cache)
        .add_service(reflection)
        .serve_with_incoming_shutdown(incoming_nodelay(grpc), stopped(stop_rx.clone()));

    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { "ok\n" }))
        .with_state(Arc::new((store, registry)));
    let http_server = axum::serve(http, app).with_graceful_shutdown(stopped(stop_rx));

    tracing::info!("node serving gRPC on {grpc_addr}, metrics/health on http://{http_addr}");
    let (g, h) = tokio::join!(grpc_server, http_server);
    g.map_err(|e| StoreError::Server(format!("grpc: {e}")))?;
    h.map_err(|e| StoreError::Server(format!("http: {e}")))?;
    Ok(())
}

async fn metrics(State(state): State<Arc<(Store, Registry)>>) -> impl IntoResponse {
    let (store, registry) = &*state;
    store.stats(); // refreshes the per-tier gauges
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        encode_text(registry),
    )
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

/// gRPC server reflection over every kvfabric proto, so `grpcurl` works against a node.
pub(crate) fn reflection_service() -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    StoreError,
> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(kvfabric_proto::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| StoreError::Server(format!("reflection: {e}")))
}
