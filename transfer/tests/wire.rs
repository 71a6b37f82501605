//! Wire compression on tcp (`wire_compression`): READs of KV-like blocks
//! that name their element width arrive byte-identical whether they travel
//! encoded or raw; `off` never and `always` always asks for encoding; a
//! payload corrupted in flight is refused before it is decoded (no wrong
//! byte lands), and one that does not decode is a typed error; the server
//! sends what does not compress raw; a peer whose hello does not announce
//! the codec is never sent the flag.

use std::sync::Arc;

use kvfabric_testkit::transfer::{bytes, region, MIB};
use kvfabric_transfer::{
    SharedRegion, TransferConfig, TransferEngine, TransferError, TransferOp, TransportChoice,
    WireCompression,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Six full slices and a short tail.
const LEN: u64 = 6 * MIB + 8192;

async fn engine(wire: WireCompression) -> TransferEngine {
    let config = TransferConfig {
        transport: TransportChoice::Tcp,
        wire_compression: wire,
        op_timeout_ms: 5000,
        ..Default::default()
    };
    let mut registry = prometheus_client::registry::Registry::default();
    TransferEngine::start(config, &mut registry).await.unwrap()
}

/// A region of LEN bytes of KV-like values of `width` bytes.
fn kv_region(width: usize, seed: u64) -> Arc<SharedRegion> {
    let data = kvfabric_codec::sample::kv_like(width, LEN as usize, seed);
    let r = Arc::new(SharedRegion::create("kv", LEN as usize).unwrap());
    // SAFETY: the region is new and this test its only user.
    unsafe { r.slice_mut(0, LEN as usize).unwrap() }.copy_from_slice(&data);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_sends_kv_blocks_encoded_and_they_arrive_byte_identical() {
    for width in [2u8, 4] {
        let a = engine(WireCompression::Always).await;
        let b = engine(WireCompression::Off).await;
        let peer = b.local_addr().to_string();
        let remote_region = kv_region(width as usize, 11);
        let remote = b.register(remote_region.clone());
        let local_region = region(2 * LEN, 5);
        let local = a.register(local_region.clone());
        let ops = vec![
            TransferOp::read(local, 0, remote, 0, LEN)
                .with_element_width(width)
                .with_checksum(),
            TransferOp::read(local, LEN, remote, 0, LEN).with_element_width(width),
        ];
        for r in a.batch(&peer, ops).await {
            r.unwrap();
        }
        let want = bytes(&remote_region, 0, LEN);
        assert!(
            bytes(&local_region, 0, LEN) == want,
            "width {width}, checksummed op"
        );
        assert!(bytes(&local_region, LEN, LEN) == want, "width {width}");
        let got = a.metrics().wire_totals();
        assert!(got.read.slices >= 12, "width {width}: {got:?}");
        assert!(got.read.wire_bytes < got.read.raw_bytes, "{got:?}");
        let served = served_when(&b, |t| t.served == got.read).await;
        assert_eq!(got.read, served.served, "both ends count the same slices");
        assert_eq!(got.served.slices, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_and_unhinted_ops_never_travel_encoded() {
    let off = engine(WireCompression::Off).await;
    let always = engine(WireCompression::Always).await;
    let b = engine(WireCompression::Always).await;
    let peer = b.local_addr().to_string();
    let remote_region = kv_region(2, 12);
    let remote = b.register(remote_region.clone());
    for (a, width) in [(&off, 2), (&always, 0)] {
        let local_region = region(LEN, 0);
        let local = a.register(local_region.clone());
        let op = TransferOp::read(local, 0, remote, 0, LEN)
            .with_element_width(width)
            .with_checksum();
        a.batch(&peer, vec![op]).await[0].clone().unwrap();
        assert!(bytes(&local_region, 0, LEN) == bytes(&remote_region, 0, LEN));
        assert_eq!(a.metrics().wire_totals().read.slices, 0, "width {width}");
    }
    assert_eq!(b.metrics().wire_totals().served.slices, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incompressible_slices_are_sent_raw_even_when_asked() {
    let a = engine(WireCompression::Always).await;
    let b = engine(WireCompression::Off).await;
    let peer = b.local_addr().to_string();
    let remote_region = region(LEN, 3);
    let remote = b.register(remote_region.clone());
    let local_region = region(LEN, 0);
    let local = a.register(local_region.clone());
    let op = TransferOp::read(local, 0, remote, 0, LEN)
        .with_element_width(2)
        .with_checksum();
    a.batch(&peer, vec![op]).await[0].clone().unwrap();
    assert!(bytes(&local_region, 0, LEN) == bytes(&remote_region, 0, LEN));
    assert_eq!(b.metrics().wire_totals().served.slices, 0);
    assert_eq!(a.metrics().wire_totals().read.slices, 0);
}

/// The server flips the first byte of the next payload it sends (the
/// codec header of an encoded one), under its checksum: refused before
/// decoding, so the destination keeps its old bytes; without a checksum
/// the header does not parse, a typed error, again before any byte lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_encoded_payload_is_refused_and_no_wrong_byte_lands() {
    let a = engine(WireCompression::Always).await;
    let b = engine(WireCompression::Off).await;
    let peer = b.local_addr().to_string();
    let remote_region = kv_region(2, 13);
    let remote = b.register(remote_region.clone());
    let local_region = region(MIB, 9);
    let local = a.register(local_region.clone());
    let before = bytes(&local_region, 0, MIB).to_vec();
    let op = TransferOp::read(local, 0, remote, 0, MIB).with_element_width(2);

    b.inject_payload_corruption(1);
    let r = a.batch(&peer, vec![op.with_checksum()]).await;
    assert!(
        matches!(r[0], Err(TransferError::Checksum { len, .. }) if len == MIB),
        "{r:?}"
    );
    assert!(bytes(&local_region, 0, MIB) == before, "no byte landed");

    b.inject_payload_corruption(1);
    let r = a.batch(&peer, vec![op]).await;
    assert!(
        matches!(&r[0], Err(TransferError::Decode { offset: 0, len, .. }) if *len == MIB),
        "{r:?}"
    );
    assert!(bytes(&local_region, 0, MIB) == before, "no byte landed");

    // One-shot faults: the same read now lands the right bytes, encoded.
    a.batch(&peer, vec![op.with_checksum()]).await[0]
        .clone()
        .unwrap();
    assert!(bytes(&local_region, 0, MIB) == bytes(&remote_region, 0, MIB));
    let served = served_when(&b, |t| t.served.slices == 3).await;
    assert_eq!(served.served.slices, 3);
}

/// The server's wire totals once `done` holds, or after 5 s: it counts a
/// slice once its send returned, which can be after the client has the
/// bytes and its batch ended.
async fn served_when(
    b: &TransferEngine,
    done: impl Fn(&kvfabric_transfer::WireTotals) -> bool,
) -> kvfabric_transfer::WireTotals {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let t = b.metrics().wire_totals();
        if done(&t) || std::time::Instant::now() >= deadline {
            return t;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// A peer speaking hello version 1 without (or with) the wire-codec bit:
/// accepts one connection, answers one READ raw, and returns its request.
async fn hello_peer(codec: bool) -> (String, tokio::task::JoinHandle<[u8; 56]>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let served = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut theirs = [0u8; 124];
        s.read_exact(&mut theirs).await.unwrap();
        let mut hello = [0u8; 124];
        hello[..4].copy_from_slice(b"KVFT");
        hello[4..6].copy_from_slice(&1u16.to_le_bytes());
        hello[6] = if codec { 2 } else { 0 };
        s.write_all(&hello).await.unwrap();
        let mut req = [0u8; 56];
        s.read_exact(&mut req).await.unwrap();
        let len = u64::from_le_bytes(req[40..48].try_into().unwrap());
        let mut resp = [0u8; 24];
        resp[16..24].copy_from_slice(&len.to_le_bytes());
        s.write_all(&resp).await.unwrap();
        s.write_all(&vec![7u8; len as usize]).await.unwrap();
        req
    });
    (addr, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_the_codec_in_its_hello_is_never_sent_the_flag() {
    for codec in [false, true] {
        let a = engine(WireCompression::Always).await;
        let (peer, served) = hello_peer(codec).await;
        let local_region = region(65536, 0);
        let local = a.register(local_region.clone());
        let op = TransferOp::read(local, 0, kvfabric_transfer::SegmentId(1), 0, 65536)
            .with_element_width(2);
        a.batch(&peer, vec![op]).await[0].clone().unwrap();
        assert!(bytes(&local_region, 0, 65536).iter().all(|&b| b == 7));
        let req = served.await.unwrap();
        let (flags, width) = (req[1], req[2]);
        if codec {
            assert_eq!(
                (flags & 4, width),
                (4, 2),
                "a peer that announces it is asked"
            );
        } else {
            assert_eq!((flags & 4, width), (0, 0), "an old peer is never asked");
        }
    }
}
