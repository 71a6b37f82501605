//! A cluster's lookups reach its nodes' RAM tier eviction orders: the
//! default `adaptive` order chooses LIRS or LRU by replaying lookups on
//! its shadow caches, and a cluster node answers lookups itself (across the
//! cluster), not through `Store::lookup`. Unfed, `adaptive` on a cluster
//! never leaves LRU (`bench agentic --compare-eviction lru` gives LRU's hit
//! ratio). Each key's owner replays the lookups of its keys
//! (`cluster::order_feed`): a node's order judges the cluster's traffic,
//! including blocks only peers read and blocks looked up after it evicted
//! them, not only its own lookups.

use std::time::Duration;

use kvfabric_store::{AdaptiveMode, BlockKey, NodeConfig, PutOptions};
use kvfabric_testkit::cluster::{data, key, layout, Cluster, Options};

/// `nodes` nodes of 100 blocks of `l` in RAM each, evicting one block per
/// put when full, as `bench eviction` and `bench agentic
/// --compare-eviction` run the tier (watermarks 1.0 / 1.0).
async fn tight_cluster(nodes: usize, l: kvfabric_store::KvLayout) -> Cluster {
    Cluster::start(
        nodes,
        Options {
            ram: 100 * l.block_bytes() as u64,
            watermarks: Some((1.0, 1.0)),
            ..Options::default()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_nodes_lookups_steer_the_adaptive_order() {
    tokio::time::timeout(Duration::from_secs(60), async {
        assert_eq!(
            NodeConfig::default().eviction,
            kvfabric_store::EvictionPolicy::Adaptive,
            "the testkit's nodes run the default order"
        );
        let l = layout(64); // 32 KiB blocks, one arena slot each
        let c = tight_cluster(1, l).await;
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
                // Announced, as the connector's saves are.
                n.sync().await;
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
/// A prefix that only n1 holds does not break n0's judgement (fed n0's
/// whole lookups, n0's shadows never hit: they lacked the prefix).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_held_by_another_node_leaves_the_order_its_own_part() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let l = layout(64);
        let c = tight_cluster(2, l).await;
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
                n.sync().await;
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

/// Two nodes: n1's blocks are read only by n0 (leased through n1's
/// `lease_for_peer`), n1 never looks anything up, and the blocks missing
/// everywhere are put on n1 again, in a loop longer than n1's tier. n1's
/// order must leave LRU for LIRS: fed only by its own tier's lookups and
/// puts (before `order_feed`), its shadows saw puts alone and it evicted by
/// LRU throughout, hitting none of the sessions' own blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_read_only_by_a_peer_steer_their_holders_order() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let l = layout(64);
        let c = tight_cluster(2, l).await;
        let (reader, holder) = (&c.nodes[0], &c.nodes[1]);
        let chain = |s: u32| -> Vec<BlockKey> {
            (0..4)
                .map(|i| key(1, i))
                .chain((0..8).map(|i| key(2, s * 64 + i)))
                .collect()
        };
        let mut own_hits = 0;
        for round in 0..14 {
            for s in 0..20 {
                let keys = chain(s);
                let holders = reader.lookup(&keys).await;
                let found = holders.len();
                let hints: Vec<_> = holders.into_iter().map(Some).collect();
                let leased = reader.lease_many(&keys[..found], &hints).await;
                assert!(
                    leased
                        .iter()
                        .all(|b| b.as_ref().is_some_and(|b| !b.is_local())),
                    "every found block is leased from the holder"
                );
                drop(leased);
                c.put(1, &keys[found..], l).await;
                if round >= 8 {
                    own_hits += found.saturating_sub(4);
                }
            }
        }
        let stats = holder.store().adaptive_stats().expect("the default order");
        assert!(
            stats.cluster_fed,
            "a cluster node's shadows are the cluster's"
        );
        assert!(
            reader
                .store()
                .adaptive_stats()
                .is_some_and(|s| s.cluster_fed),
            "on every node"
        );
        assert_eq!(
            stats.mode,
            AdaptiveMode::Lirs,
            "the holder's order after a loop only a peer reads: {stats:?}"
        );
        assert!(
            stats.lirs_hits > stats.lru_hits,
            "its LIRS shadow led: {stats:?}"
        );
        // Rounds 8-13: 120 returns of 8 own blocks each; LRU hits none.
        assert!(
            own_hits >= 200,
            "{own_hits} of 960 own blocks hit in the late rounds: the holder stayed LRU ({stats:?})"
        );
        assert!(
            stats.cluster_fed,
            "a cluster node's shadows are the cluster's"
        );
        assert!(
            reader
                .store()
                .adaptive_stats()
                .is_some_and(|s| s.cluster_fed),
            "on every node"
        );
    })
    .await
    .expect("test timed out");
}
