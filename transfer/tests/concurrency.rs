//! Concurrent batches to one peer run in parallel: each checks out its own
//! shm link from the peer's pool (instead of queueing on one link), the links
//! go back to the pool, and every byte arrives.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvfabric_testkit::testdata;
use kvfabric_testkit::transfer::*;
use kvfabric_transfer::{TransferConfig, TransferEngine, TransferOp, Transport, TransportChoice};
use prometheus_client::registry::Registry;

/// The transfer crate's fixture binary.
const PEER: &str = env!("CARGO_BIN_EXE_kvfabric-transfer-peer");

/// `kvfabric_transfer_links_opened_total` for `transport` (0 when absent).
fn links_opened(registry: &Registry, transport: &str) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    let prefix = format!("kvfabric_transfer_links_opened_total{{transport=\"{transport}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_batches_to_one_peer_each_get_their_own_shm_link() {
    const N: u64 = 4;
    let size = 64 * MIB;
    let peer = Peer::spawn(PEER, &["--size", &size.to_string(), "--seed", "9"]).await;
    let mut registry = Registry::default();
    let config = TransferConfig {
        transport: TransportChoice::Auto,
        op_timeout_ms: 20_000,
        connections_per_peer: N as usize,
        ..TransferConfig::default()
    };
    let engine = Arc::new(TransferEngine::start(config, &mut registry).await.unwrap());
    let local = region(size, 0);
    let seg = engine.register(local.clone());
    // Warm up: shm is chosen and one link is open (and idle again).
    let warm = engine
        .batch(
            &peer.addr,
            vec![TransferOp::read(seg, 0, peer.segment, 0, 4096)],
        )
        .await;
    warm[0].as_ref().unwrap();
    assert_eq!(engine.transport_for(&peer.addr), Some(Transport::Shm));
    assert_eq!(links_opened(&registry, "Shm"), 1);

    // Stop the peer: each batch now waits, on the link it holds, for the
    // owner's range check. A peer with one shared link would let only one
    // batch in at a time, and the count below would stay at 1.
    peer.signal(libc::SIGSTOP);
    let part = size / N;
    let batches: Vec<_> = (0..N)
        .map(|k| {
            let (engine, addr) = (engine.clone(), peer.addr.clone());
            let op = TransferOp::read(seg, k * part, peer.segment, k * part, part).with_checksum();
            tokio::spawn(async move { engine.batch(&addr, vec![op]).await })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while links_opened(&registry, "Shm") < N && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let opened = links_opened(&registry, "Shm");
    peer.signal(libc::SIGCONT);
    assert_eq!(opened, N, "{N} batches in flight at once need {N} links");
    for b in batches {
        for r in b.await.unwrap() {
            r.unwrap();
        }
    }
    assert_eq!(
        testdata::first_mismatch(bytes(&local, 0, size), 9, 0),
        None,
        "READ data differs"
    );

    // The links went back to the pool: another round of concurrent batches
    // (WRITEs this time, checked against the READs' bytes) opens none.
    let batches: Vec<_> = (0..N)
        .map(|k| {
            let (engine, addr) = (engine.clone(), peer.addr.clone());
            let op = TransferOp::write(seg, k * part, peer.segment, k * part, part).with_checksum();
            tokio::spawn(async move { engine.batch(&addr, vec![op]).await })
        })
        .collect();
    for b in batches {
        for r in b.await.unwrap() {
            r.unwrap();
        }
    }
    assert_eq!(links_opened(&registry, "Shm"), N);
    assert_eq!(engine.transport_for(&peer.addr), Some(Transport::Shm));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_shm_link_is_dropped_and_the_next_batch_reconnects() {
    let size = 4 * MIB;
    let mut peer = Peer::spawn(PEER, &["--size", &size.to_string(), "--seed", "3"]).await;
    let engine = engine(TransportChoice::Auto, 2000).await;
    let local = region(size, 0);
    let seg = engine.register(local.clone());
    let op = TransferOp::read(seg, 0, peer.segment, 0, size).with_checksum();
    engine.batch(&peer.addr, vec![op]).await[0]
        .as_ref()
        .unwrap();
    assert_eq!(engine.transport_for(&peer.addr), Some(Transport::Shm));
    // The peer goes away: the pooled link is dead; the batch fails and the
    // pool is forgotten, so the transport is re-decided next time.
    peer.child.kill().await.unwrap();
    let started = Instant::now();
    let r = engine.batch(&peer.addr, vec![op]).await;
    assert!(r[0].is_err(), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(engine.transport_for(&peer.addr), None);
    // A new peer: the next batch decides again and works.
    let peer = Peer::spawn(PEER, &["--size", &size.to_string(), "--seed", "4"]).await;
    engine
        .batch(
            &peer.addr,
            vec![TransferOp::read(seg, 0, peer.segment, 0, size)],
        )
        .await[0]
        .as_ref()
        .unwrap();
    assert_eq!(testdata::first_mismatch(bytes(&local, 0, size), 4, 0), None);
}
