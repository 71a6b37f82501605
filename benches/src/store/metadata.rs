//! `kvfabric bench store --metadata-scale`, section "policy": what one
//! insert + evict costs a real [`Store`] as the number of resident blocks
//! grows, per eviction order.
//!
//! A RAM tier of exactly `n` small blocks (64 bytes, each in its own 4 KiB
//! extent: the bytes moved per op are one cache line and the figure is the
//! store's metadata work: the lock, the block index, the extent allocator,
//! the eviction order) is filled, then every op puts a new block into the full tier,
//! which evicts one (watermarks at 1.0: one victim per put). Every second
//! op also reads the block put n/40 ops earlier: it is still resident under
//! every order (S3-FIFO's small queue holds about n/10 blocks and lets at
//! most two go per put; LIRS runs here with a 5% HIR queue, see below), so
//! the read hits, moves it in LRU, sends it to S3-FIFO's main queue and
//! makes it LIR in LIRS (demoting LIRS' oldest LIR block). Everything scales
//! with `n`, so after the fill and `n` untimed ops (S3-FIFO's queues reach
//! their steady sizes) an op does the same work at every `n`, and only
//! what that work costs at `n` blocks differs.
//!
//! The figure is ops/s at each `n` and the ratio of the largest `n` to the
//! smallest: 1.0 means an op costs the same at 1M blocks as at 10k. The
//! timed ops are split into rounds that alternate between the scales (all
//! of one policy's stores are open together), so a burst of load on the
//! shared machine hits every scale alike; the best round counts, the
//! median is reported beside it.
//!
//! LIRS: a block that was never read is HIR, and its HIR queue holds
//! `lirs_hir_percent` of the blocks (1% by default). A new block put n/40
//! ops earlier has been pushed out of a 1% queue (n/100) by the puts since
//! (with it the bench fails with "block evicted before its read": LIRS doing
//! what it is for, keeping one-off blocks from displacing reused ones). The
//! bench gives LIRS a 5% HIR queue (n/20), so every order sees the same op
//! sequence, read distance included, and every read hits; the per-op work
//! (a HIR hit promoted to LIR, a demotion, a ghost per eviction) is the
//! same code as at 1%.

use std::time::Instant;

use anyhow::{ensure, Context};
use kvfabric_store::{
    BlockKey, BlockOrder, DType, EvictionPolicy, KvLayout, NodeConfig, PutOptions, Registry, Store,
};
use serde_json::{json, Value};

/// 64 bytes: 1 layer x K,V x 1 token x 1 head x 8 x f32 (one cache line).
fn small_layout() -> KvLayout {
    KvLayout {
        layers: 1,
        kv_heads: 1,
        head_dim: 8,
        dtype: DType::F32,
        block_tokens: 1,
        order: BlockOrder::LayerKvTokenHead,
    }
}

const SMALL_BLOCK: usize = 64;

/// The RAM tier's extent alignment: each block takes one 4 KiB extent.
const EXTENT: usize = 4096;

/// Timed rounds per (policy, n).
const ROUNDS: usize = 5;

fn key(i: usize) -> BlockKey {
    let mut k = [0u8; 32];
    k[..8].copy_from_slice(&(i as u64).to_le_bytes());
    k[8] = 0x3d;
    BlockKey(k)
}

/// The HIR share LIRS runs with here (see the module doc).
const LIRS_HIR_PERCENT: f64 = 5.0;

fn policy_name(p: EvictionPolicy) -> &'static str {
    match p {
        EvictionPolicy::Lru => "lru",
        EvictionPolicy::S3fifo => "s3fifo",
        EvictionPolicy::Lirs => "lirs",
        EvictionPolicy::Adaptive => "adaptive",
        EvictionPolicy::Door => "door",
    }
}

/// The "policy" section: `scales` resident-block counts, `ops` timed puts
/// each, for each of `policies`.
pub fn policy(scales: &[usize], ops: usize, policies: &[EvictionPolicy]) -> anyhow::Result<Value> {
    ensure!(!scales.is_empty(), "no metadata scales given");
    ensure!(!policies.is_empty(), "no eviction policies given");
    let per_round = ops.max(ROUNDS) / ROUNDS;
    let mut section = serde_json::Map::new();
    let mut worst = f64::INFINITY;
    for &policy in policies {
        let name = policy_name(policy);
        let mut tiers = Vec::new();
        for &n in scales {
            tiers.push(Tier::warm(policy, n.max(2))?);
        }
        for _ in 0..ROUNDS {
            for t in &mut tiers {
                t.round(per_round)?;
            }
        }
        let runs = tiers
            .into_iter()
            .map(Tier::finish)
            .collect::<anyhow::Result<Vec<Value>>>()?;
        let rate = |v: &Value| v["ops_per_sec"].as_f64().unwrap_or(0.0);
        let ratio = rate(&runs[runs.len() - 1]) / rate(&runs[0]).max(1e-9);
        worst = worst.min(ratio);
        section.insert(
            name.into(),
            json!({ "scales": runs, "ratio_largest_to_smallest": ratio }),
        );
    }
    section.insert("min_ratio".into(), json!(worst));
    section.insert("block_bytes".into(), json!(SMALL_BLOCK));
    section.insert("extent_bytes".into(), json!(EXTENT));
    section.insert("timed_puts".into(), json!(per_round * ROUNDS));
    section.insert("rounds".into(), json!(ROUNDS));
    section.insert("lirs_hir_percent".into(), json!(LIRS_HIR_PERCENT));
    Ok(Value::Object(section))
}

/// One store of `n` resident blocks and its place in the op pattern.
struct Tier {
    policy: EvictionPolicy,
    n: usize,
    store: Store,
    data: Vec<u8>,
    dst: Vec<u8>,
    /// The next block to put.
    next: usize,
    fill_ops_per_sec: f64,
    rates: Vec<f64>,
}

impl Tier {
    /// Fill a tier of `n` blocks, then run `n` untimed ops.
    fn warm(policy: EvictionPolicy, n: usize) -> anyhow::Result<Tier> {
        let cfg = NodeConfig {
            ram_capacity: bytesize::ByteSize::b((n * EXTENT) as u64),
            eviction: policy,
            lirs_hir_percent: LIRS_HIR_PERCENT,
            high_watermark: 1.0,
            low_watermark: 1.0,
            ..Default::default()
        };
        let mut t = Tier {
            policy,
            n,
            store: Store::open(cfg, &mut Registry::default())?,
            data: (0..SMALL_BLOCK).map(|i| (i * 31 + 7) as u8).collect(),
            dst: vec![0u8; SMALL_BLOCK],
            next: 0,
            fill_ops_per_sec: 0.0,
            rates: Vec::new(),
        };
        let start = Instant::now();
        t.ops(n)?;
        t.fill_ops_per_sec = n as f64 / start.elapsed().as_secs_f64();
        t.ops(n)?;
        Ok(t)
    }

    /// `count` ops of the pattern: put the next block; on even blocks `i`,
    /// read block `i - n/40`, which must still be resident.
    fn ops(&mut self, count: usize) -> anyhow::Result<()> {
        let back = (self.n / 40).max(1);
        for i in self.next..self.next + count {
            let s = &self.store;
            s.put(key(i), small_layout(), &self.data, PutOptions::default())?;
            if i % 2 == 0 && i >= back {
                let hit = s.get_into(&key(i - back), 0, &mut self.dst)?;
                ensure!(hit.is_some(), "block {} evicted before its read", i - back);
            }
        }
        self.next += count;
        Ok(())
    }

    /// One timed round of `count` ops.
    fn round(&mut self, count: usize) -> anyhow::Result<()> {
        let start = Instant::now();
        self.ops(count)?;
        self.rates
            .push(count as f64 / start.elapsed().as_secs_f64());
        Ok(())
    }

    /// Check the tier stayed full and right; its figures.
    fn finish(mut self) -> anyhow::Result<Value> {
        let (policy, n) = (self.policy, self.n);
        // Every put past the fill evicted exactly one block.
        let stats = self.store.stats();
        let ram = stats.tiers.first().context("no RAM tier in stats")?;
        ensure!(
            ram.blocks == n as u64,
            "{policy:?}: {} resident blocks after the timed puts, expected {n}",
            ram.blocks
        );
        let last = key(self.next - 1);
        ensure!(
            self.store.get_into(&last, 0, &mut self.dst)?.is_some() && self.dst == self.data,
            "{policy:?}: the last block put is missing or wrong"
        );
        self.rates.sort_by(f64::total_cmp);
        let best = self.rates.last().copied().unwrap_or(0.0);
        Ok(json!({
            "resident_blocks": n,
            "ops_per_sec": best,
            "median_ops_per_sec": self.rates[self.rates.len() / 2],
            "us_per_op": 1e6 / best.max(1e-9),
            "fill_ops_per_sec": self.fill_ops_per_sec,
        }))
    }
}
