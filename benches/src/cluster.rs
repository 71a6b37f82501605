//! `kvfabric bench cluster`: a 3-node cluster in this process (static peers
//! on loopback, each node with its own gRPC server, directory shard and
//! transfer engine over tcp), measuring
//! - `lookup128_p50_us` / `lookup128_p99_us`: a 128-block prefix Lookup sent
//!   to node C through its gRPC API, blocks held by A, entries spread over the
//!   three owners (one batched Locate per owner, in parallel);
//! - `remote_get_gbps`: C reading 1.5 MiB blocks held by A through the
//!   batched fabric path the connector loads through (`--batch` blocks by
//!   [`ClusterNode::lease_many`] then [`ClusterNode::read_leased`]: one Locate
//!   per owner, one LeaseMany at the holder, one transfer batch of READs into
//!   a registered destination, xxh3 verify of every block in place,
//!   background release), `--concurrency` batches in flight;
//! - `tcp_gbps`: the same engines moving the same 1.5 MiB ranges of A's RAM
//!   arena with plain transfer READs, in batches of the same size, same
//!   concurrency, in the same run;
//! - `remote_get_ratio` = remote_get_gbps / tcp_gbps (target >= 0.8);
//! - `remote_get_single_gbps` / `tcp_single_gbps` / `remote_get_single_ratio`:
//!   the same with one block per read ([`ClusterNode::get_into`]: locate,
//!   lease, one READ, verify) against single-op transfer batches.
//!
//! Every block is read once and compared byte for byte with what A stored
//! before the timed runs; during them every block is xxh3-verified.
//! Bandwidths are GB/s (1e9 bytes/s).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use futures::StreamExt;
use kvfabric_node::cluster::{client, ClusterConfig, ClusterNode};
use kvfabric_node::NodeServer;
use kvfabric_store::{
    KeyChain, KvLayout, ModelFingerprint, NodeConfig, PutOptions, Registry, Store,
};
use serde_json::{json, Value};

mod args;
mod reads;
use args::layout;
pub use args::ClusterArgs;
use reads::Reads;

/// Run the bench and print its report.
pub fn run(args: &ClusterArgs) -> anyhow::Result<()> {
    let args = args.clone();
    crate::on_own_runtime(move |rt| {
        let json = args.json;
        let report = crate::on_worker(rt, async move { measure(&args).await })?;
        crate::print_report(json, &report, print_table)
    })
}

struct Started {
    nodes: Vec<Arc<ClusterNode>>,
    /// The servers run until these drop (with the cluster).
    _stops: Vec<tokio::sync::oneshot::Sender<()>>,
}

async fn start_cluster(ram: u64) -> anyhow::Result<Started> {
    let started = start_loopback(&[("a", ram), ("b", ram), ("c", ram)], None).await?;
    let (nodes, _stops) = started.into_iter().map(|n| (n.node, n.stop)).unzip();
    Ok(Started { nodes, _stops })
}

/// One node of [`start_loopback`]: dropping `stop` ends its server.
pub(crate) struct LoopbackNode {
    pub node: Arc<ClusterNode>,
    pub stop: tokio::sync::oneshot::Sender<()>,
}

/// Start in-process cluster nodes on loopback (static peers, tcp transfer),
/// one `(id, ram bytes)` each, and wait until every node sees all of them.
/// `reconcile_interval_ms` overrides the default period when set.
pub(crate) async fn start_loopback(
    specs: &[(&str, u64)],
    reconcile_interval_ms: Option<u64>,
) -> anyhow::Result<Vec<LoopbackNode>> {
    let mut ports = Vec::new();
    for _ in specs {
        ports.push((
            kvfabric_testbed::ports::free_loopback_port()?,
            kvfabric_testbed::ports::free_loopback_port()?,
        ));
    }
    let peers: Vec<String> = specs
        .iter()
        .zip(&ports)
        .map(|((id, _), (g, t))| format!("{id}=127.0.0.1:{g}=127.0.0.1:{t}"))
        .collect();
    let mut nodes = Vec::new();
    for ((id, ram), (g, t)) in specs.iter().zip(&ports) {
        let cfg = NodeConfig {
            node_id: (*id).into(),
            ram_capacity: bytesize::ByteSize::b(*ram),
            ..NodeConfig::default()
        };
        let mut registry = Registry::default();
        let store = Store::open(cfg, &mut registry)?;
        let defaults = ClusterConfig::default();
        let cluster = ClusterConfig {
            peers: peers.clone(),
            transfer_listen: format!("127.0.0.1:{t}"),
            transfer_transport: "tcp".into(),
            probe_interval_ms: 200,
            reconcile_interval_ms: reconcile_interval_ms.unwrap_or(defaults.reconcile_interval_ms),
            ..defaults
        };
        let grpc = tokio::net::TcpListener::bind(("127.0.0.1", *g)).await?;
        let http = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let node = ClusterNode::start(store, cluster, grpc.local_addr()?, &mut registry).await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            NodeServer::cluster(node.clone(), registry, grpc, http).serve(async {
                let _ = stopped.await;
            }),
        );
        nodes.push(LoopbackNode { node, stop });
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while nodes
        .iter()
        .any(|n| n.node.view().nodes.len() < specs.len())
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the {} nodes did not see each other within 10 s",
            specs.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(nodes)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn measure(args: &ClusterArgs) -> anyhow::Result<Value> {
    let ram = ((args.blocks * args.block_bytes) as u64 * 2).max(256 << 20);
    let cluster = start_cluster(ram).await?;
    let (a, c) = (cluster.nodes[0].clone(), cluster.nodes[2].clone());
    let lat = lookup_latencies(&a, &c, args.lookups).await?;
    let reads = Reads::prepare(args, a, c).await?;
    reads.check().await?;
    let (batch, concurrency) = (reads.batch, args.concurrency.max(1));
    let batches: Vec<usize> = (0..reads.keys.len().div_ceil(batch)).collect();
    let singles: Vec<usize> = (0..reads.keys.len()).collect();

    // The four runs take turns, ROUNDS times, so load from elsewhere on the
    // machine weighs on all of them alike.
    const ROUNDS: u32 = 3;
    let slice = Duration::from_secs(args.seconds) / ROUNDS;
    let mut meters = [Meter::default(); 4];
    for _ in 0..ROUNDS {
        meters[0].add(throughput(slice, concurrency, &batches, |b| reads.remote_batched(b)).await?);
        meters[1].add(
            throughput(slice, concurrency, &batches, |b| reads.tcp(batch, b))
                .await
                .context("tcp baseline")?,
        );
        meters[2].add(throughput(slice, concurrency, &singles, |i| reads.remote_single(i)).await?);
        meters[3].add(
            throughput(slice, concurrency, &singles, |b| reads.tcp(1, b))
                .await
                .context("tcp single-op baseline")?,
        );
    }
    let [remote_gbps, tcp_gbps, remote_single_gbps, tcp_single_gbps] = meters.map(|m| m.gbps());
    let ratio = |x: f64, y: f64| if y > 0.0 { x / y } else { 0.0 };
    let single = single_get_latencies(&reads, args.single_gets).await?;
    let (single_p50, single_p99) = (percentile(&single, 0.5), percentile(&single, 0.99));
    let mooncake = mooncake_store(args).await?;
    let mc = |k: &str| mooncake[k].as_f64();
    let mc_ratio = crate::mooncake::ratio;

    Ok(json!({
        "nodes": 3,
        "lookup_blocks": 128,
        "lookup128_p50_us": percentile(&lat, 0.50),
        "lookup128_p99_us": percentile(&lat, 0.99),
        "block_bytes": reads.block_bytes,
        "concurrency": concurrency,
        "batch": batch,
        "remote_get_gbps": remote_gbps,
        "tcp_gbps": tcp_gbps,
        "remote_get_ratio": ratio(remote_gbps, tcp_gbps),
        "remote_get_single_gbps": remote_single_gbps,
        "tcp_single_gbps": tcp_single_gbps,
        "remote_get_single_ratio": ratio(remote_single_gbps, tcp_single_gbps),
        "remote_get_single_p50_us": single_p50,
        "remote_get_single_p99_us": single_p99,
        "transport": "tcp",
        "mooncake_remote_get_gbps": mooncake["remote_get_gbps"],
        "mooncake_single_get_p50_us": mooncake["single_get_p50_us"],
        "mooncake_single_get_p99_us": mooncake["single_get_p99_us"],
        "remote_get_vs_mooncake": mc_ratio(Some(remote_gbps), mc("remote_get_gbps")),
        "single_get_p50_vs_mooncake": mc_ratio(Some(single_p50), mc("single_get_p50_us")),
        "single_get_p99_vs_mooncake": mc_ratio(Some(single_p99), mc("single_get_p99_us")),
        "mooncake": mooncake,
    }))
}

/// Latencies (us, sorted) of `n` single-block remote gets, one at a time
/// (locate, lease, one READ, verify), after 20 untimed.
async fn single_get_latencies(reads: &Reads, n: usize) -> anyhow::Result<Vec<f64>> {
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t = Instant::now();
        reads.remote_single(i % reads.keys.len()).await?;
        if i >= 20 {
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    lat.sort_by(|x, y| x.total_cmp(y));
    Ok(lat)
}

/// Mooncake Store with the same blocks, on a blocking thread: its report.
async fn mooncake_store(args: &ClusterArgs) -> anyhow::Result<Value> {
    if args.no_mooncake {
        return Ok(crate::mooncake::unavailable("left out (--no-mooncake)"));
    }
    let job = crate::mooncake::store::StoreJob {
        blocks: args.blocks.max(8),
        block_bytes: args.block_bytes,
        threads: 8,
        batch: args.batch.max(1),
        rounds: 3,
        latency_iters: args.single_gets.max(1),
    };
    Ok(tokio::task::spawn_blocking(move || crate::mooncake::store::report(&job)).await?)
}

/// Latencies (us, sorted) of looking up a 128-block prefix held by `a`
/// from `c`, `lookups` times after 20 warm-up lookups.
async fn lookup_latencies(
    a: &ClusterNode,
    c: &ClusterNode,
    lookups: usize,
) -> anyhow::Result<Vec<f64>> {
    // 128-block prefix held by A; directory entries spread over a, b, c.
    let small = KvLayout {
        head_dim: 16,
        ..layout(4096)
    };
    let chain = KeyChain::new(b"bench", &ModelFingerprint::new(&[1; 32], "llama"), &small);
    let tokens: Vec<u32> = (0..128 * 64).collect();
    let prefix = chain.keys(&tokens);
    let small_block = vec![7u8; small.block_bytes()];
    for k in &prefix {
        a.store()
            .put(*k, small, &small_block, PutOptions::default())?;
    }
    a.sync().await;
    let mut cc = client::connect(&c.info().grpc_addr, Duration::from_secs(5)).await?;
    let req = kvfabric_proto::v1::LookupRequest {
        keys: prefix.iter().map(|k| k.as_bytes().to_vec()).collect(),
        with_holders: true,
    };
    let mut lat = Vec::with_capacity(lookups);
    for i in 0..lookups + 20 {
        let t = Instant::now();
        let r = cc
            .lookup(req.clone())
            .await
            .map_err(|s| anyhow!("lookup: {s}"))?
            .into_inner();
        let us = t.elapsed().as_secs_f64() * 1e6;
        anyhow::ensure!(
            r.prefix_blocks == 128,
            "lookup found {} of 128 blocks",
            r.prefix_blocks
        );
        if i >= 20 {
            lat.push(us);
        }
    }
    lat.sort_by(|x, y| x.total_cmp(y));
    Ok(lat)
}

/// Bytes moved and seconds spent, summed over rounds.
#[derive(Clone, Copy, Default)]
struct Meter {
    bytes: u64,
    secs: f64,
}

impl Meter {
    fn add(&mut self, (bytes, secs): (u64, f64)) {
        self.bytes += bytes;
        self.secs += secs;
    }

    /// GB/s (1e9 bytes/s).
    fn gbps(&self) -> f64 {
        if self.secs > 0.0 {
            self.bytes as f64 / self.secs / 1e9
        } else {
            0.0
        }
    }
}

/// Run `op` over `items` round-robin with `concurrency` in flight for `dur`:
/// (bytes moved, seconds taken).
async fn throughput<T, F, Fut>(
    dur: Duration,
    concurrency: usize,
    items: &[T],
    op: F,
) -> anyhow::Result<(u64, f64)>
where
    T: Copy,
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<u64>>,
{
    anyhow::ensure!(!items.is_empty(), "nothing to read");
    let start = Instant::now();
    let mut bytes = 0u64;
    let mut next = 0usize;
    let mut inflight = futures::stream::FuturesUnordered::new();
    loop {
        while inflight.len() < concurrency.max(1) && start.elapsed() < dur {
            inflight.push(op(items[next % items.len()]));
            next += 1;
        }
        match inflight.next().await {
            Some(r) => bytes += r?,
            None => break,
        }
    }
    Ok((bytes, start.elapsed().as_secs_f64()))
}

fn print_table(r: &Value) {
    println!(
        "kvfabric bench cluster (3 nodes in-process, loopback, tcp transport, batches of {})",
        r["batch"]
    );
    for k in [
        "lookup128_p50_us",
        "lookup128_p99_us",
        "remote_get_gbps",
        "tcp_gbps",
        "remote_get_ratio",
        "remote_get_single_gbps",
        "tcp_single_gbps",
        "remote_get_single_ratio",
        "remote_get_single_p50_us",
        "remote_get_single_p99_us",
        "mooncake_remote_get_gbps",
        "remote_get_vs_mooncake",
        "mooncake_single_get_p50_us",
        "single_get_p50_vs_mooncake",
    ] {
        println!("{k:<28} {:>10.3}", r[k].as_f64().unwrap_or(f64::NAN));
    }
    if let Some(why) = r["mooncake"]["reason"].as_str() {
        println!("mooncake: {} ({why})", r["mooncake"]["status"]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(seconds: u64, blocks: usize, lookups: usize) -> ClusterArgs {
        ClusterArgs {
            json: true,
            lookups,
            block_bytes: 3 << 19,
            blocks,
            concurrency: 4,
            batch: 4,
            seconds,
            single_gets: 50,
            no_mooncake: false,
        }
    }

    fn check(r: &Value) {
        for k in [
            "lookup128_p50_us",
            "lookup128_p99_us",
            "remote_get_gbps",
            "tcp_gbps",
            "remote_get_ratio",
            "remote_get_single_gbps",
            "tcp_single_gbps",
            "remote_get_single_ratio",
        ] {
            let v = r[k].as_f64().unwrap_or(-1.0);
            assert!(v > 0.0, "{k} = {v} in {r}");
        }
        assert!(r["lookup128_p99_us"].as_f64() >= r["lookup128_p50_us"].as_f64());
        assert!(r["remote_get_single_p99_us"].as_f64() >= r["remote_get_single_p50_us"].as_f64());
        check_mooncake(r);
    }

    /// Mooncake's figures: all there and positive when it ran, else the
    /// reason it did not (never a failed bench).
    fn check_mooncake(r: &Value) {
        let mc = &r["mooncake"];
        match mc["status"].as_str() {
            Some("ok") => {
                for k in [
                    "mooncake_remote_get_gbps",
                    "mooncake_single_get_p50_us",
                    "remote_get_vs_mooncake",
                    "single_get_p50_vs_mooncake",
                ] {
                    let v = r[k].as_f64().unwrap_or(-1.0);
                    assert!(v > 0.0 && v.is_finite(), "{k} = {v} in {r}");
                }
                assert!(mc["single_get_p99_us"].as_f64() >= mc["single_get_p50_us"].as_f64());
                assert!(
                    mc["loopback_connections_checked"].as_u64() > Some(0),
                    "{mc}"
                );
            }
            Some("unavailable") => {
                assert!(mc["reason"].as_str().is_some_and(|s| !s.is_empty()), "{mc}");
                assert!(r["remote_get_vs_mooncake"].is_null());
            }
            _ => panic!("mooncake failed: {mc}"),
        }
    }

    /// Smoke run: every figure is measured and positive (no timing asserted).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_bench_measures_every_figure() {
        let r = measure(&args(1, 8, 50)).await.unwrap();
        println!("{r}");
        check(&r);
    }

    /// The full bench with default arguments (`-- --ignored --nocapture` prints the report).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore]
    async fn cluster_bench_full() {
        let d = ClusterArgs {
            json: true,
            lookups: 500,
            block_bytes: 3 << 19,
            blocks: 64,
            concurrency: 4,
            batch: 8,
            seconds: 3,
            single_gets: 200,
            no_mooncake: false,
        };
        let r = measure(&d).await.unwrap();
        println!("{r}");
        check(&r);
    }
}
