//! `kvfabric bench store`: the node store against real peers, same run.
//!
//! - RAM tier: in-process put/get of 1.5 MiB blocks vs memcpy of the same bytes;
//!   and with the capacity planner sampling vs off (`store/sampling.rs`).
//! - Disk tier: 1.5 MiB writes (write-through puts) and reads (promotions from a
//!   cold store) from `clients` threads vs `fio --ioengine=io_uring --direct=1`
//!   with the same block size and queue depth on the same filesystem, in
//!   interleaved rounds (6; ratios are the median of each round's ratio;
//!   `store/disk.rs`).
//! - Redis: redis-server started here on loopback (persistence off), 1.5 MiB
//!   values, `clients` concurrent clients, SET then GET; kvfabric over gRPC the same way.
//!   Redis, gRPC and the data path run in interleaved rounds (best of 3 each).
//! - Data path (tcp, shm): `clients` tasks each lease a block and READ it from
//!   the store's RAM arena (a registered segment) through the transfer engine.
//!
//! `--metadata-scale` runs instead the metadata-scale report: what the
//! store's bookkeeping costs per op at 10k and at 1M resident blocks, one
//! section per part (`store/metadata.rs`: "policy", the eviction orders;
//! `store/reconcile.rs`: "directory_sync", the cluster directory's sync).

mod disk;
mod grpc;
mod metadata;
mod reconcile;
mod redis;
mod sampling;
mod shared;
#[cfg(feature = "cuda")]
mod vram;

pub use reconcile::{SyncBenchArgs, SyncReport};

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use kvfabric_store::{BlockKey, NodeConfig, PutOptions, Registry, Store};
use serde_json::{json, Value};

use shared::{block_data, gbps, key, layout, pct_ms, BLOCK, ROUNDS};

/// Flags of `kvfabric bench store`.
#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Directory for the disk-tier and fio files [default: a temp dir under $TMPDIR].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Blocks per phase (1.5 MiB each).
    #[arg(long, default_value_t = 128)]
    pub blocks: usize,
    /// Blocks per disk phase (1.5 MiB each; the bench's blocks, repeated
    /// under distinct keys). 512 (768 MiB) makes a phase ~0.3 s: with 128 a
    /// phase took ~80 ms and thread start-up and the last wave's partial
    /// depth moved the ratio against fio by 10-20% between runs.
    #[arg(long, default_value_t = 512)]
    pub disk_blocks: usize,
    /// Concurrent clients / disk queue depth.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Tiers to measure: `ram` (the RAM and disk tiers against memcpy, fio,
    /// Redis and the data paths: the report without this flag) and `vram`
    /// (the VRAM tier against plain cudaMemcpy on the GPU; needs a build with
    /// the `cuda` feature and a CUDA device).
    #[arg(long, value_delimiter = ',')]
    pub tiers: Vec<BenchTier>,
    /// `--tiers vram`: the staging pool's slices, slice size and per-copy
    /// depth [default: the node config's, docs/CONFIG.md].
    #[arg(long)]
    pub vram_staging_slots: Option<u32>,
    #[arg(long)]
    pub vram_staging_slice: Option<bytesize::ByteSize>,
    #[arg(long)]
    pub vram_staging_depth: Option<u32>,
    /// `--tiers vram`: where promotions are checked (`vram_verify`).
    #[arg(long, value_enum, default_value_t = VerifyArg::Device)]
    pub vram_verify: VerifyArg,
    /// Report the metadata-scale figures (ops/s at each of
    /// `--metadata-blocks` resident blocks) instead of the data-path ones.
    #[arg(long)]
    pub metadata_scale: bool,
    /// Resident-block counts of the metadata-scale report (4 KiB blocks).
    #[arg(long, value_delimiter = ',', default_values_t = [10_000, 1_000_000])]
    pub metadata_blocks: Vec<usize>,
    /// Timed ops per policy and resident-block count in the metadata-scale report.
    #[arg(long, default_value_t = 200_000)]
    pub metadata_ops: usize,
    /// Sections of the metadata-scale report to run: `policy` (the eviction
    /// orders), `sync` (the cluster directory's sync; the slow one).
    #[arg(long, value_delimiter = ',', default_values_t = [MetadataPart::Policy, MetadataPart::Sync])]
    pub metadata_parts: Vec<MetadataPart>,
    /// Eviction orders of the metadata-scale report's "policy" section.
    #[arg(long, value_delimiter = ',', default_values_t = [MetadataPolicy::Lru, MetadataPolicy::S3fifo, MetadataPolicy::Lirs])]
    pub metadata_policies: Vec<MetadataPolicy>,
    /// Leave Mooncake Store out (it is measured by default when its venv is
    /// there or can be installed: scripts/mooncake-env.sh).
    #[arg(long)]
    pub no_mooncake: bool,
}

/// A tier section of `bench store`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchTier {
    Ram,
    Vram,
}

/// `--vram-verify`: the node config's `vram_verify`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyArg {
    /// The GPU hashes a promoted block in VRAM.
    Device,
    /// The CPU hashes the RAM copy while its DMA runs.
    Host,
}

/// An eviction order of the metadata-scale report's "policy" section.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataPolicy {
    Lru,
    S3fifo,
    Lirs,
    /// The default order (LIRS or LRU by shadow caches). The bench drives
    /// the order without the store's lookups, so its shadows see the puts
    /// only: the upkeep of both orders and of the shadows' puts.
    Adaptive,
    /// LRU behind a doorkeeper (`policy::door`).
    Door,
}

impl MetadataPolicy {
    fn eviction(self) -> kvfabric_store::EvictionPolicy {
        match self {
            MetadataPolicy::Lru => kvfabric_store::EvictionPolicy::Lru,
            MetadataPolicy::S3fifo => kvfabric_store::EvictionPolicy::S3fifo,
            MetadataPolicy::Lirs => kvfabric_store::EvictionPolicy::Lirs,
            MetadataPolicy::Adaptive => kvfabric_store::EvictionPolicy::Adaptive,
            MetadataPolicy::Door => kvfabric_store::EvictionPolicy::Door,
        }
    }
}

impl std::fmt::Display for MetadataPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MetadataPolicy::Lru => "lru",
            MetadataPolicy::S3fifo => "s3fifo",
            MetadataPolicy::Lirs => "lirs",
            MetadataPolicy::Adaptive => "adaptive",
            MetadataPolicy::Door => "door",
        })
    }
}

/// A section of the metadata-scale report.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataPart {
    /// "policy": insert + evict ops/s of a RAM tier per eviction order.
    Policy,
    /// "directory_sync": the cluster directory's sync.
    Sync,
}

impl std::fmt::Display for MetadataPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MetadataPart::Policy => "policy",
            MetadataPart::Sync => "sync",
        })
    }
}

impl Default for StoreArgs {
    fn default() -> Self {
        StoreArgs {
            json: false,
            dir: None,
            blocks: 128,
            disk_blocks: 512,
            clients: 8,
            tiers: Vec::new(),
            vram_staging_slots: None,
            vram_staging_slice: None,
            vram_staging_depth: None,
            vram_verify: VerifyArg::Device,
            metadata_scale: false,
            metadata_blocks: vec![10_000, 1_000_000],
            metadata_ops: 200_000,
            metadata_parts: vec![MetadataPart::Policy, MetadataPart::Sync],
            metadata_policies: vec![
                MetadataPolicy::Lru,
                MetadataPolicy::S3fifo,
                MetadataPolicy::Lirs,
            ],
            no_mooncake: false,
        }
    }
}

/// Measure everything and return the report object.
pub fn measure(args: &StoreArgs) -> anyhow::Result<Value> {
    let n = args.blocks.max(args.clients).max(8);
    let tmp = match &args.dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let sources: Vec<Vec<u8>> = (0..n).map(block_data).collect();
    let mut report = serde_json::Map::new();
    if args.tiers.contains(&BenchTier::Vram) {
        report.extend(vram_section(&sources, args)?);
        if !args.tiers.contains(&BenchTier::Ram) {
            return Ok(Value::Object(report));
        }
    }
    ram(&sources, &mut report)?;
    sampling::sampling(&sources, &mut report)?;
    let disk_blocks = args.disk_blocks.max(args.clients);
    disk::disk(tmp.path(), &sources, disk_blocks, args.clients, &mut report)?;
    // Redis and kvfabric's three get paths, interleaved in rounds: Redis alone
    // gave 1.2-3.0 GB/s between runs minutes apart on this machine.
    for _ in 0..ROUNDS {
        let mut round = serde_json::Map::new();
        redis::redis(&sources, args.clients, &mut round)?;
        grpc::grpc(&sources, args.clients, &mut round)?;
        data_path(&sources, args.clients, &mut round)?;
        keep_best_rounds(&mut report, round);
    }
    let r = |m: &serde_json::Map<String, Value>, k: &str| {
        m.get(k).and_then(Value::as_f64).unwrap_or(0.0)
    };
    for path in ["grpc", "tcp", "shm"] {
        let vs = r(&report, &format!("{path}_get_gbps")) / r(&report, "redis_get_gbps").max(1e-9);
        report.insert(format!("{path}_vs_redis_get"), json!(vs));
    }
    mooncake(args, n, &mut report);
    report.insert("block_bytes".into(), json!(BLOCK));
    report.insert("blocks".into(), json!(n));
    report.insert("disk_blocks".into(), json!(disk_blocks));
    report.insert("clients".into(), json!(args.clients));
    Ok(Value::Object(report))
}

/// Mooncake Store with the same blocks and client threads: its figures
/// (`mooncake_*`), ours over each (`*_vs_mooncake`) and its whole report
/// (`mooncake`: status ok, or unavailable and why).
fn mooncake(args: &StoreArgs, n: usize, report: &mut serde_json::Map<String, Value>) {
    let mc = if args.no_mooncake {
        crate::mooncake::unavailable("left out (--no-mooncake)")
    } else {
        crate::mooncake::store::report(&crate::mooncake::store::StoreJob {
            blocks: n,
            block_bytes: BLOCK,
            threads: args.clients.max(1),
            batch: 8,
            rounds: ROUNDS,
            latency_iters: 200,
        })
    };
    let ours = |k: &str| report.get(k).and_then(Value::as_f64);
    let pairs = [
        ("put_vs_mooncake", "ram_put_gbps", "put_gbps"),
        ("local_get_vs_mooncake", "ram_get_gbps", "local_get_gbps"),
        (
            "tcp_get_vs_mooncake_remote_get",
            "tcp_get_gbps",
            "remote_get_gbps",
        ),
    ];
    let ratios: Vec<(&str, Value)> = pairs
        .iter()
        .map(|(name, o, t)| (*name, crate::mooncake::ratio(ours(o), mc[*t].as_f64())))
        .collect();
    for (name, r) in ratios {
        report.insert(name.into(), r);
    }
    for k in [
        "put_gbps",
        "local_get_gbps",
        "remote_get_gbps",
        "single_get_p50_us",
        "single_get_p99_us",
    ] {
        report.insert(format!("mooncake_{k}"), mc[k].clone());
    }
    report.insert("mooncake".into(), mc);
}

#[cfg(feature = "cuda")]
fn vram_section(
    sources: &[Vec<u8>],
    args: &StoreArgs,
) -> anyhow::Result<serde_json::Map<String, Value>> {
    vram::vram(sources, args)
}

#[cfg(not(feature = "cuda"))]
fn vram_section(
    _sources: &[Vec<u8>],
    _args: &StoreArgs,
) -> anyhow::Result<serde_json::Map<String, Value>> {
    bail!("--tiers vram needs a build with the `cuda` feature (cargo build --release --features cuda)")
}

/// The peer/path prefixes of the interleaved comparison: each one's figures
/// (throughputs and latencies) come from its own best round by get GB/s.
const PATHS: [&str; 4] = ["redis", "grpc", "tcp", "shm"];

/// Merge `round` into `best`: per path, the round with the higher get GB/s.
fn keep_best_rounds(
    best: &mut serde_json::Map<String, Value>,
    round: serde_json::Map<String, Value>,
) {
    let get = |m: &serde_json::Map<String, Value>, p: &str| {
        m.get(&format!("{p}_get_gbps")).and_then(Value::as_f64)
    };
    for p in PATHS {
        if get(&round, p).unwrap_or(0.0) > get(best, p).unwrap_or(-1.0) {
            let prefix = format!("{p}_");
            for (k, v) in round.iter().filter(|(k, _)| k.starts_with(&prefix)) {
                best.insert(k.clone(), v.clone());
            }
        }
    }
}

/// The metadata-scale report: one section per part of the store's bookkeeping.
pub fn measure_metadata(args: &StoreArgs) -> anyhow::Result<Value> {
    let mut report = serde_json::Map::new();
    if args.metadata_parts.contains(&MetadataPart::Policy) {
        let policies: Vec<_> = args
            .metadata_policies
            .iter()
            .map(|p| p.eviction())
            .collect();
        let policy = metadata::policy(&args.metadata_blocks, args.metadata_ops, &policies)?;
        report.insert("policy".into(), policy);
    }
    if args.metadata_parts.contains(&MetadataPart::Sync) {
        let sync = reconcile::measure(&SyncBenchArgs {
            scales: args.metadata_blocks.clone(),
            ..SyncBenchArgs::default()
        })?;
        report.insert("directory_sync".into(), serde_json::to_value(sync)?);
    }
    Ok(Value::Object(report))
}

/// `kvfabric bench store`.
pub fn run(args: &StoreArgs) -> anyhow::Result<()> {
    let report = if args.metadata_scale {
        measure_metadata(args)?
    } else {
        measure(args)?
    };
    crate::print_report(args.json, &report, |report| {
        if let Value::Object(m) = report {
            println!("{:<24} value", "metric");
            for (k, v) in m {
                println!("{k:<24} {v}");
            }
        }
    })
}

fn ram(sources: &[Vec<u8>], out: &mut serde_json::Map<String, Value>) -> anyhow::Result<()> {
    let n = sources.len();
    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::b((n * BLOCK + (64 << 20)) as u64),
        ..Default::default()
    };
    let store = Store::open(cfg, &mut Registry::default())?;
    let mut dst = vec![0u8; BLOCK];
    let mut dsts: Vec<Vec<u8>> = (0..n).map(|_| vec![1u8; BLOCK]).collect();
    let keys: Vec<BlockKey> = (0..n).map(key).collect();
    // Warm-up: every block put once, then removed (the arena is populated at
    // open; this warms the allocator, the index and the sources' caches).
    for (i, s) in sources.iter().enumerate() {
        store.put(key(i), layout(), s, PutOptions::default())?;
    }
    // Best of ROUNDS rounds for every figure (the machine is shared and noisy). Each
    // round: memcpy into n warm buffers (put's peer), memcpy of the same n cold
    // sources into one buffer (get's peer), then the store's put and get.
    let (mut memcpy, mut memcpy_one, mut put, mut get) = (0f64, 0f64, 0f64, 0f64);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for (d, s) in dsts.iter_mut().zip(sources) {
            d.copy_from_slice(s);
        }
        memcpy = memcpy.max(gbps(n * BLOCK, t.elapsed()));
        let t = Instant::now();
        for s in sources {
            dst.copy_from_slice(s);
        }
        memcpy_one = memcpy_one.max(gbps(n * BLOCK, t.elapsed()));
        store.remove(&keys)?;
        let t = Instant::now();
        for (i, s) in sources.iter().enumerate() {
            store.put(key(i), layout(), s, PutOptions::default())?;
        }
        put = put.max(gbps(n * BLOCK, t.elapsed()));
        let t = Instant::now();
        for k in &keys {
            store
                .get_into(k, 0, &mut dst)?
                .context("ram block missing")?;
        }
        get = get.max(gbps(n * BLOCK, t.elapsed()));
        if dst != sources[n - 1] {
            bail!("ram tier returned wrong bytes");
        }
    }
    drop(dsts);
    let (put_ratio, get_ratio) = (put / memcpy, get / memcpy_one);
    out.insert("memcpy_gbps".into(), json!(memcpy));
    out.insert("memcpy_one_dst_gbps".into(), json!(memcpy_one));
    out.insert("ram_put_gbps".into(), json!(put));
    out.insert("ram_get_gbps".into(), json!(get));
    out.insert("ram_put_ratio".into(), json!(put_ratio));
    out.insert("ram_get_ratio".into(), json!(get_ratio));
    out.insert("ram_ratio".into(), json!(put_ratio.min(get_ratio)));
    Ok(())
}

fn data_path(
    sources: &[Vec<u8>],
    clients: usize,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    use kvfabric_transfer::{
        SharedRegion, TransferConfig, TransferEngine, TransferOp, TransportChoice,
    };
    let n = sources.len();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let cfg = NodeConfig {
            ram_capacity: bytesize::ByteSize::b((n * BLOCK + (64 << 20)) as u64),
            ..Default::default()
        };
        let store = Store::open(cfg, &mut Registry::default())?;
        for (i, s) in sources.iter().enumerate() {
            store.put(key(i), layout(), s, PutOptions::default())?;
        }
        for (name, transport) in [("tcp", TransportChoice::Tcp), ("shm", TransportChoice::Shm)] {
            let tcfg = TransferConfig {
                transport,
                ..Default::default()
            };
            let server = TransferEngine::start(tcfg.clone(), &mut Registry::default()).await?;
            let arena = server.register(store.region().clone());
            let client = Arc::new(TransferEngine::start(tcfg, &mut Registry::default()).await?);
            // Populated, as a long-lived client region (an engine's KV pool) is.
            let dst = Arc::new(SharedRegion::create_populated(
                "bench-dst",
                clients * BLOCK,
            )?);
            let local = client.register(dst.clone());
            let peer = server.local_addr().to_string();
            // Untimed: the first batch opens the connections to the peer
            // (Redis's connections are open before its timed phase too).
            let lease = store.lease(&key(0))?.context("block missing")?;
            let warm = TransferOp::read(local, 0, arena, lease.region_offset(), BLOCK as u64);
            for r in client.batch(&peer, vec![warm.with_checksum()]).await {
                r?;
            }
            drop(lease);
            let t = Instant::now();
            let tasks: Vec<_> = (0..clients)
                .map(|c| {
                    let (store, client, peer) = (store.clone(), client.clone(), peer.clone());
                    tokio::spawn(async move {
                        let mut lat = Vec::new();
                        for i in (c..n).step_by(clients) {
                            let t = Instant::now();
                            let lease = store.lease(&key(i))?.context("block missing")?;
                            let op = TransferOp::read(
                                local,
                                (c * BLOCK) as u64,
                                arena,
                                lease.region_offset(),
                                BLOCK as u64,
                            )
                            .with_checksum();
                            for r in client.batch(&peer, vec![op]).await {
                                r?;
                            }
                            drop(lease);
                            lat.push(t.elapsed());
                        }
                        Ok::<_, anyhow::Error>(lat)
                    })
                })
                .collect();
            let mut lat = Vec::new();
            for task in tasks {
                lat.extend(task.await??);
            }
            let get = gbps(n * BLOCK, t.elapsed());
            // SAFETY: all reads into `dst` have completed.
            let last = unsafe { dst.slice(0, BLOCK)? };
            let expect = (0..n).step_by(clients).next_back().unwrap_or(0);
            if last != &sources[expect][..] {
                bail!("{name} data path returned wrong bytes");
            }
            out.insert(format!("{name}_get_gbps"), json!(get));
            out.insert(format!("{name}_get_p50_ms"), json!(pct_ms(&mut lat, 0.5)));
            out.insert(format!("{name}_get_p99_ms"), json!(pct_ms(&mut lat, 0.99)));
        }
        Ok(())
    })
}
