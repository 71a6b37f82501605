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

/// Open sockets of process `pid` (connections and listeners).
fn sockets_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_tcp_batches_leaves_at_most_the_idle_cap_open_until_the_timeout() {
    const CAP: usize = 2;
    const IDLE_MS: u64 = 5_000;
    const BURST: u64 = 6;
    let size = 4 * MIB;
    let peer = Peer::spawn(PEER, &["--size", &size.to_string(), "--seed", "5"]).await;
    let peer_pid = peer.child.id().expect("peer pid");
    let mut registry = Registry::default();
    let config = TransferConfig {
        transport: TransportChoice::Tcp,
        op_timeout_ms: 20_000,
        connections_per_peer: 1,
        idle_connections_per_peer: CAP,
        idle_timeout_ms: IDLE_MS,
        ..TransferConfig::default()
    };
    let engine = Arc::new(TransferEngine::start(config, &mut registry).await.unwrap());
    let local = region(size, 0);
    let seg = engine.register(local.clone());
    let read = |k: u64| TransferOp::read(seg, k * 4096, peer.segment, k * 4096, 4096);
    engine.batch(&peer.addr, vec![read(0)]).await[0]
        .as_ref()
        .unwrap();
    let before = sockets_of(peer_pid);
    // A burst: the peer stopped, BURST one-slice batches each open their
    // own connection (none is idle), then all finish at once.
    peer.signal(libc::SIGSTOP);
    let batches: Vec<_> = (0..BURST)
        .map(|k| {
            let (engine, addr, op) = (engine.clone(), peer.addr.clone(), read(k));
            tokio::spawn(async move { engine.batch(&addr, vec![op]).await })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while links_opened(&registry, "Tcp") < BURST && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    peer.signal(libc::SIGCONT);
    for b in batches {
        for r in b.await.unwrap() {
            r.unwrap();
        }
    }
    assert!(links_opened(&registry, "Tcp") >= BURST);
    // Only CAP connections stay pooled: the peer sees the others close.
    // (Before the bound, all BURST stayed open for the engine's life.)
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut now = sockets_of(peer_pid);
    while now > before + CAP - 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        now = sockets_of(peer_pid);
    }
    assert_eq!(
        now,
        before + CAP - 1,
        "peer sockets: {before} with one pooled connection, {now} after the burst"
    );
    // The kept ones work: CAP concurrent batches open none.
    let opened = links_opened(&registry, "Tcp");
    let batches: Vec<_> = (0..CAP as u64)
        .map(|k| {
            let (engine, addr, op) = (engine.clone(), peer.addr.clone(), read(k));
            tokio::spawn(async move { engine.batch(&addr, vec![op]).await })
        })
        .collect();
    for b in batches {
        for r in b.await.unwrap() {
            r.unwrap();
        }
    }
    assert_eq!(links_opened(&registry, "Tcp"), opened);
    // Idle past the timeout: the next batch closes the CAP idle connections
    // and opens one, so the peer is back to one pooled connection.
    tokio::time::sleep(Duration::from_millis(IDLE_MS + 500)).await;
    engine.batch(&peer.addr, vec![read(0)]).await[0]
        .as_ref()
        .unwrap();
    assert_eq!(links_opened(&registry, "Tcp"), opened + 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut now = sockets_of(peer_pid);
    while now > before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        now = sockets_of(peer_pid);
    }
    assert_eq!(now, before, "peer sockets after the idle timeout");
}

/// Connections of this process to `addr` (`127.0.0.1:port`) that an fd
/// still holds (a row of /proc/self/net/tcp with an inode).
fn held_connections_to(addr: &str) -> usize {
    let sa: std::net::SocketAddrV4 = addr.parse().expect("peer address");
    let want = format!("{:08X}:{:04X}", u32::from(*sa.ip()).swap_bytes(), sa.port());
    std::fs::read_to_string("/proc/self/net/tcp")
        .expect("/proc/self/net/tcp")
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(2) == Some(&want.as_str()) && f.get(9).is_some_and(|i| *i != "0")
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tcp_connections_to_a_killed_peer_close_with_no_further_batch() {
    let size = 4 * MIB;
    let mut gone = Peer::spawn(PEER, &["--size", &size.to_string(), "--seed", "6"]).await;
    let mut registry = Registry::default();
    let config = TransferConfig {
        transport: TransportChoice::Tcp,
        op_timeout_ms: 20_000,
        connections_per_peer: 2,
        ..TransferConfig::default()
    };
    let engine = TransferEngine::start(config, &mut registry).await.unwrap();
    let local = region(size, 0);
    let seg = engine.register(local.clone());
    let op = TransferOp::read(seg, 0, gone.segment, 0, 4096);
    engine.batch(&gone.addr, vec![op]).await[0]
        .as_ref()
        .unwrap();
    assert!(held_connections_to(&gone.addr) >= 1);
    gone.child.start_kill().expect("kill the peer");
    gone.child.wait().await.expect("peer reaped");
    // No batch runs after the kill (the soak's end: the load stopped), yet
    // the pooled connections to the killed peer close: the sweep runs on a
    // timer, not with the next batch, so they do not stay in CLOSE_WAIT.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut held = held_connections_to(&gone.addr);
    while held > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        held = held_connections_to(&gone.addr);
    }
    assert_eq!(held, 0, "connections to the killed peer still held");
    drop(engine);
}
