//! Transport selection around rdma, and the rdma data path where a device exists.
//!
//! Without a device (or without the `rdma` feature) the engine never picks
//! rdma: `auto` still gives shm or tcp and works, an explicit `rdma` choice is
//! refused with `Unsupported`. The data-path test needs an RDMA device and
//! says it was skipped otherwise.

use std::io::Write;

use kvfabric_testkit::testdata;
use kvfabric_testkit::transfer::*;
use kvfabric_transfer::{TransferError, TransferOp, Transport, TransportChoice};

/// Say a test was skipped, on the real stderr (libtest captures `eprintln!`).
fn skipped(why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
}

fn has_device() -> bool {
    #[cfg(feature = "rdma")]
    {
        !kvfabric_transfer::rdma::device_names().is_empty()
    }
    #[cfg(not(feature = "rdma"))]
    {
        false
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_device_rdma_is_never_chosen_and_batches_work() {
    if has_device() {
        skipped("an RDMA device exists; this test covers hosts without one");
        return;
    }
    let len = 4 * MIB;
    for (choice, expect) in [
        (TransportChoice::Auto, Transport::Shm),
        (TransportChoice::Tcp, Transport::Tcp),
    ] {
        let a = engine(choice, 5000).await;
        let b = engine(choice, 5000).await;
        let peer = b.local_addr().to_string();
        let local = region(len, 0);
        let seg = a.register(local.clone());
        let remote = b.register(region(len, 5));
        assert_eq!(b.segment_meta(remote).unwrap().keys.rdma, None);
        let op = TransferOp::read(seg, 0, remote, 0, len).with_checksum();
        a.batch(&peer, vec![op]).await[0].as_ref().unwrap();
        assert_eq!(a.transport_for(&peer), Some(expect));
        assert_eq!(testdata::first_mismatch(bytes(&local, 0, len), 5, 0), None);
    }
    // Explicit rdma cannot be met: every op fails, nothing is chosen.
    let a = engine(TransportChoice::Rdma, 5000).await;
    let b = engine(TransportChoice::Rdma, 5000).await;
    let peer = b.local_addr().to_string();
    let seg = a.register(region(len, 0));
    let remote = b.register(region(len, 5));
    let r = a
        .batch(&peer, vec![TransferOp::read(seg, 0, remote, 0, 4096)])
        .await;
    assert!(matches!(r[0], Err(TransferError::Unsupported(_))), "{r:?}");
    assert_eq!(a.transport_for(&peer), None);
}

/// READs and WRITEs of several slices over rdma between two engines on this
/// host's device, bytes and checksums verified; a corrupted payload and an
/// out-of-bounds range fail their op only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_data_path_moves_verified_bytes() {
    if !has_device() {
        skipped("no RDMA device (or built without the rdma feature): rdma data path NOT exercised");
        return;
    }
    let len = 16 * MIB;
    let a = engine(TransportChoice::Rdma, 5000).await;
    let b = engine(TransportChoice::Rdma, 5000).await;
    let peer = b.local_addr().to_string();
    let local = region(len, 0);
    let seg = a.register(local.clone());
    let remote_region = region(len, 7);
    let remote = b.register(remote_region.clone());
    assert!(b.segment_meta(remote).unwrap().keys.rdma.is_some());
    let half = len / 2;
    let results = a
        .batch(
            &peer,
            vec![
                TransferOp::read(seg, 0, remote, 0, half).with_checksum(),
                TransferOp::read(seg, half, remote, half, half),
                TransferOp::read(seg, 0, remote, len - 1, 2),
            ],
        )
        .await;
    assert_eq!(a.transport_for(&peer), Some(Transport::Rdma));
    results[0].as_ref().unwrap();
    results[1].as_ref().unwrap();
    assert!(
        matches!(results[2], Err(TransferError::OutOfBounds { .. })),
        "{results:?}"
    );
    assert_eq!(testdata::first_mismatch(bytes(&local, 0, len), 7, 0), None);
    // WRITE fresh data back, checksummed.
    testdata::fill(unsafe { local.slice_mut(0, len as usize).unwrap() }, 8, 0);
    let w = TransferOp::write(seg, 0, remote, 0, len).with_checksum();
    a.batch(&peer, vec![w]).await[0].as_ref().unwrap();
    assert_eq!(
        testdata::first_mismatch(bytes(&remote_region, 0, len), 8, 0),
        None
    );
    // A corrupted payload fails its checksum, once.
    a.inject_payload_corruption(1);
    let r = a.batch(&peer, vec![w]).await;
    assert!(matches!(r[0], Err(TransferError::Checksum { .. })), "{r:?}");
    a.batch(&peer, vec![w]).await[0].as_ref().unwrap();
    assert_eq!(a.transport_for(&peer), Some(Transport::Rdma));
}
