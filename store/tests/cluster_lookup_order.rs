//! A cluster node's lookups reach its RAM tier's eviction order: the
//! default `adaptive` order chooses LIRS or LRU by replaying lookups on
//! its shadow caches, and a cluster node answers lookups itself (across the
//! cluster), not through `Store::lookup`. Before they were fed, `adaptive`
//! on a cluster never left LRU (#29: `bench agentic --compare-eviction lru`
//! gave LRU's hit ratio). Each node's order judges its own part of a
//! lookup: the blocks it holds and those it will be given, not blocks only
//! another node holds.

use std::time::Duration;

use kvfabric_store::{BlockKey, NodeConfig, PutOptions};
use kvfabric_testkit::cluster::{data, key, layout, Cluster, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_nodes_lookups_steer_the_adaptive_order() {
    tokio::time::timeout(Duration::from_secs(60), async {
        assert_eq!(
            NodeConfig::default().eviction,
            kvfabric_store::EvictionPolicy::Adaptive,
            "the testkit's nodes run the default order"
        );
        let l = layout(64); // 32 KiB blocks, one arena slot each
        let c = Cluster::start(
            1,
            Options {
                ram: 100 * l.block_bytes() as u64,
                // One eviction per put when full, as `bench eviction` and
                // `bench agentic --compare-eviction` run the tier.
                watermarks: Some((1.0, 1.0)),
                ..Options::default()
            },
        )
        .await;
        let n = &c.nodes[0];
        // 20 sessions round-robin, each a shared 4-block prefix and 8
        // blocks of its own (164 blocks over a tier of 100): LRU evicts a
        // session's own blocks just before it returns (it hits the prefix
        // alone), LIRS keeps about half the sessions.
        let chain = |s: u32| -> Vec<BlockKey> {
            (0..4)
                .map(|i| key(1, i))
                .chain((0..8).map(|i| key(2, s * 64 + i)))
                .collect()
        };
        let mut own_hits = 0;
        for round in 0..12 {
            for s in 0..20 {
                let keys = chain(s);
                let found = n.lookup(&keys).await.len();
                for k in &keys[..found] {
                    drop(n.store().lease(k).expect("lease").expect("held"));
                }
                for k in &keys[found..] {
                    n.store()
                        .put(*k, l, &data(k, l.block_bytes()), PutOptions::default())
                        .expect("put");
                }
                if round >= 6 {
                    own_hits += found.saturating_sub(4);
                }
            }
        }
        // Rounds 6-11: 120 returns of 8 own blocks each.
        assert!(
            own_hits >= 200,
            "{own_hits} of 960 own blocks hit in the late rounds: the order stayed LRU"
        );
    })
    .await
    .expect("test timed out");
}

/// Two nodes: the shared prefix was saved on n1, the sessions run on n0.
/// n0's order judges n0's part of each lookup (its sessions' own blocks),
/// not the whole chain: counted whole, the prefix that only n1 holds broke
/// every lookup's prefix on n0 and its shadows never hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_held_by_another_node_leaves_the_order_its_own_part() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let l = layout(64);
        let c = Cluster::start(
            2,
            Options {
                ram: 100 * l.block_bytes() as u64,
                watermarks: Some((1.0, 1.0)),
                ..Options::default()
            },
        )
        .await;
        let prefix: Vec<BlockKey> = (0..4).map(|i| key(1, i)).collect();
        c.put(1, &prefix, l).await;
        let n = &c.nodes[0];
        let mut own_hits = 0;
        for round in 0..12 {
            for s in 0..20 {
                let keys: Vec<BlockKey> = prefix
                    .iter()
                    .copied()
                    .chain((0..8).map(|i| key(2, s * 64 + i)))
                    .collect();
                let found = n.lookup(&keys).await.len();
                assert!(found >= 4, "the prefix on n1 is found from n0");
                for k in &keys[4..found] {
                    drop(n.store().lease(k).expect("lease").expect("held"));
                }
                for k in &keys[found..] {
                    n.store()
                        .put(*k, l, &data(k, l.block_bytes()), PutOptions::default())
                        .expect("put");
                }
                if round >= 6 {
                    own_hits += found - 4;
                }
            }
        }
        // 160 own blocks over n0's 100: LRU hits none of them.
        assert!(
            own_hits >= 200,
            "{own_hits} of 960 own blocks hit in the late rounds: n0's order stayed LRU"
        );
    })
    .await
    .expect("test timed out");
}
