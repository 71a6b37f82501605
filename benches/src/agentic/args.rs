//! The arguments of `kvfabric bench agentic` (shared by the bench's
//! comparisons: routing, eviction order, KV dtype).

use std::path::PathBuf;

use kvfabric_store::DType;

/// Arguments of `kvfabric bench agentic`.
#[derive(clap::Args, Debug, Clone)]
pub struct AgenticArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// GGUF model (default: the fetched SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Engines the requests are spread over.
    #[arg(long, default_value_t = 3)]
    pub engines: usize,
    /// Concurrent agent sessions.
    #[arg(long, default_value_t = 4)]
    pub sessions: usize,
    /// Turns per session.
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// Most requests sent per second (0 = each turn as soon as it is ready).
    #[arg(long, default_value_t = 2.0)]
    pub rate: f64,
    /// Tokens generated per turn (greedy, no stop token).
    #[arg(long, default_value_t = 16)]
    pub answer_tokens: usize,
    /// Seed of the workload text and the routing.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Routing of the turns: random, least-loaded, affinity or prefix; a
    /// comma-separated list compares the modes (fabric configuration only).
    /// `prefix` needs the fabric (its index comes from the nodes' KV events):
    /// in the none/local configurations it has no index and routes as least-loaded.
    #[arg(long, value_delimiter = ',', default_value = "random")]
    pub routing: Vec<String>,
    /// `prefix` routing: weight of the prompt tokens an engine would still
    /// have to compute against the tokens it has in flight (Dynamo's
    /// overlap weight; 1 = the router's default).
    #[arg(long, default_value_t = 1.0)]
    pub prefix_overlap_weight: f64,
    /// `prefix` routing: weight of a prompt's own tokens (past the prefix
    /// other prompts share: a session's history) an engine lacks.
    #[arg(long, default_value_t = kvfabric_router::pick::DEFAULT_PREFIX_SESSION_WEIGHT)]
    pub prefix_session_weight: f64,
    /// Start every session at once (default: each session joins when the
    /// previous one's first turn is answered, so the shared system prompt is
    /// computed once before the others arrive).
    #[arg(long)]
    pub burst_start: bool,
    /// Tokens of the shared system prompt (grown tool definition by tool definition).
    #[arg(long, default_value_t = 1000)]
    pub system_tokens: usize,
    /// Tokens of context each session starts with (its earlier turns and
    /// tool output; multi-round-qa's `--user-history-prompt`, 2000 in its
    /// example: 1500 keeps the default run under 10 minutes here).
    /// 0 = sessions start from the system prompt alone.
    #[arg(long, default_value_t = 1500)]
    pub session_history_tokens: usize,
    /// Kernel threads per engine (0 = one per core).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// KV pool of each engine, MiB (512: two ~3.5k-token sessions at once).
    #[arg(long, default_value_t = 512)]
    pub kv_pool_mib: u64,
    /// RAM tier of each fabric node, MiB.
    #[arg(long, default_value_t = 1024)]
    pub node_ram_mib: u64,
    /// Sequences decoding at once in the save on/off step-time measurement.
    #[arg(long, default_value_t = 8)]
    pub step_batch: usize,
    /// Tokens each of them decodes.
    #[arg(long, default_value_t = 96)]
    pub step_tokens: usize,
    /// Save on/off measurements (alternated; the best of each is reported).
    #[arg(long, default_value_t = 3)]
    pub step_repeats: usize,
    /// Hosts (network namespaces; needs root) the fabric configuration's
    /// nodes run on, one per engine: 0 = all in this network namespace
    /// (loopback, shm), else equal to --engines (tcp between hosts).
    #[arg(long, default_value_t = 0)]
    pub hosts: usize,
    /// Rate of each host's link, Gbit/s (tbf; with --hosts).
    #[arg(long)]
    pub link_gbit: Option<f64>,
    /// Compare the RAM tier's default eviction order with this one (lru,
    /// s3fifo): only the fabric configuration, once per order, on RAM tiers
    /// holding --ram-fraction of the trace's distinct blocks, no disk.
    #[arg(long)]
    pub compare_eviction: Option<String>,
    /// With --compare-eviction: the nodes' RAM tiers together hold this
    /// fraction of the trace's distinct blocks.
    #[arg(long, default_value_t = 0.5)]
    pub ram_fraction: f64,
    /// With --compare-eviction: run the default order with
    /// `adaptive_cluster_feed = false` (its shadows fed by each node's own
    /// lookups and puts, not by the cluster's traffic).
    #[arg(long)]
    pub adaptive_node_feed: bool,
    /// With --compare-eviction: the RAM tiers' watermarks `HIGH,LOW`
    /// (default 1.0,1.0: a full tier evicts one block per put, as in
    /// `bench eviction`; a node's default is 0.95,0.85).
    #[arg(long, value_parser = crate::eviction::parse_watermarks, default_value = "1.0,1.0")]
    pub watermarks: (f64, f64),
    /// KV dtype, and the dtype comparison (`--compare-dtype`, see `dtype.rs`).
    #[command(flatten)]
    pub dtype: DtypeArgs,
}

/// The dtype flags of `bench agentic`.
#[derive(clap::Args, Debug, Clone)]
pub struct DtypeArgs {
    /// Element type of every engine's KV: f16, bf16 or f32.
    #[arg(long, default_value = "f16")]
    pub kv_dtype: DType,
    /// Also run the fabric configuration with this KV dtype, both runs at a
    /// RAM tier sized to `--compare-ram-fraction` of the trace's distinct
    /// f32 KV bytes, and report the two side by side.
    #[arg(long)]
    pub compare_dtype: Option<DType>,
    /// With --compare-dtype: the nodes' RAM tiers together, as a fraction
    /// of the trace's distinct f32 KV bytes.
    #[arg(long, default_value_t = 0.25)]
    pub compare_ram_fraction: f64,
}

impl Default for DtypeArgs {
    fn default() -> Self {
        DtypeArgs {
            kv_dtype: DType::F16,
            compare_dtype: None,
            compare_ram_fraction: 0.25,
        }
    }
}

impl DtypeArgs {
    /// Refuse a comparison that cannot run, before the model loads.
    pub fn check(&self, hosts: usize) -> anyhow::Result<()> {
        let Some(other) = self.compare_dtype else {
            return Ok(());
        };
        anyhow::ensure!(hosts == 0, "--compare-dtype runs on one host (--hosts 0)");
        let frac = self.compare_ram_fraction;
        anyhow::ensure!(
            frac.is_finite() && frac > 0.0,
            "--compare-ram-fraction must be > 0"
        );
        anyhow::ensure!(
            other != self.kv_dtype,
            "--compare-dtype {other} is --kv-dtype: nothing to compare"
        );
        Ok(())
    }
}
