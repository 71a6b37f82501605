//! The capacity planner's cost on the RAM tier's paths: the same blocks in
//! two stores, one sampling at the default 1% and one with the planner off,
//! timed in alternating rounds (best round of each). The planner's hooks are
//! on lookup (every key hashed, the looked-up count added) and on put (the
//! key hashed); get has none, so its ratio is the noise floor.

use std::time::Instant;

use anyhow::Context;
use kvfabric_store::{BlockKey, NodeConfig, PutOptions, Registry, Store};
use serde_json::{json, Map, Value};

use super::shared::{gbps, key, layout, BLOCK, ROUNDS};

/// Lookups of the whole chain of stored keys per timed lookup phase.
const LOOKUPS: usize = 2000;

#[derive(Default, Clone, Copy)]
struct Best {
    put: f64,
    get: f64,
    lookup: f64,
}

fn open(n: usize, rate: f64) -> anyhow::Result<Store> {
    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::b((n * BLOCK + (64 << 20)) as u64),
        planner_sample_rate: rate,
        ..Default::default()
    };
    Ok(Store::open(cfg, &mut Registry::default())?)
}

fn round(
    store: &Store,
    sources: &[Vec<u8>],
    keys: &[BlockKey],
    best: &mut Best,
) -> anyhow::Result<()> {
    let n = sources.len();
    let mut dst = vec![0u8; BLOCK];
    store.remove(keys)?;
    let t = Instant::now();
    for (i, s) in sources.iter().enumerate() {
        store.put(key(i), layout(), s, PutOptions::default())?;
    }
    best.put = best.put.max(gbps(n * BLOCK, t.elapsed()));
    let t = Instant::now();
    for k in keys {
        store
            .get_into(k, 0, &mut dst)?
            .context("ram block missing")?;
    }
    best.get = best.get.max(gbps(n * BLOCK, t.elapsed()));
    let t = Instant::now();
    for _ in 0..LOOKUPS {
        anyhow::ensure!(store.lookup(keys).len() == n, "lookup lost blocks");
    }
    let keys_per_s = (LOOKUPS * n) as f64 / t.elapsed().as_secs_f64();
    best.lookup = best.lookup.max(keys_per_s);
    Ok(())
}

/// `ram_*_sampling_on_vs_off` (on / off, best round each) into `out`.
pub(super) fn sampling(sources: &[Vec<u8>], out: &mut Map<String, Value>) -> anyhow::Result<()> {
    let n = sources.len();
    let keys: Vec<BlockKey> = (0..n).map(key).collect();
    let rate = NodeConfig::default().planner_sample_rate;
    // A second store with the planner off is the control: off vs off is
    // what two stores' arenas differ by on this machine with no change at all.
    let (off, control, on) = (open(n, 0.0)?, open(n, 0.0)?, open(n, rate)?);
    let (mut b_on, mut b_off, mut b_ctl) = (Best::default(), Best::default(), Best::default());
    for r in 0..2 * ROUNDS {
        // Rotate which goes first, so warm-up and drift fall on all.
        let mut order = [(&on, &mut b_on), (&off, &mut b_off), (&control, &mut b_ctl)];
        order.rotate_left(r % 3);
        for (store, best) in order {
            round(store, sources, &keys, best)?;
        }
    }
    out.insert("ram_get_off_vs_off".into(), json!(b_ctl.get / b_off.get));
    out.insert(
        "ram_lookup_off_vs_off".into(),
        json!(b_ctl.lookup / b_off.lookup),
    );
    out.insert("planner_sample_rate".into(), json!(rate));
    out.insert(
        "ram_get_sampling_on_vs_off".into(),
        json!(b_on.get / b_off.get),
    );
    out.insert(
        "ram_put_sampling_on_vs_off".into(),
        json!(b_on.put / b_off.put),
    );
    out.insert(
        "ram_lookup_sampling_on_vs_off".into(),
        json!(b_on.lookup / b_off.lookup),
    );
    out.insert(
        "ram_lookup_keys_per_s_sampling_on".into(),
        json!(b_on.lookup),
    );
    out.insert(
        "ram_lookup_keys_per_s_sampling_off".into(),
        json!(b_off.lookup),
    );
    Ok(())
}
