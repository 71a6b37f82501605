//! Engines with embedded fabric nodes in this process, on a real etcd
//! (feature `fabric`): what the connector tests need to run prefill on one
//! node and reuse it on another. Every wait has a deadline.

use std::net::{IpAddr, SocketAddr};

use std::time::{Duration, Instant};

use crate::EtcdProcess;
use bytesize::ByteSize;
use kvfabric_connector::{ConnectFn, ConnectorConfig, EmbeddedNode, FabricConnector};
use kvfabric_engine::{
    EngineConfig, EngineHandle, GenerationEvent, GenerationRequest, RunningEngine, SamplingParams,
    TransferParams, Usage,
};
use kvfabric_node::cluster::ClusterConfig;
use kvfabric_store::NodeConfig;
use tokio::sync::mpsc;

pub use crate::engine::model;
pub use crate::metrics::metric_sum;

pub fn engine_config() -> EngineConfig {
    EngineConfig {
        threads: 2,
        kv_pool: ByteSize::mib(256),
        ..EngineConfig::default()
    }
}

/// `n` deterministic token ids inside the vocabulary (no special ids).
pub fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 40_000) as u32 + 100
        })
        .collect()
}

/// A fabric node in this process.
pub async fn node(etcd: &EtcdProcess, prefix: &str, id: &str) -> EmbeddedNode {
    node_on(etcd.endpoint(), prefix, id, IpAddr::from([127, 0, 0, 1])).await
}

/// A fabric node in this process whose ports (gRPC, metrics, transfer) are
/// bound on `ip`: a test bed host's address, from a runtime of that host.
pub async fn node_on(etcd: String, prefix: &str, id: &str, ip: IpAddr) -> EmbeddedNode {
    let cfg = NodeConfig {
        node_id: id.into(),
        grpc_listen: SocketAddr::new(ip, 0),
        http_listen: SocketAddr::new(ip, 0),
        ram_capacity: ByteSize::mib(512),
        ..NodeConfig::default()
    };
    let cluster = ClusterConfig {
        etcd: vec![etcd],
        etcd_prefix: prefix.into(),
        lease_ttl_ms: 2000,
        transfer_listen: SocketAddr::new(ip, 0).to_string(),
        ..ClusterConfig::default()
    };
    EmbeddedNode::start(cfg, cluster)
        .await
        .expect("embedded node")
}

/// Wait until every node sees `n` members.
pub async fn wait_members(nodes: &[&EmbeddedNode], n: usize) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while nodes.iter().any(|x| x.node().view().nodes.len() != n) {
        assert!(Instant::now() < deadline, "membership did not converge");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An engine whose connector uses `node` (None: no fabric at all).
pub fn engine(node: Option<&EmbeddedNode>, cfg: &EngineConfig) -> RunningEngine {
    let connect =
        node.map(|n| FabricConnector::connect_fn(n.node().clone(), ConnectorConfig::default()));
    engine_with(connect, cfg)
}

/// An engine with the connector `connect` builds (None: no fabric at all).
pub fn engine_with(connect: Option<ConnectFn>, cfg: &EngineConfig) -> RunningEngine {
    kvfabric_engine::EngineBuilder::new(cfg.clone())
        .connector(connect)
        .start(model())
        .expect("engine")
}

/// What one request produced.
#[derive(Debug, Default)]
pub struct Output {
    pub tokens: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
    pub usage: Usage,
    pub transfer: Option<TransferParams>,
    pub ttft: Duration,
}

/// Greedy generation of `max_tokens` with logits, in `namespace`.
pub async fn generate(
    engine: &EngineHandle,
    prompt: &[u32],
    max_tokens: usize,
    namespace: &[u8],
) -> Output {
    generate_as(engine, prompt, max_tokens, namespace, None).await
}

/// [`generate`] for a tenant: the blocks the request saves or pulls into
/// its node count to `owner` in the node's tier shares.
pub async fn generate_as(
    engine: &EngineHandle,
    prompt: &[u32],
    max_tokens: usize,
    namespace: &[u8],
    owner: Option<std::sync::Arc<str>>,
) -> Output {
    let (tx, mut rx) = mpsc::channel(max_tokens + 4);
    let started = Instant::now();
    engine
        .submit(GenerationRequest {
            prompt: prompt.to_vec(),
            max_tokens,
            sampling: SamplingParams::default(),
            stop_token_ids: Vec::new(),
            namespace: namespace.to_vec(),
            owner,
            return_logits: true,
            forks: Vec::new(),
            events: tx,
        })
        .await
        .expect("submit");
    let mut out = Output::default();
    let deadline = Duration::from_secs(120);
    loop {
        let ev = tokio::time::timeout(deadline, rx.recv())
            .await
            .expect("engine answered in time")
            .expect("engine kept the request");
        match ev {
            GenerationEvent::Token { id, logits } => {
                if out.tokens.is_empty() {
                    out.ttft = started.elapsed();
                }
                out.tokens.push(id);
                out.logits.push(logits.expect("logits requested"));
            }
            GenerationEvent::Saved(p) => out.transfer = Some(p),
            GenerationEvent::Admitted { .. } => {}
            GenerationEvent::Finished { usage, .. } => {
                out.usage = usage;
                return out;
            }
            GenerationEvent::Error(e) => panic!("request failed: {e}"),
        }
    }
}

/// Bitwise equality of two logits rows.
pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// GET /metrics of a node (blocking; call from a thread of the node's host).
pub fn node_metrics(addr: SocketAddr) -> String {
    crate::procs::get_ok(&addr.to_string(), "/metrics").expect("the node's /metrics")
}
