//! [`EmbeddedNode`]: a kvfabric node inside the Python process, for
//! single-host use (one engine, tests, notebooks). It is the bundled
//! engine's embedded node (`kvfabric_connector::EmbeddedNode`): a RAM tier,
//! the gRPC CacheService, `/metrics`, and optionally static peers, so it can
//! join a cluster of `kvfabric node` processes.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytesize::ByteSize;
use kvfabric_connector::EmbeddedNode as Node;
use kvfabric_node::cluster::{parse_peer, ClusterConfig};
use kvfabric_store::NodeConfig;
use pyo3::prelude::*;
use tokio::runtime::Runtime;

use crate::client::{runtime, Client};
use crate::error::PyClientError;

/// A kvfabric node in this process.
#[pyclass(module = "kvfabric._native", frozen)]
pub struct EmbeddedNode {
    rt: Arc<Runtime>,
    node: Mutex<Option<Node>>,
    addr: String,
    http_addr: String,
}

fn socket(what: &'static str, s: &str) -> Result<SocketAddr, PyClientError> {
    s.parse()
        .map_err(|_| PyClientError::arg(what, format!("{s:?}: want host:port")))
}

#[pymethods]
impl EmbeddedNode {
    #[new]
    #[pyo3(signature = (ram_mib = 1024, grpc_addr = "127.0.0.1:0", http_addr = "127.0.0.1:0",
                        node_id = "embedded", peers = None, transfer_addr = "127.0.0.1:0"))]
    fn new(
        py: Python<'_>,
        ram_mib: u64,
        grpc_addr: &str,
        http_addr: &str,
        node_id: &str,
        peers: Option<Vec<String>>,
        transfer_addr: &str,
    ) -> PyResult<Self> {
        if ram_mib == 0 {
            return Err(PyClientError::arg("ram_mib", "0: the node needs a RAM tier").into());
        }
        let cfg = NodeConfig {
            node_id: node_id.to_string(),
            grpc_listen: socket("grpc_addr", grpc_addr)?,
            http_listen: socket("http_addr", http_addr)?,
            ram_capacity: ByteSize::mib(ram_mib),
            ..NodeConfig::default()
        };
        let peers = peers.unwrap_or_default();
        if let Some(e) = peers.iter().find_map(|p| parse_peer(p).err()) {
            return Err(PyClientError::arg("peers", e.to_string()).into());
        }
        let cluster = ClusterConfig {
            peers,
            transfer_listen: transfer_addr.to_string(),
            ..ClusterConfig::default()
        };
        let rt = runtime(std::thread::available_parallelism().map_or(2, |n| n.get()))?;
        let node = py
            .detach(|| rt.block_on(Node::start(cfg, cluster)))
            .map_err(|e| PyClientError::Local {
                what: "starting the embedded node",
                reason: e.to_string(),
            })?;
        Ok(EmbeddedNode {
            addr: node.grpc_addr().to_string(),
            http_addr: node.http_addr().to_string(),
            node: Mutex::new(Some(node)),
            rt,
        })
    }

    /// The node's gRPC address (`host:port`).
    #[getter]
    fn addr(&self) -> &str {
        &self.addr
    }

    /// The node's HTTP address (`/metrics`, `/health`, the console).
    #[getter]
    fn http_addr(&self) -> &str {
        &self.http_addr
    }

    /// A client of this node.
    #[pyo3(signature = (api_key = None, timeout_s = 5.0))]
    fn client(&self, api_key: Option<&str>, timeout_s: f64) -> PyResult<Client> {
        if !(timeout_s > 0.0 && timeout_s.is_finite()) {
            return Err(PyClientError::arg("timeout_s", format!("{timeout_s}: want > 0")).into());
        }
        let t = Duration::from_secs_f64(timeout_s);
        Ok(Client::open(self.rt.clone(), &self.addr, api_key, None, t)?)
    }

    /// Leave the cluster and stop serving (also done when the object goes).
    fn stop(&self, py: Python<'_>) {
        let node = self.node.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(n) = node {
            py.detach(|| self.rt.block_on(n.stop()));
        }
    }

    fn __repr__(&self) -> String {
        format!("EmbeddedNode(addr='{}')", self.addr)
    }
}

impl Drop for EmbeddedNode {
    fn drop(&mut self) {
        if let Some(n) = self
            .node
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            self.rt.block_on(n.stop());
        }
    }
}
