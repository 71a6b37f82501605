//! `ctl lookup`, `pin`, `unpin`, `evict`: commands on blocks of a prompt
//! or given keys, and how those blocks are picked ([`BlockSelect`]).
//!
//! Block keys are computed with the block-key library (`KeyChain`) from the
//! namespace, model fingerprint, layout and token ids: either `--model GGUF`
//! (tokenizer, layout and fingerprint from the model; `--prompt TEXT` or
//! `--tokens FILE`), or `--tokens FILE` with `--model-fingerprint HEX
//! --layers --kv-heads --head-dim [--dtype]`, or `--keys HEX,...` directly.
//! A token file holds ids separated by spaces, commas or newlines.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use kvfabric_proto::v1::{LookupRequest, PinRequest, RemoveRequest, UnpinRequest};
use kvfabric_store::{BlockKey, BlockOrder, DType, KeyChain, KvLayout, ModelFingerprint};
use serde_json::{json, Value};

use super::rpc::{authed, tier_name, Client};

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

/// `ctl lookup`: how many leading tokens are cached, and where each block is.
pub(super) async fn lookup(
    c: &mut Client,
    key: Option<&str>,
    blocks: &BlockSelect,
    json: bool,
) -> anyhow::Result<()> {
    let sel = resolve(blocks)?;
    let r = c
        .lookup(authed(
            LookupRequest {
                keys: key_bytes(&sel.keys),
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
        "holders": r.holders.iter().zip(&sel.keys).enumerate().map(|(i, (h, k))| json!({
            "block": i,
            "key": k.to_hex(),
            "node": h.node_id,
            "tier": tier_name(h.tier),
            "size": h.size,
        })).collect::<Vec<_>>(),
    });
    if json {
        println!("{report}");
        return Ok(());
    }
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
    for h in report["holders"].as_array().into_iter().flatten() {
        println!(
            "{:>5}  {:<16}  {:<12}  {:<5}  {:>10}",
            h["block"],
            &h["key"].as_str().unwrap_or("")[..16],
            h["node"].as_str().unwrap_or(""),
            h["tier"].as_str().unwrap_or(""),
            bytesize::ByteSize(h["size"].as_u64().unwrap_or(0)).to_string()
        );
    }
    Ok(())
}

/// `{"<verb>": n, "blocks": keys}` or the line "<verb> n block copies".
fn report_copies(verb: &str, copies: u32, blocks: usize, json: bool) {
    if json {
        let mut v = json!({ "blocks": blocks });
        v[verb] = Value::from(copies);
        println!("{v}");
    } else {
        println!("{verb} {copies} block copies");
    }
}

/// `ctl pin`: pin the blocks on every node holding them.
pub(super) async fn pin(
    c: &mut Client,
    key: Option<&str>,
    blocks: &BlockSelect,
    ttl_ms: u64,
    json: bool,
) -> anyhow::Result<()> {
    let keys = key_bytes(&resolve(blocks)?.keys);
    let n = keys.len();
    let pinned = c
        .pin(authed(PinRequest { keys, ttl_ms }, key)?)
        .await
        .map_err(|s| anyhow!("pin: {}", s.message()))?
        .into_inner()
        .pinned;
    report_copies("pinned", pinned, n, json);
    Ok(())
}

/// `ctl unpin`: remove the blocks' pins on every node holding them.
pub(super) async fn unpin(
    c: &mut Client,
    key: Option<&str>,
    blocks: &BlockSelect,
    json: bool,
) -> anyhow::Result<()> {
    let keys = key_bytes(&resolve(blocks)?.keys);
    let n = keys.len();
    let unpinned = c
        .unpin(authed(UnpinRequest { keys }, key)?)
        .await
        .map_err(|s| anyhow!("unpin: {}", s.message()))?
        .into_inner()
        .unpinned;
    report_copies("unpinned", unpinned, n, json);
    Ok(())
}

/// `ctl evict`: drop the blocks from every tier of every node.
pub(super) async fn evict(
    c: &mut Client,
    key: Option<&str>,
    blocks: &BlockSelect,
    json: bool,
) -> anyhow::Result<()> {
    let keys = key_bytes(&resolve(blocks)?.keys);
    let n = keys.len();
    let evicted = c
        .remove(authed(RemoveRequest { keys }, key)?)
        .await
        .map_err(|s| anyhow!("evict: {}", s.message()))?
        .into_inner()
        .removed;
    report_copies("evicted", evicted, n, json);
    Ok(())
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
