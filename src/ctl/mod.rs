//! `kvfabric ctl`: operate a cluster through any node's gRPC API.
//!
//! One file per group of subcommands: `status.rs` (`status`, `watch`),
//! `top.rs` (`top`, a live view refreshed in place), `capacity.rs`
//! (`capacity`, the planner's miss-ratio curves), `blocks.rs` (`lookup`,
//! `pin`, `unpin`, `evict` and how they pick blocks: `--model GGUF` with
//! `--prompt TEXT` or `--tokens FILE`, or `--tokens FILE` with
//! `--model-fingerprint HEX --layers --kv-heads --head-dim [--dtype]`, or
//! `--keys HEX,...`); what they share (the client, the API key on each
//! request, tier names) is in `rpc.rs`. Every subcommand takes `--json`: one JSON object (per
//! refresh, for `watch` and `top`) carrying every field its table shows.
//! A node with a tenants file needs `--api-key` (a `trusted` tenant's key
//! sees keys as computed; docs/SECURITY.md); a tenant's engine blocks live
//! under `--namespace tenant:<namespace>`. A secured node (mutual TLS) needs
//! a certificate of its cluster CA, given as a node's is: `--tls-cert`,
//! `--tls-key`, `--tls-ca` (`KVFABRIC_TLS_*`, or `[cluster.security]` of the
//! `--config` file), loaded by the store's one loader
//! (`cluster::security::load_client`); without one, a secured node's refusal
//! is reported as the missing setting, not as a transport error (and a
//! certificate given for a plaintext node as the extra one).
//!
//! The ratios, one meaning each (docs/OPERATIONS.md, "ctl"):
//! - **lookup hit ratio** of a node: of the blocks its clients looked up
//!   (prefix lookups it answered, cluster-wide), the share found anywhere
//!   in the cluster (`kvfabric_store_lookup_hit_blocks_total` over hit +
//!   miss);
//! - **served**: blocks this node served to peers (leased to remote
//!   readers, `kvfabric_holder_leased_blocks_total`);
//! - **tier hits**: reads of a tier of this node, for its own clients and
//!   for peers alike (`kvfabric_store_hits_total{tier}`).

mod blocks;
mod capacity;
mod rpc;
mod status;
mod top;

use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use kvfabric_node::cluster::{client, security, ClusterConfig};

use crate::node::{ClusterFlags, SecurityFlags};

/// `kvfabric ctl` flags.
#[derive(Args, Debug)]
pub struct CtlCmd {
    /// gRPC address of any node of the cluster.
    #[arg(long, default_value = "127.0.0.1:50051", value_name = "HOST:PORT")]
    pub addr: String,
    /// Timeout of each request, in milliseconds.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    pub timeout_ms: u64,
    /// API key sent as `authorization: Bearer <key>` (nodes with a tenants file).
    #[arg(
        long,
        env = "KVFABRIC_API_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// The client certificate for a secured cluster (same keys as a node's).
    #[command(flatten)]
    pub security: SecurityFlags,
    #[command(subcommand)]
    pub action: CtlAction,
}

/// What `kvfabric ctl` does.
#[derive(Subcommand, Debug)]
pub enum CtlAction {
    /// Nodes, tiers, capacity, use, blocks, lookup hit ratio, blocks served, tier hits.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the status every --interval-ms, --count times.
    Watch {
        #[arg(long, default_value_t = 2000, value_name = "MS")]
        interval_ms: u64,
        #[arg(long, default_value_t = 10)]
        count: u32,
        /// Print one JSON object per line instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Live view of nodes, tiers, lookup hit ratio and transfer GB/s, redrawn in place.
    Top {
        #[arg(long, default_value_t = 2000, value_name = "MS")]
        interval_ms: u64,
        /// Refreshes before exiting; 0 = until interrupted.
        #[arg(long, default_value_t = 0)]
        count: u32,
        /// Print one JSON object per refresh, one per line, instead of redrawing.
        #[arg(long)]
        json: bool,
    },
    /// How many leading tokens of a prompt are cached, and on which nodes.
    Lookup {
        #[command(flatten)]
        blocks: blocks::BlockSelect,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Pin blocks (hard, or soft with --ttl-ms) on every node holding them.
    Pin {
        #[command(flatten)]
        blocks: blocks::BlockSelect,
        /// Soft pin for this long; 0 = hard pin.
        #[arg(long, default_value_t = 0, value_name = "MS")]
        ttl_ms: u64,
        /// Print JSON instead of a line.
        #[arg(long)]
        json: bool,
    },
    /// Remove pins of blocks on every node holding them.
    Unpin {
        #[command(flatten)]
        blocks: blocks::BlockSelect,
        /// Print JSON instead of a line.
        #[arg(long)]
        json: bool,
    },
    /// The node's capacity planner: its token hit ratio at 0.25x..4x each tier.
    Capacity {
        /// Print JSON (the shape of GET /api/v1/capacity) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Drop blocks from every tier of every node.
    Evict {
        #[command(flatten)]
        blocks: blocks::BlockSelect,
        /// Print JSON instead of a line.
        #[arg(long)]
        json: bool,
    },
}

/// Run one ctl command; `file` is the `--config` file (its `[cluster.security]`).
pub fn run(mut cmd: CtlCmd, file: Option<&std::path::Path>) -> anyhow::Result<()> {
    let flags = ClusterFlags {
        security: std::mem::take(&mut cmd.security),
        ..ClusterFlags::default()
    };
    let cluster: ClusterConfig = crate::config::load("cluster", file, &flags)?;
    let identity = security::load_client(&cluster.security)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let timeout = Duration::from_millis(cmd.timeout_ms);
        let addr = cmd.addr.clone();
        let done = run_async(cmd, identity.as_deref()).await;
        if done.is_err() {
            // A TLS mismatch shows in the failed call only as "transport
            // error": say which setting is missing or extra.
            client::check_tls(&addr, timeout, identity.is_some()).await?;
        }
        done
    })
}

async fn run_async(
    cmd: CtlCmd,
    identity: Option<&kvfabric_transfer::security::NodeIdentity>,
) -> anyhow::Result<()> {
    let timeout = Duration::from_millis(cmd.timeout_ms);
    let mut c = client::connect_with(&cmd.addr, timeout, identity)
        .await
        .with_context(|| format!("cannot reach a node at {}", cmd.addr))?;
    let key = cmd.api_key.as_deref();
    let c = &mut c;
    match cmd.action {
        CtlAction::Status { json } => status::print(&status::fetch(c, key).await?, json),
        CtlAction::Watch {
            interval_ms,
            count,
            json,
        } => status::watch(c, key, Duration::from_millis(interval_ms), count, json).await?,
        CtlAction::Top {
            interval_ms,
            count,
            json,
        } => top::run(c, key, Duration::from_millis(interval_ms), count, json).await?,
        CtlAction::Lookup { blocks, json } => blocks::lookup(c, key, &blocks, json).await?,
        CtlAction::Pin {
            blocks,
            ttl_ms,
            json,
        } => blocks::pin(c, key, &blocks, ttl_ms, json).await?,
        CtlAction::Unpin { blocks, json } => blocks::unpin(c, key, &blocks, json).await?,
        CtlAction::Evict { blocks, json } => blocks::evict(c, key, &blocks, json).await?,
        CtlAction::Capacity { json } => capacity::run(c, key, json).await?,
    }
    Ok(())
}
