//! Engines with embedded fabric nodes in this process, on a real etcd:
//! what the connector tests need to run prefill on one node and reuse it on
//! another. Every wait has a deadline.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytesize::ByteSize;
use kvfabric_connector::{ConnectFn, ConnectorConfig, EmbeddedNode, FabricConnector};
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::{
    EngineConfig, EngineHandle, GenerationEvent, GenerationRequest, RunningEngine, SamplingParams,
    TransferParams, Usage,
};
use kvfabric_store::cluster::etcd_process::EtcdProcess;
use kvfabric_store::cluster::ClusterConfig;
use kvfabric_store::NodeConfig;
use tokio::sync::mpsc;

/// The reference model: `$KVFABRIC_MODEL_PATH` or the fetched cache path.
pub fn model_path() -> PathBuf {
    let p = kvfabric_engine::model::reference_model_path();
    assert!(
        p.exists(),
        "reference model not found at {}: run `kvfabric model fetch`",
        p.display()
    );
    p
}

/// The model, loaded once per test binary.
pub fn model() -> Arc<LlamaModel> {
    static M: OnceLock<Arc<LlamaModel>> = OnceLock::new();
    M.get_or_init(|| Arc::new(LlamaModel::load(&model_path(), |_, _| {}).expect("load model")))
        .clone()
}

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
    let cfg = NodeConfig {
        node_id: id.into(),
        grpc_listen: "127.0.0.1:0".parse().unwrap(),
        http_listen: "127.0.0.1:0".parse().unwrap(),
        ram_capacity: ByteSize::mib(512),
        ..NodeConfig::default()
    };
    let cluster = ClusterConfig {
        etcd: vec![etcd.endpoint()],
        etcd_prefix: prefix.into(),
        lease_ttl_ms: 2000,
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
    let (tx, mut rx) = mpsc::channel(max_tokens + 4);
    let started = Instant::now();
    engine
        .submit(GenerationRequest {
            prompt: prompt.to_vec(),
            max_tokens,
            sampling: SamplingParams::default(),
            stop_token_ids: Vec::new(),
            namespace: namespace.to_vec(),
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
