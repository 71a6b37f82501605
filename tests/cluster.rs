//! Multi-process cluster tests: a real etcd and real `kvfabric node`
//! processes on loopback. Each test is bounded (every wait has a deadline);
//! etcd leases use a 2 s TTL so a crash is noticed within TTL + 1 s.

use std::time::Duration;

use kvfabric_node::cluster::client;
use kvfabric_testkit::procs::node::*;
use kvfabric_testkit::{eventually, free_port, EtcdProcess};

const TTL_MS: u64 = 2000;

fn etcd_flags(etcd: &EtcdProcess, prefix: &str) -> Vec<String> {
    vec![
        "--etcd".into(),
        etcd.endpoint(),
        "--etcd-prefix".into(),
        prefix.into(),
        "--lease-ttl-ms".into(),
        TTL_MS.to_string(),
    ]
}

/// Put on A, found and read bit-exact from C; A crashes -> C stops reporting
/// A's blocks within TTL + 1 s with misses only; A restarts with its disk
/// tier -> its durable blocks are re-announced and found again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cross_node_read_crash_and_restart() {
    let etcd = EtcdProcess::start().expect("etcd");
    let dir = tempfile::tempdir().unwrap();
    let flags = etcd_flags(&etcd, "/t-crash");
    let mut a = NodeProc::start("a", dir.path(), &flags, true);
    let b = NodeProc::start("b", dir.path(), &flags, false);
    let c = NodeProc::start("c", dir.path(), &flags, false);
    for n in [&a, &b, &c] {
        wait_members(n, &["a", "b", "c"], Duration::from_secs(15)).await;
    }

    let ks = keys(1, 12);
    let mut ca = a.client().await;
    put_all(&mut ca, &ks, true).await;
    let mut cc = c.client().await;
    let (n, holders) = lookup(&mut cc, &ks).await;
    assert_eq!(
        n,
        ks.len(),
        "every block put on A is found from C\n{}",
        c.log()
    );
    assert!(holders.iter().all(|h| h == "a"), "{holders:?}");
    let first = client::get_block(&mut cc, &ks[0]).await.expect("get");
    assert!(
        first.is_some(),
        "remote read from C\n--- c ---\n{}\n--- a ---\n{}",
        c.log(),
        a.log()
    );
    for k in ks.iter().chain(ks.iter()) {
        let got = client::get_block(&mut cc, k).await.expect("get");
        assert!(
            got.is_some(),
            "remote read from C\n--- c ---\n{}\n--- a ---\n{}",
            c.log(),
            a.log()
        );
    }
    let served = read_all_exact(&mut cc, &ks, &[&c, &a]).await;
    assert!(
        served.iter().all(|s| s == "a"),
        "remote reads come from A: {served:?}"
    );
    // A block only on C is local there, and a gap ends the prefix.
    let (n, _) = lookup(&mut cc, &[ks[0], keys(99, 1)[0], ks[1]]).await;
    assert_eq!(n, 1);

    a.kill();
    let killed = std::time::Instant::now();
    let (_, took) = eventually(
        "C stops reporting A's blocks",
        Duration::from_secs(8),
        || {
            let mut cc = cc.clone();
            let ks = ks.clone();
            async move {
                // Every request answers; blocks of a dead holder are misses.
                let (n, holders) = lookup(&mut cc, &ks).await;
                let present = exists(&mut cc, &ks).await;
                for k in ks.iter().take(2) {
                    match client::get_block(&mut cc, k).await {
                        Ok(_) => {}
                        Err(s) => panic!("get must be a hit or a miss, not {s}"),
                    }
                }
                (n == 0 && holders.is_empty() && present.iter().all(|p| !p)).then_some(())
            }
        },
    )
    .await;
    let since_kill = killed.elapsed();
    assert!(
        since_kill <= Duration::from_millis(TTL_MS + 1000),
        "C still reported A's blocks {since_kill:?} after the crash (poll took {took:?})"
    );
    assert!(
        client::get_block(&mut cc, &ks[0]).await.unwrap().is_none(),
        "a miss, not an error"
    );

    a.restart();
    wait_members(&c, &["a", "b", "c"], Duration::from_secs(15)).await;
    eventually(
        "A's durable blocks found again from C",
        Duration::from_secs(10),
        || {
            let mut cc = cc.clone();
            let ks = ks.clone();
            async move { (lookup(&mut cc, &ks).await.0 == ks.len()).then_some(()) }
        },
    )
    .await;
    let served = read_all_exact(&mut cc, &ks, &[&c, &a]).await;
    assert!(served.iter().all(|s| s == "a"));
    drop(b);
}

/// A 4th node joins -> every block is still found from every node; it
/// leaves cleanly -> the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_join_and_clean_leave_keep_every_block() {
    let etcd = EtcdProcess::start().expect("etcd");
    let dir = tempfile::tempdir().unwrap();
    let flags = etcd_flags(&etcd, "/t-join");
    let nodes = [
        NodeProc::start("a", dir.path(), &flags, false),
        NodeProc::start("b", dir.path(), &flags, false),
        NodeProc::start("c", dir.path(), &flags, false),
    ];
    for n in &nodes {
        wait_members(n, &["a", "b", "c"], Duration::from_secs(15)).await;
    }
    let mut all = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let ks = keys(10 + i as u32, 10);
        put_all(&mut n.client().await, &ks, false).await;
        all.push(ks);
    }
    let all_found = |node: &NodeProc| {
        let all = all.clone();
        let c = node.grpc.clone();
        async move {
            let mut cl = client::connect(&c, Duration::from_secs(2)).await.ok()?;
            for ks in &all {
                if lookup(&mut cl, ks).await.0 != ks.len() {
                    return None;
                }
            }
            Some(())
        }
    };
    for n in &nodes {
        eventually(
            &format!("all blocks found from {}", n.id),
            Duration::from_secs(5),
            || all_found(n),
        )
        .await;
    }

    let mut d = NodeProc::start("d", dir.path(), &flags, false);
    wait_members(&nodes[0], &["a", "b", "c", "d"], Duration::from_secs(15)).await;
    for n in nodes.iter().chain([&d]) {
        eventually(
            &format!("after the join, all blocks found from {}", n.id),
            Duration::from_secs(8),
            || all_found(n),
        )
        .await;
    }
    let mut cd = d.client().await;
    read_all_exact(&mut cd, &all[0], &[]).await;

    d.terminate();
    wait_members(&nodes[1], &["a", "b", "c"], Duration::from_secs(3)).await;
    for n in &nodes {
        eventually(
            &format!("after the leave, all blocks found from {}", n.id),
            Duration::from_secs(8),
            || all_found(n),
        )
        .await;
    }
    let mut cb = nodes[1].client().await;
    read_all_exact(&mut cb, &all[2], &[]).await;
}

/// etcd stopped for 10 s: nodes keep serving lookups and remote reads with
/// the last view; when etcd returns they re-register, and a new node joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_outage_nodes_keep_serving_then_rejoin() {
    let mut etcd = EtcdProcess::start().expect("etcd");
    let dir = tempfile::tempdir().unwrap();
    let flags = etcd_flags(&etcd, "/t-outage");
    let a = NodeProc::start("a", dir.path(), &flags, false);
    let b = NodeProc::start("b", dir.path(), &flags, false);
    wait_members(&b, &["a", "b"], Duration::from_secs(15)).await;
    wait_members(&a, &["a", "b"], Duration::from_secs(15)).await;
    let ks = keys(20, 8);
    put_all(&mut a.client().await, &ks, false).await;
    let mut cb = b.client().await;
    assert_eq!(lookup(&mut cb, &ks).await.0, ks.len());

    etcd.stop();
    let outage = std::time::Instant::now();
    while outage.elapsed() < Duration::from_secs(10) {
        assert_eq!(
            lookup(&mut cb, &ks).await.0,
            ks.len(),
            "serving through the etcd outage\n{}",
            b.log()
        );
        read_all_exact(&mut cb, &ks[..2], &[]).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    etcd.restart().expect("etcd restart");
    let c = NodeProc::start("c", dir.path(), &flags, false);
    wait_members(&c, &["a", "b", "c"], Duration::from_secs(15)).await;
    wait_members(&a, &["a", "b", "c"], Duration::from_secs(15)).await;
    let mut cc = c.client().await;
    eventually(
        "blocks found from the node that joined after the outage",
        Duration::from_secs(8),
        || {
            let mut cc = cc.clone();
            let ks = ks.clone();
            async move { (lookup(&mut cc, &ks).await.0 == ks.len()).then_some(()) }
        },
    )
    .await;
    read_all_exact(&mut cc, &ks, &[]).await;
}

/// Static peers (no etcd): put on A found and read from C; A crashes -> C
/// stops reporting A's blocks within the failure timeout + 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_peers_cross_node_read_and_crash() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let ids = ["a", "b", "c"];
    let peers: Vec<String> = ids
        .iter()
        .zip(&ports)
        .map(|(id, (g, t))| format!("{id}=127.0.0.1:{g}=127.0.0.1:{t}"))
        .collect();
    let flags = vec!["--peers".to_string(), peers.join(",")];
    let mut nodes: Vec<NodeProc> = ids
        .iter()
        .zip(&ports)
        .map(|(id, (g, t))| NodeProc::start_on(id, dir.path(), &flags, false, *g, *t))
        .collect();
    for n in &nodes {
        wait_members(n, &ids, Duration::from_secs(15)).await;
    }
    let ks = keys(30, 8);
    put_all(&mut nodes[0].client().await, &ks, false).await;
    let mut cc = nodes[2].client().await;
    eventually("C finds A's blocks", Duration::from_secs(5), || {
        let mut cc = cc.clone();
        let ks = ks.clone();
        async move { (lookup(&mut cc, &ks).await.0 == ks.len()).then_some(()) }
    })
    .await;
    let served = read_all_exact(&mut cc, &ks, &[]).await;
    assert!(served.iter().all(|s| s == "a"), "{served:?}");

    nodes[0].kill();
    let killed = std::time::Instant::now();
    eventually(
        "C stops reporting A's blocks",
        Duration::from_secs(8),
        || {
            let mut cc = cc.clone();
            let ks = ks.clone();
            async move { (exists(&mut cc, &ks).await.iter().all(|p| !p)).then_some(()) }
        },
    )
    .await;
    // failure_timeout (2 s default) + one probe interval + 1 s.
    assert!(
        killed.elapsed() <= Duration::from_millis(3500),
        "{:?}",
        killed.elapsed()
    );
    assert!(client::get_block(&mut cc, &ks[0]).await.unwrap().is_none());
}
