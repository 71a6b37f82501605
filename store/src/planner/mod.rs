//! Capacity planner: the token hit ratio this node would have with 0.25x to
//! 4x its RAM or disk capacity, estimated online, for its eviction policy.
//!
//! Sampling is SHARDS' (Waldspurger et al., FAST '15): a key is sampled when
//! a hash of it is below `R * 2^64` (`planner_sample_rate`), so every access
//! of a sampled key is seen and none of the others: reuse is kept whole for
//! the keys sampled. The curve is not LRU stack distances but miniature
//! simulations (`mini`, Waldspurger et al., ATC '17): per point, a cache `R`
//! times the point's size, run by the node's own eviction order on the
//! sampled stream, so LIRS' and S3-FIFO's curves come from the code the
//! tiers run (and LRU's is the same as its stack distances would give).
//!
//! The ratio at a point is `1 - misses / (R * N)`, `N` every looked-up key
//! (sampled or not): SHARDS_adj's correction. A few very hot keys (a shared
//! system prompt's blocks, looked up by every request) are sampled or not by
//! chance and would swing the plain ratio `1 - misses / sampled`; they are
//! hits at every point, so their lookups move the hit count and not the
//! misses, and dividing the sampled misses by the expected sampled lookups
//! takes them out. Blocks are full (`block_tokens` tokens each), so the block
//! ratio is the token ratio of the node's lookups
//! (`kvfabric_store_lookup_hit_tokens` over hit + miss tokens).
//!
//! A lookup's hit is its longest stored prefix: in a mini-cache, a sampled
//! key after one that missed in the same lookup is a miss too (and is not
//! touched, as the store reads only the prefix it found). With every key
//! sampled this is the store's rule exactly; at 1% a lookup rarely has two
//! sampled keys, so a block whose unsampled parent is gone still counts as
//! a hit (the estimate's main error on S3-FIFO and LIRS: see
//! docs/BENCHMARKS.md, "capacity planner").
//!
//! The hot path: a lookup adds its key count to one relaxed atomic and
//! hashes each key; a lookup with a sampled key pushes its sampled keys into
//! a bounded lock-free queue, and a background thread runs the mini-caches
//! (`feed`: a full queue drops the sample and counts it,
//! `kvfabric_planner_dropped_samples_total`). Puts hash their key the same
//! way. Below [`MIN_SAMPLES`] sampled lookups the report says the curve is
//! not yet meaningful (the console shows "too few samples"). Tiers: the RAM curve scales the RAM tier with the
//! disk tier as it is, the disk curve the disk tier with RAM as it is; a
//! point holds the two tiers' bytes together (write-back keeps a block in one
//! tier at a time, so they add up).

mod feed;
mod mini;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam::queue::ArrayQueue;
use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

use crate::keys::{spot, BlockKey};
use crate::node_config::{EvictionPolicy, NodeConfig};
use feed::{Drain, Feeder, Sample, QUEUE};
use mini::Mini;

/// Capacity multipliers of each tier's curve.
pub const SCALES: [f64; 8] = [0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0];

/// Sampled lookups below which a curve is noise (a few hundred sampled
/// blocks: docs/OPERATIONS.md, "Capacity planner"); reported as `min_samples`.
pub const MIN_SAMPLES: u64 = 256;

/// The RAM arena's slot size: a block takes a multiple of it.
const SLOT: u64 = 4096;

/// One point of a tier's curve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    pub scale: f64,
    pub capacity_bytes: u64,
    pub token_hit_ratio: f64,
}

/// A tier's curve: the node's token hit ratio at each scale of this tier.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TierCurve {
    /// "ram" or "disk".
    pub tier: String,
    /// The eviction policy simulated (the node's).
    pub policy: String,
    pub capacity_bytes: u64,
    pub points: Vec<CurvePoint>,
}

/// What GET /api/v1/capacity and `kvfabric ctl capacity` show.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CapacityReport {
    pub tiers: Vec<TierCurve>,
    /// The sampling rate in force (the hash threshold's share; 0 = off).
    pub sample_rate: f64,
    /// Keys looked up since start (every key, sampled or not).
    pub lookups: u64,
    /// Of them, sampled (and run through the mini-caches).
    pub sampled_lookups: u64,
    /// Sampled lookups the curve needs before it means anything
    /// ([`MIN_SAMPLES`]); below it the console says "too few samples".
    #[serde(default)]
    pub min_samples: u64,
    /// Samples dropped because the planner's queue was full.
    #[serde(default)]
    pub dropped_samples: u64,
}

/// A tier's mini-caches.
#[derive(Debug)]
struct TierSims {
    tier: &'static str,
    capacity_bytes: u64,
    points: Vec<Mini>,
}

/// Everything behind the lock: touched by sampled keys only.
#[derive(Debug)]
struct Sims {
    tiers: Vec<TierSims>,
    sampled_lookups: u64,
    /// Bytes and count of the sampled puts (slot-rounded): the mean block size.
    put_bytes: u64,
    puts: u64,
}

/// The planner of one node: the hooks and the report; the simulations run
/// on its feeder thread (stopped on drop).
#[derive(Debug)]
pub struct Planner {
    shared: Arc<Shared>,
    _feeder: Option<Feeder>,
}

/// What the hooks, the feeder thread and reports share.
#[derive(Debug)]
struct Shared {
    /// A key is sampled when its hash is below this; 0 = off.
    threshold: u64,
    rate: f64,
    /// Share of a tier's capacity eviction keeps it at (between the watermarks).
    fill: f64,
    policy: EvictionPolicy,
    lookups: AtomicU64,
    /// Puts asked of the store (every key): sampled puts over this is the
    /// share of blocks actually sampled, which sizes the mini-caches.
    puts: AtomicU64,
    /// Samples the full queue turned away.
    dropped: AtomicU64,
    queue: ArrayQueue<Sample>,
    sims: Mutex<Sims>,
}

impl Planner {
    /// A planner for a node of `cfg` with tiers of `ram` and `disk` bytes (0: none).
    pub fn new(cfg: &NodeConfig, ram: u64, disk: u64) -> Self {
        let threshold = (cfg.planner_sample_rate * 2f64.powi(64)).min(u64::MAX as f64) as u64;
        let (r, d) = (ram as f64, disk as f64);
        let mut tiers = Vec::new();
        if threshold > 0 {
            let curve = |tier, capacity_bytes, bytes: &dyn Fn(f64) -> f64| TierSims {
                tier,
                capacity_bytes,
                points: SCALES
                    .iter()
                    .map(|&s| Mini::new(cfg, s, bytes(s)))
                    .collect(),
            };
            tiers.push(curve("ram", ram, &|s| s * r + d));
            if disk > 0 {
                tiers.push(curve("disk", disk, &|s| r + s * d));
            }
        }
        let shared = Arc::new(Shared {
            threshold,
            rate: threshold as f64 / 2f64.powi(64),
            fill: (cfg.high_watermark + cfg.low_watermark) / 2.0,
            policy: cfg.eviction,
            lookups: AtomicU64::new(0),
            puts: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            queue: ArrayQueue::new(if threshold > 0 { QUEUE } else { 1 }),
            sims: Mutex::new(Sims {
                tiers,
                sampled_lookups: 0,
                put_bytes: 0,
                puts: 0,
            }),
        });
        let feeder = if threshold > 0 {
            Feeder::start(shared.clone())
        } else {
            None
        };
        Planner {
            shared,
            _feeder: feeder,
        }
    }

    /// [`Planner::new`], its curve registered as `kvfabric_planner_hit_ratio{tier,scale}`.
    pub fn register(cfg: &NodeConfig, ram: u64, disk: u64, registry: &mut Registry) -> Arc<Self> {
        let p = Arc::new(Planner::new(cfg, ram, disk));
        registry.register_collector(Box::new(p.clone()));
        p
    }

    /// The store looked up `keys` (the hook on the lookup path): hashes
    /// only; a lookup with sampled keys queues them for the feeder.
    #[inline]
    pub fn on_lookup(&self, keys: &[BlockKey]) {
        let sh = &*self.shared;
        if sh.threshold == 0 {
            return;
        }
        sh.lookups.fetch_add(keys.len() as u64, Ordering::Relaxed);
        // One pass, one hash per key; the Vec allocates only at a sampled key.
        let mut sampled = Vec::new();
        for k in keys {
            if spot(k) < sh.threshold {
                sampled.push(*k);
            }
        }
        if sampled.is_empty() {
            return;
        }
        let keys = sampled;
        let all_puts = sh.puts.load(Ordering::Relaxed);
        sh.push(Sample::Lookup { keys, all_puts });
    }

    /// The store was asked to put `key` of `len` bytes (the hook on the put path).
    #[inline]
    pub fn on_put(&self, key: &BlockKey, len: u64) {
        let sh = &*self.shared;
        if sh.threshold == 0 {
            return;
        }
        let all_puts = sh.puts.fetch_add(1, Ordering::Relaxed) + 1;
        if spot(key) < sh.threshold {
            sh.push(Sample::Put {
                key: *key,
                len,
                all_puts,
            });
        }
    }

    /// The curves now (after applying what is queued).
    pub fn report(&self) -> CapacityReport {
        self.shared.report()
    }
}

impl Shared {
    fn push(&self, sample: Sample) {
        if self.queue.push(sample).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Pop and apply up to `max` samples; the caller holds the lock (so
    /// samples reach the mini-caches in queue order).
    fn pop_into(&self, s: &mut Sims, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            let Some(sample) = self.queue.pop() else {
                break;
            };
            s.apply(sample, self.rate, self.fill);
            n += 1;
        }
        n
    }

    fn report(&self) -> CapacityReport {
        let mut s = self.sims.lock();
        self.pop_into(&mut s, usize::MAX);
        let lookups = self.lookups.load(Ordering::Relaxed);
        // Misses are of the blocks that get put: their sampled share (not a
        // hot key's luck) scales the sampled misses up.
        let share = s.share(self.rate, self.puts.load(Ordering::Relaxed));
        let expected = share * lookups as f64;
        let ratio = |misses: u64| {
            if expected <= 0.0 {
                0.0
            } else {
                (1.0 - misses as f64 / expected).clamp(0.0, 1.0)
            }
        };
        let tiers = s
            .tiers
            .iter()
            .map(|t| TierCurve {
                tier: t.tier.into(),
                policy: policy_name(self.policy).into(),
                capacity_bytes: t.capacity_bytes,
                points: t
                    .points
                    .iter()
                    .map(|m| CurvePoint {
                        scale: m.scale,
                        capacity_bytes: (m.scale * t.capacity_bytes as f64) as u64,
                        token_hit_ratio: ratio(m.misses),
                    })
                    .collect(),
            })
            .collect();
        CapacityReport {
            tiers,
            sample_rate: self.rate,
            lookups,
            sampled_lookups: s.sampled_lookups,
            min_samples: if self.threshold > 0 { MIN_SAMPLES } else { 0 },
            dropped_samples: self.dropped.load(Ordering::Relaxed),
        }
    }
}

impl Drain for Shared {
    fn drain(&self, max: usize) -> usize {
        if self.queue.is_empty() {
            return 0;
        }
        let mut s = self.sims.lock();
        self.pop_into(&mut s, max)
    }
}

impl Sims {
    /// One queued sample, sized by the put count it was pushed with.
    fn apply(&mut self, sample: Sample, rate: f64, fill: f64) {
        match sample {
            Sample::Lookup { keys, all_puts } => {
                let per_byte = self.blocks_per_byte(rate, fill, all_puts);
                self.lookup(keys.iter(), per_byte);
            }
            Sample::Put { key, len, all_puts } => {
                self.note_put(len);
                let per_byte = self.blocks_per_byte(rate, fill, all_puts);
                self.put(&key, per_byte);
            }
        }
    }

    /// Sampled blocks per byte a point holds: the share of blocks sampled
    /// times `fill` over the mean block. The share is the sampled puts'
    /// share of all puts once there are enough of them (the hash's rate
    /// before): the sampled keys are `rate` of the keys only on average, and
    /// a cache a few percent too small for a loop misses it all.
    fn blocks_per_byte(&self, rate: f64, fill: f64, all_puts: u64) -> f64 {
        let share = self.share(rate, all_puts);
        let mean = if self.puts == 0 {
            SLOT as f64
        } else {
            self.put_bytes as f64 / self.puts as f64
        };
        share * fill / mean
    }

    /// The share of blocks sampled: sampled puts over all puts once there
    /// are enough, the hash's rate before.
    fn share(&self, rate: f64, all_puts: u64) -> f64 {
        const ENOUGH: u64 = 64;
        if self.puts >= ENOUGH && all_puts > 0 {
            self.puts as f64 / all_puts as f64
        } else {
            rate
        }
    }

    fn note_put(&mut self, len: u64) {
        self.puts += 1;
        self.put_bytes += len.div_ceil(SLOT) * SLOT;
    }

    /// One lookup's sampled keys, in prefix order.
    fn lookup<'k>(&mut self, keys: impl Iterator<Item = &'k BlockKey> + Clone, per_byte: f64) {
        self.sampled_lookups += keys.clone().count() as u64;
        for m in self.tiers.iter_mut().flat_map(|t| t.points.iter_mut()) {
            m.lookup(keys.clone(), per_byte);
        }
    }

    fn put(&mut self, key: &BlockKey, per_byte: f64) {
        for m in self.tiers.iter_mut().flat_map(|t| t.points.iter_mut()) {
            m.put(key, per_byte);
        }
    }
}

/// The policy's config name.
pub fn policy_name(p: EvictionPolicy) -> &'static str {
    match p {
        EvictionPolicy::Lirs => "lirs",
        EvictionPolicy::Lru => "lru",
        EvictionPolicy::S3fifo => "s3fifo",
        EvictionPolicy::Adaptive => "adaptive",
        EvictionPolicy::Door => "door",
    }
}

impl Collector for Planner {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let report = self.report();
        let mut family = encoder.encode_descriptor(
            "kvfabric_planner_hit_ratio",
            "Estimated token hit ratio of this node's lookups with the tier at `scale` times its capacity (SHARDS sample, the node's eviction policy)",
            None,
            MetricType::Gauge,
        )?;
        for t in &report.tiers {
            for p in &t.points {
                let labels = [("tier", t.tier.clone()), ("scale", format!("{}", p.scale))];
                ConstGauge::new(p.token_hit_ratio).encode(family.encode_family(&labels)?)?;
            }
        }
        let dropped = encoder.encode_descriptor(
            "kvfabric_planner_dropped_samples",
            "Sampled accesses the capacity planner dropped because its queue was full (the curve is from the rest)",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(report.dropped_samples).encode(dropped)?;
        Ok(())
    }
}
