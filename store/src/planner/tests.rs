//! The planner against the store it watches: sampled at rate 1 its point at
//! scale 1 is the store's own hit ratio (same policy code, same capacity);
//! sampled keys are the configured share; the report's and the metric's
//! shapes; the feeder thread runs the simulations off the hot path, a full
//! queue drops and counts, and the thread stops with the planner.

use bytesize::ByteSize;

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Planner, MIN_SAMPLES, QUEUE, SCALES};
use crate::keys::spot;
use crate::keys::{BlockKey, BlockOrder, DType, KvLayout};
use crate::node_config::{EvictionPolicy, NodeConfig};
use crate::store::{PutOptions, Store};
use crate::Registry;

fn layout() -> KvLayout {
    KvLayout {
        layers: 1,
        kv_heads: 1,
        head_dim: 512,
        dtype: DType::F32,
        block_tokens: 1,
        order: BlockOrder::LayerKvTokenHead,
    }
}

fn key(i: u64) -> BlockKey {
    let mut k = [0u8; 32];
    k[..8].copy_from_slice(&i.to_le_bytes());
    BlockKey(k)
}

/// A RAM-only store of `blocks` 4 KiB blocks, evicting one block when full.
fn store(blocks: u64, policy: EvictionPolicy, rate: f64) -> (Store, Registry) {
    let cfg = NodeConfig {
        ram_capacity: ByteSize::b(blocks * 4096),
        high_watermark: 1.0,
        low_watermark: 1.0,
        eviction: policy,
        planner_sample_rate: rate,
        ..Default::default()
    };
    let mut registry = Registry::default();
    (Store::open(cfg, &mut registry).unwrap(), registry)
}

/// Each request looks one key up, reads it on a hit, puts it on a miss.
fn replay(s: &Store, keys: impl Iterator<Item = u64>) {
    let data = vec![7u8; layout().block_bytes()];
    for i in keys {
        let k = key(i);
        if s.lookup(&[k]).is_empty() {
            s.put(k, layout(), &data, PutOptions::default()).unwrap();
        } else {
            drop(s.lease(&k).unwrap().unwrap());
        }
    }
}

/// A mix of a loop (LRU's worst case) and a popular set, 40 k lookups.
fn trace() -> impl Iterator<Item = u64> {
    let mut x = 1u64;
    (0..40_000u64).map(move |i| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if i % 3 == 0 {
            x % 40
        } else {
            1000 + i % 300
        }
    })
}

/// Sampling every key, the scale-1 point replays the store's own tier: its
/// ratio is the store's lookup hit ratio, for every policy; a larger tier
/// never estimates fewer hits on this trace, and 4x holds everything.
#[test]
fn at_rate_one_scale_one_is_the_stores_own_hit_ratio() {
    for policy in [
        EvictionPolicy::Lru,
        EvictionPolicy::S3fifo,
        EvictionPolicy::Lirs,
    ] {
        let (s, _r) = store(200, policy, 1.0);
        replay(&s, trace());
        let st = s.stats();
        let own = st.hit_blocks as f64 / (st.hit_blocks + st.miss_blocks) as f64;
        let rep = s.capacity();
        assert_eq!(rep.tiers.len(), 1, "RAM only");
        let ram = &rep.tiers[0];
        assert_eq!(ram.tier, "ram");
        assert_eq!(ram.capacity_bytes, 200 * 4096);
        let at = |scale: f64| {
            ram.points
                .iter()
                .find(|p| p.scale == scale)
                .unwrap()
                .token_hit_ratio
        };
        assert!(
            (at(1.0) - own).abs() < 1e-9,
            "{policy:?}: planner {} vs store {own}",
            at(1.0)
        );
        // Fewer distinct keys than 4x's 800 blocks: only first lookups miss.
        let distinct = trace().collect::<std::collections::HashSet<_>>().len();
        assert!(distinct < 800);
        let all_but_first = 1.0 - distinct as f64 / 40_000.0;
        assert!((at(4.0) - all_but_first).abs() < 1e-9, "{}", at(4.0));
        assert!(at(0.25) < at(4.0), "{policy:?}: {:?}", ram.points);
    }
}

/// The hash threshold samples its share of keys, even of keys that are counters.
#[test]
fn the_sampled_share_is_the_rate() {
    for rate in [0.01, 0.1, 0.5] {
        let p = Planner::new(
            &NodeConfig {
                planner_sample_rate: rate,
                ..Default::default()
            },
            1 << 30,
            0,
        );
        let n = 200_000u64;
        let keys: Vec<BlockKey> = (0..n).map(key).collect();
        p.on_lookup(&keys);
        let rep = p.report();
        let share = rep.sampled_lookups as f64 / n as f64;
        assert!((share - rate).abs() < rate * 0.1, "rate {rate}: {share}");
        assert_eq!(rep.lookups, n);
        assert!((rep.sample_rate - rate).abs() < 1e-12);
    }
    assert_ne!(spot(&key(1)), spot(&key(2)));
}

/// Rate 0: nothing counted, no curve; out-of-range rates are refused.
#[test]
fn rate_zero_is_off_and_bad_rates_are_refused() {
    let (s, _r) = store(16, EvictionPolicy::Lru, 0.0);
    replay(&s, 0..100);
    let rep = s.capacity();
    assert!(rep.tiers.is_empty());
    assert_eq!(rep.lookups, 0);
    for bad in [-0.1, 1.5, f64::NAN] {
        let cfg = NodeConfig {
            planner_sample_rate: bad,
            ..Default::default()
        };
        assert!(cfg.validate().is_err(), "{bad}");
    }
}

/// The JSON of GET /api/v1/capacity and the metric, named as documented.
#[test]
fn report_json_and_metric_shapes() {
    let (s, registry) = store(64, EvictionPolicy::Lirs, 1.0);
    replay(&s, (0..500).map(|i| i % 100));
    let v = serde_json::to_value(s.capacity()).unwrap();
    let t = &v["tiers"][0];
    assert_eq!(t["tier"], "ram");
    assert_eq!(t["policy"], "lirs");
    assert_eq!(t["capacity_bytes"], 64 * 4096);
    let pts = t["points"].as_array().unwrap();
    assert_eq!(pts.len(), SCALES.len());
    assert_eq!(pts[0]["scale"], 0.25);
    assert_eq!(pts[0]["capacity_bytes"], 16 * 4096);
    assert!(pts[0]["token_hit_ratio"].is_f64());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for scale in ["0.25", "1", "4"] {
        let name = format!("kvfabric_planner_hit_ratio{{tier=\"ram\",scale=\"{scale}\"}}");
        assert!(text.contains(&name), "{name} missing from:\n{text}");
    }
}

fn every_key_planner() -> Planner {
    Planner::new(
        &NodeConfig {
            planner_sample_rate: 1.0,
            ..Default::default()
        },
        1 << 30,
        0,
    )
}

/// The hooks only queue; the feeder thread applies the samples without a
/// report asking (the old hooks ran the mini-caches inline), and the thread
/// ends (its handle on the shared state released) when the planner drops.
#[test]
fn the_feeder_thread_applies_samples_and_stops_on_drop() {
    let p = every_key_planner();
    p.on_lookup(&(0..100).map(key).collect::<Vec<_>>());
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.shared.sims.lock().sampled_lookups < 100 {
        assert!(Instant::now() < deadline, "feeder applied nothing");
        std::thread::sleep(Duration::from_millis(5));
    }
    let weak = Arc::downgrade(&p.shared);
    drop(p);
    assert!(
        weak.upgrade().is_none(),
        "feeder thread still holds the planner"
    );
}

/// With the simulations busy (their lock held), the queue takes QUEUE
/// samples and drops the rest, counted in the report and the metric; the
/// queued ones all reach the curve.
#[test]
fn a_full_queue_drops_and_counts() {
    let mut registry = Registry::default();
    let p = Planner::register(
        &NodeConfig {
            planner_sample_rate: 1.0,
            ..Default::default()
        },
        1 << 30,
        0,
        &mut registry,
    );
    let held = p.shared.sims.lock();
    for i in 0..(QUEUE + 10) as u64 {
        p.on_lookup(&[key(i)]);
    }
    drop(held);
    let rep = p.report();
    assert_eq!(rep.dropped_samples, 10);
    assert_eq!(rep.sampled_lookups, QUEUE as u64);
    assert_eq!(rep.lookups, QUEUE as u64 + 10);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("kvfabric_planner_dropped_samples_total 10"),
        "{text}"
    );
}

/// The report carries how many sampled lookups a curve needs (0 when off).
#[test]
fn the_report_says_how_many_samples_a_curve_needs() {
    let p = every_key_planner();
    p.on_lookup(&(0..10).map(key).collect::<Vec<_>>());
    let rep = p.report();
    assert_eq!((rep.sampled_lookups, rep.min_samples), (10, MIN_SAMPLES));
    let off = Planner::new(
        &NodeConfig {
            planner_sample_rate: 0.0,
            ..Default::default()
        },
        1 << 30,
        0,
    );
    assert_eq!(off.report().min_samples, 0);
}
