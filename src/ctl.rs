//! `kvfabric ctl`: operate a cluster through any node's gRPC API.
//!
//! `status` (a table of nodes and tiers, or `--json`), `watch` (the status
//! every `--interval-ms`, `--count` times), `lookup` (how many leading tokens
//! of a prompt are cached and where), `pin` / `unpin` / `evict` (blocks of a
//! prompt or given keys). Block keys are computed with the block-key library
//! (`KeyChain`) from the namespace, model fingerprint, layout and token ids:
//! either `--model GGUF` (tokenizer, layout and fingerprint from the model;
//! `--prompt TEXT` or `--tokens FILE`), or `--tokens FILE` with
//! `--model-fingerprint HEX --layers --kv-heads --head-dim [--dtype]`, or
//! `--keys HEX,...` directly. A token file holds ids separated by spaces,
//! commas or newlines. A node with a tenants file needs `--api-key` (a
//! `trusted` tenant's key sees keys as computed; docs/SECURITY.md); a
//! tenant's engine blocks live under `--namespace tenant:<namespace>`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use kvfabric_proto::v1::{
    ClusterStatusRequest, ClusterStatusResponse, LookupRequest, PinRequest, RemoveRequest, Tier,
    UnpinRequest,
};
use kvfabric_store::cluster::client::{self, CacheClient};
use kvfabric_store::{BlockKey, BlockOrder, DType, KeyChain, KvLayout, ModelFingerprint};
use serde_json::{json, Value};

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
    #[command(subcommand)]
    pub action: CtlAction,
}

/// What `kvfabric ctl` does.
#[derive(Subcommand, Debug)]
pub enum CtlAction {
    /// Nodes, tiers, capacity, use, blocks and hit ratio.
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
    /// How many leading tokens of a prompt are cached, and on which nodes.
    Lookup {
        #[command(flatten)]
        blocks: BlockSelect,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Pin blocks (hard, or soft with --ttl-ms) on every node holding them.
    Pin {
        #[command(flatten)]
        blocks: BlockSelect,
        /// Soft pin for this long; 0 = hard pin.
        #[arg(long, default_value_t = 0, value_name = "MS")]
        ttl_ms: u64,
    },
    /// Remove pins of blocks on every node holding them.
    Unpin {
        #[command(flatten)]
        blocks: BlockSelect,
    },
    /// Drop blocks from every tier of every node.
    Evict {
        #[command(flatten)]
        blocks: BlockSelect,
    },
    /// The node's capacity planner: its token hit ratio at 0.25x..4x each tier.
    Capacity {
        /// Print JSON (the shape of GET /api/v1/capacity) instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Which blocks: explicit keys, or a prompt's keys.
#[derive(Args, Debug, Clone)]
pub struct BlockSelect {
    /// Block keys (64 hex digits), comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "HEX,...")]
    pub keys: Vec<String>,
    /// File of token ids (separated by spaces, commas or newlines).
    #[arg(long, value_name = "FILE")]
    pub tokens: Option<PathBuf>,
    /// Prompt text, tokenized with --model's tokenizer (BOS added as the model wants).
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,
    /// GGUF model file: tokenizer, KV layout and fingerprint come from it.
    #[arg(long, value_name = "GGUF")]
    pub model: Option<PathBuf>,
    /// Model fingerprint (64 hex digits), without --model.
    #[arg(long, value_name = "HEX")]
    pub model_fingerprint: Option<String>,
    /// Tenant namespace (cache salt) the blocks were stored under.
    #[arg(long, default_value = "")]
    pub namespace: String,
    /// Tokens per block.
    #[arg(long, default_value_t = 64)]
    pub block_tokens: u32,
    /// Layers per block, without --model.
    #[arg(long)]
    pub layers: Option<u32>,
    /// KV heads, without --model.
    #[arg(long)]
    pub kv_heads: Option<u32>,
    /// Head dimension, without --model.
    #[arg(long)]
    pub head_dim: Option<u32>,
    /// Element type of the KV (f16, bf16, f32), as the engine's `kv_dtype`.
    #[arg(long, default_value = "f16")]
    pub dtype: DType,
}

/// Run one ctl command.
pub fn run(cmd: CtlCmd) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run_async(cmd))
}

async fn run_async(cmd: CtlCmd) -> anyhow::Result<()> {
    let timeout = Duration::from_millis(cmd.timeout_ms);
    let mut c = client::connect(&cmd.addr, timeout)
        .await
        .with_context(|| format!("cannot reach a node at {}", cmd.addr))?;
    let key = cmd.api_key.as_deref();
    match cmd.action {
        CtlAction::Status { json } => print_status(&status(&mut c, key).await?, json),
        CtlAction::Capacity { json } => capacity(&mut c, key, json).await?,
        CtlAction::Watch {
            interval_ms,
            count,
            json,
        } => {
            for i in 0..count {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(interval_ms)).await;
                    if !json {
                        println!();
                    }
                }
                print_status(&status(&mut c, key).await?, json);
            }
        }
        CtlAction::Lookup { blocks, json } => {
            let sel = resolve(&blocks)?;
            let r = c
                .lookup(authed(
                    LookupRequest {
                        keys: sel.keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
                        with_holders: true,
                    },
                    key,
                )?)
                .await
                .map_err(|s| anyhow!("lookup: {}", s.message()))?
                .into_inner();
            let bt = sel.block_tokens as u64;
            let report = json!({
                "blocks": sel.keys.len(),
                "cached_blocks": r.prefix_blocks,
                "tokens": sel.tokens,
                "cached_tokens": r.prefix_blocks as u64 * bt,
                "holders": r.holders.iter().zip(&sel.keys).map(|(h, k)| json!({
                    "key": k.to_hex(),
                    "node": h.node_id,
                    "tier": tier_name(h.tier),
                    "size": h.size,
                })).collect::<Vec<_>>(),
            });
            if json {
                println!("{report}");
            } else {
                println!(
                    "cached: {} of {} tokens ({} of {} blocks)",
                    r.prefix_blocks as u64 * bt,
                    sel.tokens,
                    r.prefix_blocks,
                    sel.keys.len()
                );
                println!(
                    "{:>5}  {:<16}  {:<12}  {:<5}  {:>10}",
                    "block", "key", "node", "tier", "size"
                );
                for (i, (h, k)) in r.holders.iter().zip(&sel.keys).enumerate() {
                    println!(
                        "{:>5}  {:<16}  {:<12}  {:<5}  {:>10}",
                        i,
                        &k.to_hex()[..16],
                        h.node_id,
                        tier_name(h.tier),
                        bytesize::ByteSize(h.size).to_string()
                    );
                }
            }
        }
        CtlAction::Pin { blocks, ttl_ms } => {
            let keys = key_bytes(&resolve(&blocks)?.keys);
            let n = c
                .pin(authed(PinRequest { keys, ttl_ms }, key)?)
                .await
                .map_err(|s| anyhow!("pin: {}", s.message()))?
                .into_inner()
                .pinned;
            println!("pinned {n} block copies");
        }
        CtlAction::Unpin { blocks } => {
            let keys = key_bytes(&resolve(&blocks)?.keys);
            let n = c
                .unpin(authed(UnpinRequest { keys }, key)?)
                .await
                .map_err(|s| anyhow!("unpin: {}", s.message()))?
                .into_inner()
                .unpinned;
            println!("unpinned {n} block copies");
        }
        CtlAction::Evict { blocks } => {
            let keys = key_bytes(&resolve(&blocks)?.keys);
            let n = c
                .remove(authed(RemoveRequest { keys }, key)?)
                .await
                .map_err(|s| anyhow!("evict: {}", s.message()))?
                .into_inner()
                .removed;
            println!("evicted {n} block copies");
        }
    }
    Ok(())
}

/// `msg` with `authorization: Bearer <key>` when a key is given.
fn authed<T>(msg: T, key: Option<&str>) -> anyhow::Result<tonic::Request<T>> {
    let mut r = tonic::Request::new(msg);
    if let Some(k) = key {
        let v = format!("Bearer {k}")
            .parse()
            .map_err(|_| anyhow!("--api-key must be printable ASCII"))?;
        r.metadata_mut().insert("authorization", v);
    }
    Ok(r)
}

async fn status(c: &mut CacheClient, key: Option<&str>) -> anyhow::Result<ClusterStatusResponse> {
    Ok(c.cluster_status(authed(ClusterStatusRequest {}, key)?)
        .await
        .map_err(|s| anyhow!("cluster status: {}", s.message()))?
        .into_inner())
}

/// `kvfabric ctl capacity`: the planner's curves of the node at --addr.
async fn capacity(c: &mut CacheClient, key: Option<&str>, json: bool) -> anyhow::Result<()> {
    let r: kvfabric_store::CapacityReport = c
        .capacity(authed(kvfabric_proto::v1::CapacityRequest {}, key)?)
        .await
        .map_err(|s| anyhow!("capacity: {}", s.message()))?
        .into_inner()
        .into();
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    if r.tiers.is_empty() {
        println!("capacity planner off (planner_sample_rate = 0)");
        return Ok(());
    }
    println!(
        "sample {:.2}% of keys, {} lookups ({} sampled); token hit ratio of this node's lookups",
        r.sample_rate * 100.0,
        r.lookups,
        r.sampled_lookups
    );
    println!(
        "{:<5}  {:<7}  {:>6}  {:>12}  {:>9}",
        "tier", "policy", "scale", "capacity", "hit ratio"
    );
    for t in &r.tiers {
        for p in &t.points {
            let now = if p.scale == 1.0 { "  <- now" } else { "" };
            println!(
                "{:<5}  {:<7}  {:>5}x  {:>12}  {:>9.3}{now}",
                t.tier,
                t.policy,
                p.scale,
                bytesize::ByteSize::b(p.capacity_bytes).to_string(),
                p.token_hit_ratio
            );
        }
    }
    Ok(())
}

fn tier_name(t: i32) -> &'static str {
    match Tier::try_from(t) {
        Ok(Tier::Vram) => "vram",
        Ok(Tier::Ram) => "ram",
        Ok(Tier::Disk) => "disk",
        _ => "?",
    }
}

fn status_json(s: &ClusterStatusResponse) -> Value {
    json!({
        "nodes": s.nodes.iter().map(|n| json!({
            "node_id": n.node_id,
            "grpc_addr": n.grpc_addr,
            "transfer_addr": n.transfer_addr,
            "alive": n.alive,
            "hit_ratio": n.hit_ratio,
            "tiers": n.tiers.iter().map(|t| json!({
                "tier": tier_name(t.tier),
                "capacity_bytes": t.capacity_bytes,
                "used_bytes": t.used_bytes,
                "blocks": t.blocks,
                "hits": t.hits,
                "misses": t.misses,
                "evictions": t.evictions,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn print_status(s: &ClusterStatusResponse, json: bool) {
    if json {
        println!("{}", status_json(s));
        return;
    }
    println!(
        "{:<12}  {:<5}  {:<21}  {:<5}  {:>10}  {:>10}  {:>8}  {:>9}",
        "node", "alive", "grpc", "tier", "capacity", "used", "blocks", "hit ratio"
    );
    for n in &s.nodes {
        let alive = if n.alive { "yes" } else { "no" };
        if n.tiers.is_empty() {
            println!("{:<12}  {:<5}  {:<21}", n.node_id, alive, n.grpc_addr);
        }
        for (i, t) in n.tiers.iter().enumerate() {
            let (id, a, g, hr) = if i == 0 {
                (
                    n.node_id.as_str(),
                    alive,
                    n.grpc_addr.as_str(),
                    format!("{:.3}", n.hit_ratio),
                )
            } else {
                ("", "", "", String::new())
            };
            println!(
                "{:<12}  {:<5}  {:<21}  {:<5}  {:>10}  {:>10}  {:>8}  {:>9}",
                id,
                a,
                g,
                tier_name(t.tier),
                bytesize::ByteSize(t.capacity_bytes).to_string(),
                bytesize::ByteSize(t.used_bytes).to_string(),
                t.blocks,
                hr
            );
        }
    }
}

/// The keys a command acts on, and what they cover.
struct Selection {
    keys: Vec<BlockKey>,
    tokens: usize,
    block_tokens: u32,
}

fn key_bytes(keys: &[BlockKey]) -> Vec<Vec<u8>> {
    keys.iter().map(|k| k.as_bytes().to_vec()).collect()
}

fn hex32(s: &str, what: &str) -> anyhow::Result<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        bail!("{what} {s:?} is not 64 hex digits");
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|_| anyhow!("{what} {s:?} is not 64 hex digits"))?;
    }
    Ok(out)
}

fn parse_tokens(text: &str) -> anyhow::Result<Vec<u32>> {
    text.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .map_err(|_| anyhow!("{t:?} is not a token id"))
        })
        .collect()
}

fn resolve(sel: &BlockSelect) -> anyhow::Result<Selection> {
    if !sel.keys.is_empty() {
        let keys = sel
            .keys
            .iter()
            .map(|k| hex32(k, "key").map(BlockKey))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let tokens = keys.len() * sel.block_tokens as usize;
        return Ok(Selection {
            keys,
            tokens,
            block_tokens: sel.block_tokens,
        });
    }
    let file_tokens = match &sel.tokens {
        Some(p) => Some(parse_tokens(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        )?),
        None => None,
    };
    let (tokens, layout, fingerprint) = match &sel.model {
        Some(path) => {
            let g = kvfabric_engine::gguf::GgufFile::open(path)
                .with_context(|| format!("opening {}", path.display()))?;
            let c = kvfabric_engine::model::LlamaConfig::from_gguf(&g)?;
            let tokens = match (&sel.prompt, file_tokens) {
                (Some(text), _) => {
                    kvfabric_engine::tokenizer::Tokenizer::from_gguf(&g)?.encode_prompt(text)
                }
                (None, Some(t)) => t,
                (None, None) => bail!("give --prompt TEXT or --tokens FILE"),
            };
            drop(g);
            let model = kvfabric_engine::model::LlamaModel::load(path, |_, _| {})?;
            let layout = kvfabric_engine::kv::pool::KvPool::layout_for(
                c.layers,
                c.kv_heads,
                c.head_dim,
                sel.block_tokens as usize,
                sel.dtype,
            );
            (tokens, layout, model.fingerprint())
        }
        None => {
            if sel.prompt.is_some() {
                bail!("--prompt needs --model GGUF (the tokenizer comes from the model); or give --tokens FILE");
            }
            let tokens = file_tokens
                .ok_or_else(|| anyhow!("give --keys, --tokens FILE or --model with --prompt"))?;
            let fp = sel
                .model_fingerprint
                .as_deref()
                .ok_or_else(|| anyhow!("--tokens without --model needs --model-fingerprint"))?;
            let need = |v: Option<u32>, name: &str| {
                v.ok_or_else(|| anyhow!("--tokens without --model needs --{name}"))
            };
            let layout = KvLayout {
                layers: need(sel.layers, "layers")?,
                kv_heads: need(sel.kv_heads, "kv-heads")?,
                head_dim: need(sel.head_dim, "head-dim")?,
                dtype: sel.dtype,
                block_tokens: sel.block_tokens,
                order: BlockOrder::LayerKvTokenHead,
            };
            (
                tokens,
                layout,
                ModelFingerprint(hex32(fp, "model fingerprint")?),
            )
        }
    };
    layout.validate()?;
    let keys = KeyChain::new(sel.namespace.as_bytes(), &fingerprint, &layout).keys(&tokens);
    Ok(Selection {
        keys,
        tokens: tokens.len(),
        block_tokens: sel.block_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_files_and_hex_keys_parse() {
        assert_eq!(parse_tokens("1 2,3\n4").unwrap(), vec![1, 2, 3, 4]);
        assert!(parse_tokens("1 x").is_err());
        assert_eq!(hex32(&"ab".repeat(32), "key").unwrap(), [0xab; 32]);
        assert!(hex32("abc", "key").is_err());
        assert!(hex32(&"zz".repeat(32), "key").is_err());
    }
}
