//! Blocks that leave a node's store (evicted or removed) leave the cluster
//! directory promptly — not at the next periodic reconcile, which these
//! tests set to a minute.

use std::time::{Duration, Instant};

use kvfabric_node::cluster::ClusterNode;
use kvfabric_store::{BlockKey, PutOptions};
use kvfabric_testkit::cluster::{data, key, layout, Cluster, Options};

const LIMIT: Duration = Duration::from_secs(60);
/// Far longer than the test: a reconcile never runs during it.
const RECONCILE_MS: u64 = 60_000;

/// Wait until no node lists `holder` for any of `keys` (2 s at most).
async fn wait_withdrawn(reader: &ClusterNode, holder: &str, keys: &[BlockKey]) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let located = reader.locate(keys).await;
        let lingering = located
            .iter()
            .filter(|hs| hs.iter().any(|h| h.node_id == holder))
            .count();
        if lingering == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{lingering} of {} gone blocks are still listed at {holder} after 2 s",
            keys.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_and_removed_blocks_are_withdrawn_without_waiting_for_the_reconcile() {
    tokio::time::timeout(LIMIT, async {
        let l = layout(64); // 32 KiB blocks
        let c = Cluster::start(
            2,
            Options {
                ram: 64 * l.block_bytes() as u64,
                reconcile_interval_ms: RECONCILE_MS,
                ..Options::default()
            },
        )
        .await;
        let (n0, n1) = (&c.nodes[0], &c.nodes[1]);
        // Phase 1: blocks that fit, announced.
        let first: Vec<BlockKey> = (0..32).map(|i| key(20, i)).collect();
        c.put(0, &first, l).await;
        let listed = n1.locate(&first).await;
        assert!(listed.iter().all(|hs| hs.iter().any(|h| h.node_id == "n0")));
        // Phase 2: more blocks than RAM, put without any sync: the first ones are evicted.
        for i in 0..96 {
            let k = key(21, i);
            n0.store()
                .put(k, l, &data(&k, l.block_bytes()), PutOptions::default())
                .unwrap();
        }
        let present = n0.store().exists(&first);
        let evicted: Vec<BlockKey> = first
            .iter()
            .zip(&present)
            .filter(|(_, p)| !**p)
            .map(|(k, _)| *k)
            .collect();
        // Entries n1 owns: n0's own shard would hide them anyway.
        let owned_by_n1: Vec<BlockKey> = evicted
            .iter()
            .filter(|k| n1.view().owner(k).is_some_and(|o| o.node_id == "n1"))
            .copied()
            .collect();
        assert!(
            !owned_by_n1.is_empty(),
            "no evicted block is owned by n1 ({} evicted)",
            evicted.len()
        );
        wait_withdrawn(n1, "n0", &owned_by_n1).await;

        // A removal bypassing the gRPC API is withdrawn as promptly.
        let kept: Vec<BlockKey> = (0..8).map(|i| key(22, i)).collect();
        c.put(0, &kept, l).await;
        let gone: Vec<BlockKey> = kept
            .iter()
            .filter(|k| n1.view().owner(k).is_some_and(|o| o.node_id == "n1"))
            .copied()
            .collect();
        assert!(!gone.is_empty());
        assert!(n1.locate(&gone).await.iter().all(|hs| !hs.is_empty()));
        assert_eq!(n0.store().remove(&gone).unwrap(), gone.len());
        wait_withdrawn(n1, "n0", &gone).await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announce_keys_returns_once_the_blocks_are_registered_at_their_owners() {
    tokio::time::timeout(LIMIT, async {
        let l = layout(64);
        let c = Cluster::start(
            2,
            Options {
                reconcile_interval_ms: RECONCILE_MS,
                ..Options::default()
            },
        )
        .await;
        let (n0, n1) = (&c.nodes[0], &c.nodes[1]);
        let keys: Vec<BlockKey> = (0..16).map(|i| key(23, i)).collect();
        for k in &keys {
            n0.store()
                .put(*k, l, &data(k, l.block_bytes()), PutOptions::default())
                .unwrap();
        }
        n0.announce_keys(&keys).await;
        let located = n1.locate(&keys).await;
        for (i, hs) in located.iter().enumerate() {
            assert!(hs.iter().any(|h| h.node_id == "n0"), "block {i} not found");
        }
    })
    .await
    .expect("test timed out");
}
