//! The directory sync is event-driven: puts are announced and removals
//! withdrawn as they happen (no periodic snapshot of the store), an owner
//! that restarts is re-seeded by a paced refresh, and the refresh walks the
//! store chunk by chunk while puts and gets go on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvfabric_node::cluster::ClusterNode;
use kvfabric_store::{BlockKey, PutOptions};
use kvfabric_testkit::cluster::{data, key, layout, Cluster, Options};

const LIMIT: Duration = Duration::from_secs(60);

/// Keys of `keys` whose directory entry `node` owns.
fn owned_by(node: &ClusterNode, keys: &[BlockKey]) -> Vec<BlockKey> {
    let id = node.info().node_id.clone();
    keys.iter()
        .filter(|k| node.view().owner(k).is_some_and(|o| o.node_id == id))
        .copied()
        .collect()
}

/// Wait (up to `within`) until `reader` lists `holder` for every key
/// (`listed`) or for none of them (`!listed`).
async fn wait_listed(
    reader: &ClusterNode,
    holder: &str,
    keys: &[BlockKey],
    listed: bool,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let located = reader.locate(keys).await;
        let wrong = located
            .iter()
            .filter(|hs| hs.iter().any(|h| h.node_id == holder) != listed)
            .count();
        if wrong == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{wrong} of {} blocks are {} at {holder} after {within:?}",
            keys.len(),
            if listed { "not listed" } else { "still listed" }
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_is_announced_and_a_removal_withdrawn_without_any_sync_call() {
    tokio::time::timeout(LIMIT, async {
        let l = layout(64);
        // No periodic work runs during the test.
        let c = Cluster::start(
            2,
            Options {
                reconcile_interval_ms: 60_000,
                ..Options::default()
            },
        )
        .await;
        let (n0, n1) = (&c.nodes[0], &c.nodes[1]);
        let keys: Vec<BlockKey> = (0..32).map(|i| key(40, i)).collect();
        for k in &keys {
            n0.store()
                .put(*k, l, &data(k, l.block_bytes()), PutOptions::default())
                .unwrap();
        }
        let at_n1 = owned_by(n1, &keys);
        assert!(!at_n1.is_empty());
        wait_listed(n1, "n0", &at_n1, true, Duration::from_secs(2)).await;
        assert_eq!(n0.store().remove(&at_n1).unwrap(), at_n1.len());
        wait_listed(n1, "n0", &at_n1, false, Duration::from_secs(2)).await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_restarts_is_reseeded_by_the_refresh() {
    tokio::time::timeout(LIMIT, async {
        let l = layout(64);
        let mut c = Cluster::start(
            2,
            Options {
                reconcile_interval_ms: 500,
                // The restart is quicker than this: the view never changes.
                failure_timeout_ms: 10_000,
                ..Options::default()
            },
        )
        .await;
        let keys: Vec<BlockKey> = (0..64).map(|i| key(41, i)).collect();
        c.put(0, &keys, l).await;
        let at_n1 = owned_by(&c.nodes[1], &keys);
        assert!(!at_n1.is_empty());
        wait_listed(&c.nodes[1], "n0", &at_n1, true, Duration::from_secs(2)).await;
        let views_before = c.nodes[0].view();
        c.restart(1).await;
        let n1 = c.nodes[1].clone();
        let deadline = Instant::now() + Duration::from_secs(5);
        while n1.view().nodes.len() < 2 {
            assert!(Instant::now() < deadline, "the restarted node sees no peer");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            n1.locate(&at_n1).await.iter().all(|hs| hs.is_empty()),
            "the restarted owner came back with entries"
        );
        // Well before the old 30-period full refresh (15 s here).
        wait_listed(&n1, "n0", &at_n1, true, Duration::from_secs(5)).await;
        assert_eq!(
            c.nodes[0].view(),
            views_before,
            "n0 saw the restart in its view"
        );
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_refresh_lets_puts_and_gets_through_between_chunks() {
    tokio::time::timeout(LIMIT, async {
        let l = layout(8); // 4 KiB blocks
        let blocks = 20_000u32;
        let c = Cluster::start(
            2,
            Options {
                ram: (blocks as u64 + 50_000) * 4096,
                reconcile_interval_ms: 200,
                refresh_chunk_blocks: 500,
                refresh_chunks_per_period: 4,
                ..Options::default()
            },
        )
        .await;
        let n0 = c.nodes[0].clone();
        let keys: Vec<BlockKey> = (0..blocks).map(|i| key(42, i)).collect();
        c.put(0, &keys, l).await;
        // Wait for refreshes started by the cluster forming to end.
        while n0.refresh_status().await.walked.is_some() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(n0.refresh_status().await.held, keys.len());
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicU64::new(0));
        let worker = {
            let (store, stop, ops, keys) =
                (n0.store().clone(), stop.clone(), ops.clone(), keys.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; l.block_bytes()];
                let mut i = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let k = key(43, i);
                    store
                        .put(k, l, &data(&k, l.block_bytes()), PutOptions::default())
                        .unwrap();
                    let got = store.get_into(&keys[i as usize % keys.len()], 0, &mut buf);
                    assert!(matches!(got, Ok(Some(_))));
                    ops.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                    std::thread::sleep(Duration::from_micros(200));
                }
            })
        };
        n0.full_refresh().await;
        // (keys walked, ops done) while the refresh is under way.
        let mut samples = Vec::new();
        loop {
            let st = n0.refresh_status().await;
            let Some(walked) = st.walked else { break };
            samples.push((walked, ops.load(Ordering::Relaxed)));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.store(true, Ordering::Relaxed);
        worker.join().expect("worker");
        let total = keys.len();
        let mid: Vec<&(usize, u64)> = samples
            .iter()
            .filter(|(w, _)| *w > 0 && *w < total)
            .collect();
        let interleaved = mid.windows(2).any(|w| w[1].0 > w[0].0 && w[1].1 > w[0].1);
        assert!(
            interleaved,
            "no puts/gets completed between two chunks of the walk: {samples:?}"
        );
    })
    .await
    .expect("test timed out");
}
