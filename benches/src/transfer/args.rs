//! The flags of `kvfabric bench transfer` and what they configure: the
//! engines' config and, under `--security`, a node's identity. A leaf: the
//! bench's driver, its peer and its security section import it.

use std::sync::Arc;

use kvfabric_transfer::security::{NodeIdentity, SecurityConfig, SecurityMode};
use kvfabric_transfer::{TransferConfig, TransportChoice};

/// Arguments of `kvfabric bench transfer`.
#[derive(clap::Args, Debug, Clone)]
pub struct TransferArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Bytes per op in the headline throughput runs.
    #[arg(long, default_value_t = 4 << 20)]
    pub op_bytes: u64,
    /// Ops per batch in the headline throughput runs.
    #[arg(long, default_value_t = 16)]
    pub batch_ops: u64,
    /// Seconds per headline throughput measurement (iperf3 too).
    #[arg(long, default_value_t = 3)]
    pub seconds: u64,
    /// Round trips measured for the 4 KiB latency (and for the ping-pong).
    #[arg(long, default_value_t = 5000)]
    pub small_iters: usize,
    /// Op sizes of the sweep, in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [4096u64, 65536, 1 << 20, 4 << 20, 16 << 20])]
    pub sweep: Vec<u64>,
    /// Milliseconds per sweep point.
    #[arg(long, default_value_t = 500)]
    pub sweep_ms: u64,
    /// Size of the segments read from, in bytes.
    #[arg(long, default_value_t = 256 << 20)]
    pub segment_bytes: u64,
    /// Override the engine's slice size (bytes).
    #[arg(long)]
    pub slice_bytes: Option<usize>,
    /// Override the engine's connections per peer.
    #[arg(long)]
    pub connections: Option<usize>,
    /// Also measure tcp throughput in this security mode: none, authenticate or encrypt.
    #[arg(long, default_value = "none")]
    pub security: String,
    /// Measure wire compression instead of the loopback figures: tcp READs
    /// of f16 KV blocks between two test-bed hosts whose links are shaped to
    /// each of these Gbit/s in turn, with `wire_compression` off, auto and
    /// always (needs root: network namespaces and tc).
    #[arg(long, value_delimiter = ',')]
    pub wire_links: Vec<f64>,
    /// With `--wire-links`: the f16 blocks to read, a `bench kv --dump-dir`
    /// file (`f16.bin`); default: the codec's synthetic KV-like f16 sample.
    #[arg(long)]
    pub kv_blocks: Option<std::path::PathBuf>,
    /// Leave Mooncake's Transfer Engine out (it is measured by default when
    /// its venv is there or can be installed: scripts/mooncake-env.sh).
    #[arg(long)]
    pub no_mooncake: bool,
    /// Mooncake TE sweep: initiator threads.
    #[arg(long, value_delimiter = ',', default_values_t = [2u32, 4, 8])]
    pub mooncake_threads: Vec<u32>,
    /// Mooncake TE sweep: requests per batch.
    #[arg(long, value_delimiter = ',', default_values_t = [16u32, 64])]
    pub mooncake_batch: Vec<u32>,
    /// Mooncake TE sweep: bytes per request.
    #[arg(long, value_delimiter = ',', default_values_t = [65536u64, 1 << 20, 4 << 20])]
    pub mooncake_blocks: Vec<u64>,
    /// Seconds per Mooncake TE sweep point (READ and WRITE at the best
    /// point then run for `--seconds`).
    #[arg(long, default_value_t = 1)]
    pub mooncake_sweep_secs: u64,
    /// Act as the bench's remote peer, listening here (used by the bench itself).
    #[arg(long, hide = true)]
    pub peer_listen: Option<String>,
    /// The peer's certificates (with `--security`; used by the bench itself).
    #[arg(long, hide = true)]
    pub certs_dir: Option<std::path::PathBuf>,
}

/// The identity of `node` in `--certs-dir` under `--security`, if secured.
pub(super) fn identity(
    args: &TransferArgs,
    node: &str,
) -> anyhow::Result<Option<Arc<NodeIdentity>>> {
    let mode = SecurityMode::parse(&args.security)?;
    match (&args.certs_dir, mode) {
        (Some(dir), m) if m != SecurityMode::None => {
            Ok(NodeIdentity::load(&SecurityConfig::from_dir(dir, node, m))?)
        }
        _ => Ok(None),
    }
}

/// The engine config of the flags, on `transport`, listening on `listen`.
pub(super) fn config(
    args: &TransferArgs,
    transport: TransportChoice,
    listen: &str,
) -> TransferConfig {
    let mut c = TransferConfig {
        listen: listen.to_string(),
        transport,
        ..TransferConfig::default()
    };
    if let Some(s) = args.slice_bytes {
        c.slice_bytes = s;
    }
    if let Some(n) = args.connections {
        c.connections_per_peer = n;
    }
    c
}
