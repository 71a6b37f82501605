//! The arguments of `kvfabric bench cluster` and the block layout its runs
//! store (shared by the bench's phases, so they live beside them, not in
//! the bench's root module).

use kvfabric_store::{BlockOrder, DType, KvLayout};

/// Arguments of `kvfabric bench cluster`.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Lookups of the 128-block prefix measured.
    #[arg(long, default_value_t = 500)]
    pub lookups: usize,
    /// Bytes per block in the remote get run (default 1.5 MiB).
    #[arg(long, default_value_t = 3 << 19)]
    pub block_bytes: usize,
    /// Distinct blocks A holds for the remote get run.
    #[arg(long, default_value_t = 64)]
    pub blocks: usize,
    /// Reads (batches, in the batched runs) in flight in the remote get and tcp runs.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Blocks per batched remote get (and per tcp batch of the baseline).
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Seconds per throughput measurement.
    #[arg(long, default_value_t = 3)]
    pub seconds: u64,
    /// Single-block remote gets timed one at a time (p50/p99 latency; Mooncake's too).
    #[arg(long, default_value_t = 200)]
    pub single_gets: usize,
    /// Leave Mooncake Store out (it is measured by default when its venv is
    /// there or can be installed: scripts/mooncake-env.sh).
    #[arg(long)]
    pub no_mooncake: bool,
}

pub(super) fn layout(block_bytes: usize) -> KvLayout {
    // 2 layers x K,V x 64 tokens x 1 head x head_dim f16 = block_bytes.
    KvLayout {
        layers: 2,
        kv_heads: 1,
        head_dim: (block_bytes / (2 * 2 * 64 * 2)).max(1) as u32,
        dtype: DType::F16,
        block_tokens: 64,
        order: BlockOrder::LayerKvTokenHead,
    }
}
