//! Two-process tests: a spawned `kvfabric-transfer-peer` and an engine in the
//! test process, over tcp and shm. 1 GiB both ways with every byte verified,
//! a peer killed or stalled mid-batch, a corrupted payload.

use std::time::{Duration, Instant};

use kvfabric_testkit::testdata;
use kvfabric_testkit::transfer::*;
use kvfabric_transfer::{TransferError, TransferOp, Transport, TransportChoice};

/// The transfer crate's fixture binary.
const PEER: &str = env!("CARGO_BIN_EXE_kvfabric-transfer-peer");
const GIB: u64 = 1 << 30;

async fn one_gib_both_ways(choice: TransportChoice, arg: &str, expect: Transport) {
    let mut peer = Peer::spawn(
        PEER,
        &[
            "--size",
            &GIB.to_string(),
            "--seed",
            "11",
            "--transport",
            arg,
        ],
    )
    .await;
    assert_eq!(peer.len, GIB);
    let engine = engine(choice, 5000).await;
    let local = region(GIB, 0);
    let seg = engine.register(local.clone());
    let op = 4 * MIB;
    let reads = (0..GIB / op)
        .map(|i| TransferOp::read(seg, i * op, peer.segment, i * op, op).with_checksum())
        .collect();
    for r in engine.batch(&peer.addr, reads).await {
        r.unwrap();
    }
    assert_eq!(engine.transport_for(&peer.addr), Some(expect));
    assert_eq!(
        testdata::first_mismatch(bytes(&local, 0, GIB), 11, 0),
        None,
        "READ data differs"
    );
    // Fresh data the other way; the peer verifies every byte on notification.
    testdata::fill(unsafe { local.slice_mut(0, GIB as usize).unwrap() }, 22, 0);
    let writes = (0..GIB / op)
        .map(|i| TransferOp::write(seg, i * op, peer.segment, i * op, op).with_checksum())
        .collect();
    let report = engine
        .batch_then_notify(&peer.addr, writes, b"verify 22".to_vec())
        .await;
    for r in report.ops {
        r.unwrap();
    }
    report.notified.unwrap();
    assert_eq!(peer.next_line().await, "VERIFY OK");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_of_random_data_both_ways_over_tcp_then_shm() {
    one_gib_both_ways(TransportChoice::Tcp, "tcp", Transport::Tcp).await;
    one_gib_both_ways(TransportChoice::Auto, "auto", Transport::Shm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_killed_mid_batch_fails_unfinished_ops_within_timeout() {
    let size = 512 * MIB;
    let peer = Peer::spawn(PEER, &["--size", &size.to_string(), "--seed", "5"]).await;
    let timeout_ms = 2000;
    let engine = std::sync::Arc::new(engine(TransportChoice::Tcp, timeout_ms).await);
    let local = region(size, 0);
    let seg = engine.register(local.clone());
    let op = 4 * MIB;
    // 4 GiB of READs (the peer's segment 8 times over): far longer than the kill delay.
    let ops: Vec<_> = (0..8 * size / op)
        .map(|i| TransferOp::read(seg, (i * op) % size, peer.segment, (i * op) % size, op))
        .collect();
    let n = ops.len();
    let started = Instant::now();
    let e2 = engine.clone();
    let addr = peer.addr.clone();
    let batch = tokio::spawn(async move { e2.batch(&addr, ops).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    peer.signal(libc::SIGKILL);
    let results = tokio::time::timeout(Duration::from_millis(timeout_ms + 3000), batch)
        .await
        .expect("batch finished within the timeout")
        .unwrap();
    assert!(started.elapsed() < Duration::from_millis(timeout_ms + 2000));
    assert_eq!(results.len(), n);
    let failed = results.iter().filter(|r| r.is_err()).count();
    assert!(
        failed > 0,
        "the kill landed after the batch; nothing failed"
    );
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(
            matches!(
                r,
                TransferError::Connection { .. } | TransferError::Timeout { .. }
            ),
            "{r}"
        );
    }
    // Every op reported successful holds exactly the peer's bytes.
    for (i, r) in results.iter().enumerate() {
        if r.is_ok() {
            let at = (i as u64 * op) % size;
            assert_eq!(
                testdata::first_mismatch(bytes(&local, at, op), 5, at),
                None,
                "op {i} ok with bad data"
            );
        }
    }
}

async fn stall_then_recover(choice: TransportChoice, arg: &str) {
    let size = 64 * MIB;
    let peer = Peer::spawn(
        PEER,
        &[
            "--size",
            &size.to_string(),
            "--seed",
            "9",
            "--transport",
            arg,
        ],
    )
    .await;
    let engine = engine(choice, 1000).await;
    let local = region(size, 0);
    let seg = engine.register(local.clone());
    let ops = || {
        (0..16)
            .map(|i| TransferOp::read(seg, i * 4 * MIB, peer.segment, i * 4 * MIB, 4 * MIB))
            .collect()
    };
    assert!(engine
        .batch(&peer.addr, ops())
        .await
        .iter()
        .all(|r| r.is_ok()));
    peer.signal(libc::SIGSTOP);
    let started = Instant::now();
    let results = engine.batch(&peer.addr, ops()).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(2500),
        "stalled batch took {took:?}"
    );
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Err(TransferError::Timeout { .. }))),
        "{results:?}"
    );
    peer.signal(libc::SIGCONT);
    unsafe { local.slice_mut(0, local.len()).unwrap().fill(0) };
    let results = engine.batch(&peer.addr, ops()).await;
    assert!(
        results.iter().all(|r| r.is_ok()),
        "no reconnect after the stall: {results:?}"
    );
    assert_eq!(testdata::first_mismatch(bytes(&local, 0, size), 9, 0), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_peer_times_out_then_next_batch_reconnects_tcp() {
    stall_then_recover(TransportChoice::Tcp, "tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_peer_times_out_then_next_batch_reconnects_shm() {
    stall_then_recover(TransportChoice::Shm, "auto").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_corrupted_by_the_peer_fails_its_checksum() {
    let peer = Peer::spawn(
        PEER,
        &[
            "--size",
            &(8 * MIB).to_string(),
            "--seed",
            "3",
            "--corrupt",
            "1",
        ],
    )
    .await;
    let engine = engine(TransportChoice::Tcp, 5000).await;
    let local = region(8 * MIB, 0);
    let seg = engine.register(local.clone());
    let results = engine
        .batch(
            &peer.addr,
            vec![TransferOp::read(seg, 0, peer.segment, 0, MIB).with_checksum()],
        )
        .await;
    assert!(
        matches!(results[0], Err(TransferError::Checksum { .. })),
        "{results:?}"
    );
    // The corruption was one-shot: the same read now succeeds with the right bytes.
    let results = engine
        .batch(
            &peer.addr,
            vec![TransferOp::read(seg, 0, peer.segment, 0, MIB).with_checksum()],
        )
        .await;
    results[0].as_ref().unwrap();
    assert_eq!(testdata::first_mismatch(bytes(&local, 0, MIB), 3, 0), None);
}
