//! A RAM tier that evicts in bursts (the node's default watermarks: full at
//! 0.95 of capacity, emptied to 0.85) keeps the scan- and loop-resistant
//! orders' gains.
//!
//! The workload is LRU's worst case: a loop over half again as many blocks
//! as the tier holds, each looked up, read when held and put when not. LRU
//! hits nothing; LIRS keeps a fixed part of the loop. Before the LIR set was
//! sized to the eviction floor, a burst demoted LIR blocks from the bottom
//! of the stack (LRU's choice) and the blocks put after it became LIR
//! unproven, so LIRS and `adaptive` hit nothing here either.

use kvfabric_store::{EvictionPolicy, NodeConfig, PutOptions, Registry, Store};
use kvfabric_testkit::blocks::{key, layout};

const TIER: usize = 200;
const LOOPED: u32 = 300;
const ROUNDS: usize = 12;

/// Blocks hit per round of the loop after the first two, on a tier of
/// `TIER` blocks at the node's default watermarks.
fn loop_hits(eviction: EvictionPolicy) -> Vec<usize> {
    // 4 KiB blocks: one arena slot each.
    let layout = layout(8);
    let d = NodeConfig::default();
    assert!(d.high_watermark < 1.0 && d.low_watermark < d.high_watermark);
    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::b((TIER * layout.block_bytes()) as u64),
        eviction,
        ..d
    };
    let store = Store::open(cfg, &mut Registry::default()).expect("store");
    let block = vec![5u8; layout.block_bytes()];
    let mut per_round = Vec::new();
    for round in 0..ROUNDS {
        let mut hits = 0;
        for i in 0..LOOPED {
            let k = key(1, i);
            if store.lookup(&[k]).is_empty() {
                store
                    .put(k, layout, &block, PutOptions::default())
                    .expect("put");
            } else {
                drop(store.lease(&k).expect("lease").expect("held block"));
                hits += 1;
            }
        }
        if round >= 2 {
            per_round.push(hits);
        }
    }
    per_round
}

#[test]
fn loop_resistant_orders_keep_their_gain_when_the_tier_evicts_in_bursts() {
    let lru = loop_hits(EvictionPolicy::Lru);
    assert!(
        lru.iter().all(|&h| h == 0),
        "LRU on a loop longer than the tier: {lru:?}"
    );
    // The tier holds 170-190 blocks; LIRS keeps its LIR set (~0.84 of the
    // tier) whole and MIN would hit ~180 a round.
    for eviction in [EvictionPolicy::Lirs, EvictionPolicy::Adaptive] {
        let hits = loop_hits(eviction);
        eprintln!("{eviction:?}: {hits:?} blocks hit per round");
        let late = &hits[hits.len() - 6..];
        assert!(
            late.iter().all(|&h| h >= TIER / 2),
            "{eviction:?} at the default watermarks: {hits:?} blocks hit per round"
        );
    }
}
