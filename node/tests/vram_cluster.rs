//! The VRAM tier inside a cluster node (feature `cuda`, a CUDA device; CI
//! has neither and the test prints why it skips): a block put only into
//! node 0's VRAM is listed in the directory, and node 1 reads it over the
//! tcp transport bit-exact (node 0 copies it down into its registered RAM
//! arena through the pinned d2h staging, then serves the READ).
#![cfg(feature = "cuda")]

use std::time::Duration;

use kvfabric_store::vram::VramTier;
use kvfabric_store::Tier;
use kvfabric_store::{BlockKey, PutOptions};
use kvfabric_testkit::cluster::{data, key, layout, Cluster, Options};

/// Every test stops itself.
const LIMIT: Duration = Duration::from_secs(60);

fn gpu() -> bool {
    match kvfabric_transfer::cuda::device_count() {
        Ok(n) if n > 0 => true,
        other => {
            eprintln!("skipped: no CUDA device ({other:?})");
            false
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_held_only_in_vram_is_read_by_a_peer() {
    if !gpu() {
        return;
    }
    tokio::time::timeout(LIMIT, async {
        let opts = Options {
            vram: 16 << 20,
            ..Options::default()
        };
        let c = Cluster::start(2, opts).await;
        let store = c.nodes[0].store().clone();
        let tier = VramTier::open(&store).expect("VRAM tier opens");
        let l = layout(64);
        let keys: Vec<BlockKey> = (0..4).map(|i| key(7, i)).collect();
        for k in &keys {
            tier.put(*k, l, &data(k, l.block_bytes()), PutOptions::default())
                .expect("put into VRAM");
        }
        let infos = store.block_infos(&keys);
        assert!(
            infos
                .iter()
                .all(|i| i.is_some_and(|i| i.tier == Tier::Vram)),
            "{infos:?}"
        );
        assert_eq!(store.lookup(&keys).len(), 4, "lookup sees VRAM blocks");
        c.nodes[0].sync().await;
        for k in &keys {
            let got = c.nodes[1].get(k).await.expect("get").expect("found");
            assert_eq!(got.data, data(k, l.block_bytes()), "{k:?}");
            assert_eq!(got.node_id, "n0");
        }
        // Node 0 copied them down into RAM and still holds them in VRAM.
        assert_eq!(tier.contains(&keys), vec![true; 4]);
        let infos = store.block_infos(&keys);
        assert!(infos.iter().all(|i| i.is_some()));
        // Dropped from VRAM, they are still in node 0's RAM and readable.
        tier.remove(&keys);
        c.nodes[0].sync().await;
        let got = c.nodes[1].get(&keys[0]).await.expect("get").expect("found");
        assert_eq!(got.data, data(&keys[0], l.block_bytes()));
    })
    .await
    .expect("test stops itself");
}
