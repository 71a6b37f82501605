//! The connector against a real single-node fabric (no engine): saves store
//! only what the cluster lacks, loads land verified in the right blocks, a
//! full save queue drops instead of waiting, misses load nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytesize::ByteSize;
use kvfabric_connector::{
    ConnectorConfig, EmbeddedNode, FabricConnector, KvConnector, KvMemory, SaveBlock,
};
use kvfabric_node::cluster::ClusterConfig;
use kvfabric_store::{BlockKey, BlockOrder, DType, KvLayout, NodeConfig};
use kvfabric_transfer::SharedRegion;
use prometheus_client::registry::Registry;

const BLOCKS: usize = 16;

fn layout() -> KvLayout {
    KvLayout {
        layers: 2,
        kv_heads: 2,
        head_dim: 8,
        dtype: DType::F32,
        block_tokens: 16,
        order: BlockOrder::LayerKvTokenHead,
    }
}

fn key(i: u8) -> BlockKey {
    BlockKey([i; 32])
}

async fn node() -> EmbeddedNode {
    let cfg = NodeConfig {
        node_id: "solo".into(),
        grpc_listen: "127.0.0.1:0".parse().unwrap(),
        http_listen: "127.0.0.1:0".parse().unwrap(),
        ram_capacity: ByteSize::mib(16),
        ..NodeConfig::default()
    };
    EmbeddedNode::start(cfg, ClusterConfig::default())
        .await
        .expect("node")
}

fn memory() -> KvMemory {
    let l = layout();
    let region = SharedRegion::create("test-pool", BLOCKS * l.block_bytes()).expect("region");
    KvMemory {
        region: Arc::new(region),
        layout: l,
        blocks: BLOCKS,
    }
}

fn fill(mem: &KvMemory, block: u32, byte: u8) {
    let n = mem.block_bytes();
    // SAFETY: test-owned region, no concurrent access to this block.
    unsafe { mem.region.slice_mut(mem.block_offset(block) as usize, n) }
        .unwrap()
        .fill(byte);
}

fn bytes(mem: &KvMemory, block: u32) -> Vec<u8> {
    // SAFETY: as above.
    unsafe {
        mem.region
            .slice(mem.block_offset(block) as usize, mem.block_bytes())
    }
    .unwrap()
    .to_vec()
}

fn connector(node: &EmbeddedNode, mem: &KvMemory, cfg: ConnectorConfig) -> Arc<dyn KvConnector> {
    let connect = FabricConnector::connect_fn(node.node().clone(), cfg);
    connect(mem.clone(), &mut Registry::default()).expect("connector")
}

/// Wait (bounded) for `n` finished saves.
fn finished(c: &dyn KvConnector, n: usize) -> Vec<kvfabric_connector::SaveDone> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = Vec::new();
    while out.len() < n {
        assert!(Instant::now() < deadline, "saves did not finish");
        out.extend(c.finished_saves(Duration::from_millis(20)));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saves_store_missing_keys_and_loads_verify_into_the_right_blocks() {
    let n = node().await;
    let mem = memory();
    let c = connector(&n, &mem, ConnectorConfig::default());
    let c2 = c.clone();
    let mem2 = mem.clone();
    tokio::task::spawn_blocking(move || {
        let c = c2.as_ref();
        for b in 0..3u32 {
            fill(&mem2, b, 10 + b as u8);
            assert!(c.save(SaveBlock {
                owner: None,
                key: key(b as u8),
                block: b,
                tokens: 16,
                tag: b as u64
            }));
        }
        let done = finished(c, 3);
        assert!(done.iter().all(|d| d.stored));
        assert!(c.flush(Duration::from_secs(5)));
        assert_eq!(c.stats().saved_blocks, 3);

        // The same key again: the cluster has it, nothing is copied.
        assert!(c.save(SaveBlock {
            owner: None,
            key: key(1),
            block: 5,
            tokens: 16,
            tag: 9
        }));
        let again = finished(c, 1);
        assert!(again[0].stored && again[0].block == 5 && again[0].tag == 9);
        assert_eq!(c.stats().save_skipped_blocks, 1);

        // Lookup: the leading run only.
        let found = |keys: Vec<BlockKey>| c.start_lookup(keys).wait(Duration::from_secs(5));
        assert_eq!(found(vec![key(0), key(1), key(2), key(7)]), Some(3));
        assert_eq!(found(vec![key(7), key(0)]), Some(0));

        // Load into other blocks: same bytes, checksum verified.
        let load = c.start_load(vec![(key(0), 8), (key(1), 9), (key(2), 10)]);
        assert_eq!(load.wait(Duration::from_secs(10)), Some(3));
        for (b, src) in [(8u32, 0u32), (9, 1), (10, 2)] {
            assert_eq!(bytes(&mem2, b), bytes(&mem2, src));
        }
        // A missing key ends the load there: blocks after it are not used.
        let load = c.start_load(vec![(key(0), 11), (key(42), 12), (key(2), 13)]);
        assert_eq!(load.wait(Duration::from_secs(10)), Some(1));
        let s = c.stats();
        assert_eq!(s.loaded_blocks, 4);
        assert!(s.load_failed_blocks >= 2);
        // Both loads timed: what `bench reuse` reports as load_ms.
        assert_eq!(s.loads, 2);
        assert!(s.load_micros > 0);
    })
    .await
    .expect("blocking part");
    drop(c);
    n.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_save_queue_drops_saves_without_waiting() {
    let n = node().await;
    let mem = memory();
    let cfg = ConnectorConfig {
        max_pending_saves: 1,
        ..ConnectorConfig::default()
    };
    let c = connector(&n, &mem, cfg);
    let c2 = c.clone();
    tokio::task::spawn_blocking(move || {
        let c = c2.as_ref();
        let started = Instant::now();
        let queued: usize = (0..BLOCKS as u32)
            .filter(|&b| {
                c.save(SaveBlock {
                    owner: None,
                    key: key(100 + b as u8),
                    block: b,
                    tokens: 16,
                    tag: 0,
                })
            })
            .count();
        // Sixteen calls never wait for the worker.
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(
            queued < BLOCKS,
            "a queue of one cannot take sixteen at once"
        );
        let s = c.stats();
        assert_eq!(s.save_dropped_blocks as usize, BLOCKS - queued);
        finished(c, queued);
        assert!(c.flush(Duration::from_secs(5)));
        // Saving off: nothing is taken or counted as dropped.
    })
    .await
    .expect("blocking part");
    let off = connector(
        &n,
        &memory(),
        ConnectorConfig {
            save: false,
            ..ConnectorConfig::default()
        },
    );
    assert!(!off.save(SaveBlock {
        owner: None,
        key: key(200),
        block: 0,
        tokens: 16,
        tag: 0
    }));
    assert_eq!(off.stats().save_dropped_blocks, 0);
    drop(c);
    drop(off);
    n.stop().await;
}

/// Blocks the connector saved carry per-layer checksums and load layer by
/// layer; a block another client stored without them loads whole against
/// the store's checksum; with `layerwise = false` every load is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saved_blocks_stream_layer_by_layer_and_plain_blocks_load_whole() {
    let n = node().await;
    let mem = memory();
    let c = connector(&n, &mem, ConnectorConfig::default());
    let whole_only = connector(
        &n,
        &mem,
        ConnectorConfig {
            layerwise: false,
            ..ConnectorConfig::default()
        },
    );
    // A block stored by another client: KV bytes only.
    let plain: Vec<u8> = (0..mem.block_bytes()).map(|i| (i % 253) as u8).collect();
    n.node()
        .store()
        .put(
            key(50),
            layout(),
            &plain,
            kvfabric_store::PutOptions::default(),
        )
        .expect("put");
    let (c2, w2, mem2) = (c.clone(), whole_only.clone(), mem.clone());
    tokio::task::spawn_blocking(move || {
        let c = c2.as_ref();
        for b in 0..3u32 {
            // Different bytes per layer, so a layer landing in the wrong place shows.
            let n = mem2.block_bytes();
            // SAFETY: test-owned region, no concurrent access to this block.
            let dst = unsafe { mem2.region.slice_mut(mem2.block_offset(b) as usize, n) }.unwrap();
            for (i, x) in dst.iter_mut().enumerate() {
                *x = (i * 7 + b as usize * 13 + i / mem2.layout.layer_bytes()) as u8;
            }
            assert!(c.save(SaveBlock {
                owner: None,
                key: key(60 + b as u8),
                block: b,
                tokens: 16,
                tag: 0
            }));
        }
        finished(c, 3);
        assert!(c.flush(Duration::from_secs(5)));

        let load = c.start_load(vec![(key(60), 4), (key(61), 5), (key(62), 6)]);
        assert_eq!(load.wait(Duration::from_secs(10)), Some(3));
        assert_eq!(load.streaming(), Some(3), "the load streamed");
        assert!(load.wait_layer(1, Instant::now()), "every layer published");
        assert_eq!(c.stats().streamed_loads, 1);
        for (b, src) in [(4u32, 0u32), (5, 1), (6, 2)] {
            assert_eq!(bytes(&mem2, b), bytes(&mem2, src));
        }

        let load = c.start_load(vec![(key(50), 7)]);
        assert_eq!(load.wait(Duration::from_secs(10)), Some(1));
        assert_eq!(load.streaming(), None, "no trailer: loaded whole");
        assert_eq!(bytes(&mem2, 7), plain);
        assert_eq!(c.stats().streamed_loads, 1);

        let w = w2.as_ref();
        let load = w.start_load(vec![(key(60), 8), (key(61), 9)]);
        assert_eq!(load.wait(Duration::from_secs(10)), Some(2));
        assert_eq!(load.streaming(), None);
        assert_eq!(bytes(&mem2, 9), bytes(&mem2, 1));
        assert_eq!(w.stats().streamed_loads, 0);
        assert_eq!(w.stats().loaded_blocks, 2);
    })
    .await
    .expect("blocking part");
    drop(c);
    drop(whole_only);
    n.stop().await;
}
