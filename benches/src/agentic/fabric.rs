//! A kvfabric cluster inside the bench process: a private etcd (Debian's
//! etcd-server) for membership, and one [`EmbeddedNode`] per engine, each
//! with its own RAM tier, gRPC port and transfer engine on loopback — the
//! default deployment (every engine process is a node) squeezed into one
//! process. Engines attach through [`FabricCluster::connect_fn`]. With
//! `--hosts`, node i runs inside host i of a test bed ([`crate::hosts`]).
//!
//! Also the save on/off decode step measurement of `bench agentic`: a batch
//! of sequences decoding while their blocks are saved write-behind must
//! step as fast as the same batch with saving off.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use kvfabric_connector::{ConnectFn, ConnectorConfig, EmbeddedNode, FabricConnector};
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::{
    EngineConfig, EngineHandle, GenerationEvent, GenerationRequest, SamplingParams,
};
use kvfabric_node::cluster::ClusterConfig;
use kvfabric_store::NodeConfig;
use kvfabric_testbed::EtcdProcess;
use kvfabric_transfer::security::SecurityConfig;
use tokio::sync::mpsc;

use super::engines::{start_engine, stop_engine};
use super::trace::SplitMix64;
use crate::hosts::{http_get, transfer_bytes, Hosts};

/// Nodes of one in-process cluster and the etcd they meet in.
pub struct FabricCluster {
    nodes: Vec<EmbeddedNode>,
    etcd: EtcdProcess,
    /// With `--hosts`: node i (and etcd, on host 0) inside host i.
    hosts: Option<Hosts>,
}

impl FabricCluster {
    /// Start etcd and `count` nodes with `ram_mib` MiB RAM tiers; returns
    /// once every node sees all the others.
    pub async fn start(count: usize, ram_mib: u64) -> anyhow::Result<FabricCluster> {
        Self::start_on(count, ram_mib, None).await
    }

    /// The same with node i on host i of `hosts` (etcd on host 0), each
    /// bound to its host's address; `hosts` must have `count` hosts.
    pub async fn start_on(
        count: usize,
        ram_mib: u64,
        hosts: Option<Hosts>,
    ) -> anyhow::Result<FabricCluster> {
        let ram = bytesize::ByteSize::mib(ram_mib);
        Self::start_configured(
            count,
            hosts,
            |n| n.ram_capacity = ram,
            |_| SecurityConfig::default(),
        )
        .await
    }

    /// [`FabricCluster::start_on`] with each node's config (RAM tier,
    /// eviction order, watermarks) set by `tier`.
    pub async fn start_with(
        count: usize,
        hosts: Option<Hosts>,
        tier: impl Fn(&mut NodeConfig),
    ) -> anyhow::Result<FabricCluster> {
        Self::start_configured(count, hosts, tier, |_| SecurityConfig::default()).await
    }

    /// [`Self::start_on`] with node i's `[cluster.security]` from `security(i)`
    /// (node i is `bench-{i}`: certificates made for those ids).
    pub async fn start_secured(
        count: usize,
        ram_mib: u64,
        hosts: Option<Hosts>,
        security: impl Fn(usize) -> SecurityConfig,
    ) -> anyhow::Result<FabricCluster> {
        let ram = bytesize::ByteSize::mib(ram_mib);
        Self::start_configured(count, hosts, |n| n.ram_capacity = ram, security).await
    }

    /// Start etcd and the nodes: node i's store config from `tier`, its
    /// `[cluster.security]` from `security(i)`.
    async fn start_configured(
        count: usize,
        hosts: Option<Hosts>,
        tier: impl Fn(&mut NodeConfig),
        security: impl Fn(usize) -> SecurityConfig,
    ) -> anyhow::Result<FabricCluster> {
        if let Some(h) = &hosts {
            anyhow::ensure!(h.len() == count, "{count} nodes on {} hosts", h.len());
        }
        let ip = |i: usize| {
            hosts
                .as_ref()
                .map_or(IpAddr::from([127, 0, 0, 1]), |h| h.ip(i))
        };
        let etcd_ip = ip(0);
        let etcd = match &hosts {
            Some(h) => {
                h.blocking(0, move || EtcdProcess::start_on(etcd_ip))
                    .await?
            }
            None => tokio::task::spawn_blocking(EtcdProcess::start)
                .await
                .map_err(|e| anyhow!("etcd start task: {e}"))?,
        }
        .context("starting etcd (Debian package etcd-server)")?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let prefix = format!("/kvf-bench-{}-{nanos}", std::process::id());
        let mut nodes = Vec::with_capacity(count);
        for i in 0..count {
            let mut node = NodeConfig {
                node_id: format!("bench-{i}"),
                grpc_listen: SocketAddr::new(ip(i), 0),
                http_listen: SocketAddr::new(ip(i), 0),
                ..NodeConfig::default()
            };
            tier(&mut node);
            let cluster = ClusterConfig {
                etcd: vec![etcd.endpoint()],
                etcd_prefix: prefix.clone(),
                transfer_listen: SocketAddr::new(ip(i), 0).to_string(),
                security: security(i),
                ..ClusterConfig::default()
            };
            let started = match &hosts {
                Some(h) => h.run(i, EmbeddedNode::start(node, cluster)).await?,
                None => EmbeddedNode::start(node, cluster).await,
            };
            nodes.push(started.with_context(|| format!("starting fabric node {i}"))?);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while nodes.iter().any(|n| n.node().view().nodes.len() < count) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the {count} fabric nodes did not see each other within 15 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(FabricCluster { nodes, etcd, hosts })
    }

    /// How an engine attaches to node `i`; `save` false = the connector
    /// loads but never saves. Call inside the runtime the nodes run on.
    pub fn connect_fn(&self, i: usize, save: bool) -> ConnectFn {
        self.connect_with(
            i,
            ConnectorConfig {
                save,
                ..ConnectorConfig::default()
            },
        )
    }

    /// How an engine attaches to node `i` with connector settings `cfg`.
    /// With hosts, the connector's tasks run on node i's host.
    pub fn connect_with(&self, i: usize, cfg: ConnectorConfig) -> ConnectFn {
        let i = i % self.nodes.len();
        let node = self.nodes[i].node().clone();
        match &self.hosts {
            Some(h) => {
                let rt = h.handle(i);
                let _inside = rt.enter();
                FabricConnector::connect_fn(node, cfg)
            }
            None => FabricConnector::connect_fn(node, cfg),
        }
    }

    /// A subscriber to node `i`'s KV events (its store's change feed: what
    /// `KvEventService.KvEvents` streams).
    pub fn kv_events(
        &self,
        i: usize,
    ) -> tokio::sync::broadcast::Receiver<kvfabric_store::KvEventRecord> {
        self.nodes[i % self.nodes.len()]
            .node()
            .change_feed()
            .subscribe()
    }

    /// Bytes node `i`'s transfer engine moved, per transport and direction.
    pub async fn transfer_bytes(
        &self,
        i: usize,
    ) -> anyhow::Result<BTreeMap<(String, String), u64>> {
        let addr = self.nodes[i].http_addr();
        let get = move || http_get(addr, "/metrics");
        let text = match &self.hosts {
            Some(h) => h.blocking(i, get).await?,
            None => tokio::task::spawn_blocking(get)
                .await
                .map_err(|e| anyhow!("metrics task: {e}"))?,
        }?;
        Ok(transfer_bytes(&text))
    }

    /// Bytes every node moved, summed per transport and direction.
    pub async fn transfer_bytes_all(&self) -> anyhow::Result<BTreeMap<(String, String), u64>> {
        let mut all = BTreeMap::new();
        for i in 0..self.nodes.len() {
            for (k, v) in self.transfer_bytes(i).await? {
                *all.entry(k).or_insert(0) += v;
            }
        }
        Ok(all)
    }

    /// RAM-tier blocks held now and evictions so far, summed over the nodes
    /// (the first tier of each node's stats is its RAM tier).
    pub fn ram_blocks_and_evictions(&self) -> (u64, u64) {
        self.nodes
            .iter()
            .filter_map(|n| {
                n.node()
                    .stats()
                    .tiers
                    .first()
                    .map(|t| (t.blocks, t.evictions))
            })
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// Each node's `adaptive` order (mode, its shadows' hits), null under
    /// another order.
    pub fn adaptive_stats(&self) -> Vec<Option<kvfabric_store::AdaptiveStats>> {
        self.nodes
            .iter()
            .map(|n| n.node().store().adaptive_stats())
            .collect()
    }

    /// Stop every node, then etcd, then the hosts.
    pub async fn stop(self) {
        let FabricCluster {
            nodes,
            mut etcd,
            hosts,
        } = self;
        for (i, n) in nodes.into_iter().enumerate() {
            match &hosts {
                Some(h) => {
                    let _ = h.run(i, n.stop()).await;
                }
                None => n.stop().await,
            }
        }
        let _ = tokio::task::spawn_blocking(move || etcd.stop()).await;
        if let Some(h) = hosts {
            h.shutdown();
        }
    }
}

/// Mean time between consecutive tokens of `batch` sequences decoding
/// together (each a fresh `prompt_tokens`-token prompt, then `tokens`
/// tokens), on a new engine attached with `connect`; with the saved-block
/// count of its connector.
pub async fn decode_step(
    model: &Arc<LlamaModel>,
    cfg: &EngineConfig,
    connect: ConnectFn,
    batch: usize,
    prompt_tokens: usize,
    tokens: usize,
    seed: u64,
) -> anyhow::Result<(Duration, u64)> {
    anyhow::ensure!(
        batch > 0 && tokens >= 2,
        "step measurement needs a batch and >= 2 tokens"
    );
    let engine = start_engine(model, cfg, Some(connect))?;
    let vocab = model.config.vocab as u64;
    let mut rng = SplitMix64::new(seed);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..batch {
        // Random ids (never seen before: every block is new to the fabric).
        let prompt: Vec<u32> = (0..prompt_tokens)
            .map(|_| (100 + rng.next_u64() % (vocab - 200)) as u32)
            .collect();
        tasks.spawn(token_times(engine.handle.clone(), prompt, tokens));
    }
    let mut per_step = Vec::with_capacity(batch);
    let mut first_error = None;
    while let Some(joined) = tasks.join_next().await {
        match joined
            .map_err(|e| anyhow!("decode task: {e}"))
            .and_then(|r| r)
        {
            Ok(times) => {
                if let (Some(first), Some(last)) = (times.first(), times.last()) {
                    per_step.push((*last - *first).as_secs_f64() / (times.len() - 1).max(1) as f64);
                }
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let connector = engine.connector.clone();
    if let Some(c) = &connector {
        let c = c.clone();
        let _ = tokio::task::spawn_blocking(move || c.flush(Duration::from_secs(30))).await;
    }
    let saved = connector.map_or(0, |c| c.stats().saved_blocks);
    stop_engine(engine).await?;
    if let Some(e) = first_error {
        return Err(e);
    }
    let mean = per_step.iter().sum::<f64>() / per_step.len().max(1) as f64;
    Ok((Duration::from_secs_f64(mean), saved))
}

/// Arrival time of every token of one greedy request.
async fn token_times(
    engine: EngineHandle,
    prompt: Vec<u32>,
    tokens: usize,
) -> anyhow::Result<Vec<Instant>> {
    let (tx, mut rx) = mpsc::channel(tokens + 8);
    engine
        .submit(GenerationRequest {
            prompt,
            max_tokens: tokens,
            sampling: SamplingParams::default(),
            stop_token_ids: Vec::new(),
            namespace: Vec::new(),
            owner: None,
            return_logits: false,
            forks: Vec::new(),
            events: tx,
        })
        .await?;
    let mut times = Vec::with_capacity(tokens);
    loop {
        match rx.recv().await {
            Some(GenerationEvent::Token { .. }) => times.push(Instant::now()),
            Some(GenerationEvent::Saved(_) | GenerationEvent::Admitted { .. }) => {}
            Some(GenerationEvent::Finished { .. }) => return Ok(times),
            Some(GenerationEvent::Error(e)) => anyhow::bail!("engine error: {e}"),
            None => anyhow::bail!("the engine dropped the request"),
        }
    }
}
