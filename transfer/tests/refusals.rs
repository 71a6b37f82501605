//! Two engines in one process, over tcp and over shm: every range a peer may
//! not touch is refused with a precise error and no byte moves; a payload
//! corrupted in flight fails its checksum; notifications arrive.

use kvfabric_testkit::transfer::*;
use kvfabric_transfer::{SegmentId, TransferError, TransferOp, Transport, TransportChoice};

const LEN: u64 = 4 * MIB;

async fn refusals(choice: TransportChoice, expect: Transport) {
    let a = engine(choice, 5000).await;
    let b = engine(choice, 5000).await;
    let peer = b.local_addr().to_string();
    let local_region = region(LEN, 1);
    let remote_region = region(LEN, 2);
    let local = a.register(local_region.clone());
    let remote = b.register(remote_region.clone());
    let gone = b.register(region(LEN, 3));
    b.unregister(gone).unwrap();
    let results = a
        .batch(
            &peer,
            vec![
                // Out of bounds at the tail of a multi-slice WRITE: refused before
                // its in-bounds first slices could land.
                TransferOp::write(local, 0, remote, MIB, LEN),
                TransferOp::read(local, 0, SegmentId(999), 0, 4096),
                TransferOp::write(local, 0, gone, 0, 4096),
                TransferOp::read(local, LEN - 10, remote, 0, 4096),
                TransferOp::read(SegmentId(777), 0, remote, 0, 4096),
                TransferOp::read(local, 0, remote, u64::MAX - 5, 4096),
                TransferOp::read(local, 0, remote, 0, 0),
                TransferOp::read(local, 8192, remote, 8192, 4096),
            ],
        )
        .await;
    assert_eq!(a.transport_for(&peer), Some(expect));
    assert!(
        matches!(results[0], Err(TransferError::OutOfBounds { offset, len, segment_len }) if offset == MIB && len == LEN && segment_len == LEN),
        "{:?}",
        results[0]
    );
    assert!(
        matches!(&results[1], Err(TransferError::UnknownSegment { segment: 999, side }) if side == &peer),
        "{:?}",
        results[1]
    );
    assert!(
        matches!(&results[2], Err(TransferError::UnknownSegment { segment, .. }) if *segment == gone.0),
        "{:?}",
        results[2]
    );
    assert!(
        matches!(&results[3], Err(TransferError::OutOfBounds { .. })),
        "{:?}",
        results[3]
    );
    assert!(
        matches!(&results[4], Err(TransferError::UnknownSegment { segment: 777, side }) if side == "local"),
        "{:?}",
        results[4]
    );
    assert!(
        matches!(&results[5], Err(TransferError::OutOfBounds { .. })),
        "{:?}",
        results[5]
    );
    assert!(
        matches!(&results[6], Err(TransferError::InvalidArgument(_))),
        "{:?}",
        results[6]
    );
    results[7].as_ref().unwrap();
    // No byte of a refused op moved: the remote still holds its own stream.
    assert_eq!(
        kvfabric_testkit::testdata::first_mismatch(bytes(&remote_region, 0, LEN), 2, 0),
        None
    );
    // The only byte range that changed locally is the one good READ.
    assert_eq!(
        bytes(&local_region, 8192, 4096),
        bytes(&remote_region, 8192, 4096)
    );
    assert_eq!(
        kvfabric_testkit::testdata::first_mismatch(bytes(&local_region, 0, 8192), 1, 0),
        None
    );
    assert_eq!(
        kvfabric_testkit::testdata::first_mismatch(
            bytes(&local_region, 12288, LEN - 12288),
            1,
            12288
        ),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_ranges_move_no_bytes_tcp() {
    refusals(TransportChoice::Tcp, Transport::Tcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_ranges_move_no_bytes_shm() {
    refusals(TransportChoice::Shm, Transport::Shm).await;
}

async fn corrupted_write(choice: TransportChoice) {
    let a = engine(choice, 5000).await;
    let b = engine(choice, 5000).await;
    let peer = b.local_addr().to_string();
    let local = a.register(region(LEN, 1));
    let remote = b.register(region(LEN, 2));
    a.inject_payload_corruption(1);
    let op = TransferOp::write(local, 0, remote, 0, LEN).with_checksum();
    let results = a.batch(&peer, vec![op]).await;
    assert!(
        matches!(results[0], Err(TransferError::Checksum { .. })),
        "{results:?}"
    );
    // One-shot: the retry goes through and the notification follows it.
    let mut notes = b.notifications();
    let report = a
        .batch_then_notify(&peer, vec![op], b"blocks are in".to_vec())
        .await;
    report.ops[0].as_ref().unwrap();
    report.notified.unwrap();
    let note = notes.recv().await.unwrap();
    assert_eq!(note.payload, b"blocks are in");
    assert_eq!(note.from_pid, std::process::id());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_write_fails_checksum_then_retry_and_notify_tcp() {
    corrupted_write(TransportChoice::Tcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_write_fails_checksum_then_retry_and_notify_shm() {
    corrupted_write(TransportChoice::Shm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_op_withholds_notification_and_metrics_count() {
    let mut registry = prometheus_client::registry::Registry::default();
    let a = kvfabric_transfer::TransferEngine::start(
        kvfabric_transfer::TransferConfig {
            transport: TransportChoice::Tcp,
            ..Default::default()
        },
        &mut registry,
    )
    .await
    .unwrap();
    let b = engine(TransportChoice::Tcp, 5000).await;
    let peer = b.local_addr().to_string();
    let local = a.register(region(LEN, 1));
    let remote = b.register(region(LEN, 2));
    let report = a
        .batch_then_notify(
            &peer,
            vec![
                TransferOp::read(local, 0, remote, 0, MIB),
                TransferOp::read(local, 0, remote, LEN, 1),
            ],
            b"x".to_vec(),
        )
        .await;
    assert!(report.ops[0].is_ok());
    assert!(report.ops[1].is_err());
    assert!(report.notified.is_err());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(r#"kvfabric_transfer_bytes_total{transport="Tcp",direction="Read"} 1048576"#),
        "{text}"
    );
    assert!(
        text.contains(r#"kvfabric_transfer_errors_total{transport="Tcp"} 1"#),
        "{text}"
    );
    assert!(text.contains("kvfabric_transfer_in_flight_ops 0"), "{text}");
    let meta = a.segment_meta(local).unwrap();
    assert_eq!(meta.len, LEN);
    assert_eq!(meta.node, a.local_addr().to_string());
    assert!(a.segment_meta(SegmentId(12345)).is_err());
}
