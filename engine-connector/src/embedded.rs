//! A fabric node inside the engine process.
//!
//! The default deployment: every engine process is also a cluster node, so
//! the connector reads and writes the node's RAM tier with no hop, peers
//! reach the node's gRPC and transfer ports as usual, and there is no
//! separate daemon to run. [`EmbeddedNode`] opens the store, starts the
//! cluster node and serves it until [`EmbeddedNode::stop`].

use std::net::SocketAddr;
use std::sync::Arc;

use kvfabric_node::cluster::{ClusterConfig, ClusterNode};
use kvfabric_node::NodeServer;
use kvfabric_store::{NodeConfig, Registry, Store};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::ConnectorError;

/// A running node of the fabric in this process.
pub struct EmbeddedNode {
    node: Arc<ClusterNode>,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    serving: Option<JoinHandle<Result<(), kvfabric_node::NodeError>>>,
}

impl std::fmt::Debug for EmbeddedNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedNode")
            .field("node", &self.node.info().node_id)
            .field("grpc", &self.grpc_addr)
            .finish()
    }
}

impl EmbeddedNode {
    /// Open the store of `node`, join the cluster of `cluster` and serve the
    /// node's gRPC (`node.grpc_listen`) and metrics (`node.http_listen`) ports.
    pub async fn start(
        node: NodeConfig,
        cluster: ClusterConfig,
    ) -> Result<EmbeddedNode, ConnectorError> {
        Self::start_with_console_sources(node, cluster, Vec::new()).await
    }

    /// [`EmbeddedNode::start`], with the node's console also sampling
    /// `console_sources` (the engine's registry: its TTFT and cached-prompt
    /// plots), which the node's `/metrics` does not serve.
    pub async fn start_with_console_sources(
        node: NodeConfig,
        cluster: ClusterConfig,
        console_sources: Vec<Arc<Registry>>,
    ) -> Result<EmbeddedNode, ConnectorError> {
        cluster.validate()?;
        let grpc = TcpListener::bind(node.grpc_listen).await?;
        let http = TcpListener::bind(node.http_listen).await?;
        let (grpc_addr, http_addr) = (grpc.local_addr()?, http.local_addr()?);
        let (store, mut registry) = tokio::task::spawn_blocking(move || {
            let mut registry = Registry::default();
            Store::open(node, &mut registry).map(|s| (s, registry))
        })
        .await
        .map_err(|e| ConnectorError::Task {
            task: "store open",
            source: e.into(),
        })??;
        let cluster_node = ClusterNode::start(store, cluster, grpc_addr, &mut registry).await?;
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = tokio::spawn(
            NodeServer::cluster(cluster_node.clone(), registry, grpc, http)
                .console_sources(console_sources)
                .serve(async move {
                    let _ = stopped.await;
                }),
        );
        Ok(EmbeddedNode {
            node: cluster_node,
            grpc_addr,
            http_addr,
            stop: Some(stop),
            serving: Some(serving),
        })
    }

    /// The cluster node (store, lookups, reads).
    pub fn node(&self) -> &Arc<ClusterNode> {
        &self.node
    }

    /// The bound gRPC address (CacheService and the internal services).
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The bound HTTP address (the console at /, /metrics, /health of the node).
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Leave the cluster and stop serving.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(j) = self.serving.take() {
            match j.await {
                Ok(Err(e)) => tracing::warn!(error = %e, "embedded node stopped with an error"),
                Err(e) => tracing::warn!(error = %e, "embedded node task failed"),
                Ok(Ok(())) => {}
            }
        }
    }
}

impl Drop for EmbeddedNode {
    fn drop(&mut self) {
        // Dropped without stop(): ask the serving task to end anyway.
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}
