//! The remote connector: engines whose fabric node is a separate
//! `kvfabric node` process (reached over gRPC), two nodes on a real etcd.
//! What engine 1 computed through node a, engine 2 loads through node b,
//! bit-exact with a cold run.

use std::time::Duration;

use kvfabric_connector::{ConnectorConfig, RemoteConnector};
use kvfabric_testkit::fabric::*;
use kvfabric_testkit::procs::node::{wait_members, NodeProc};
use kvfabric_testkit::EtcdProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_on_remote_nodes_reuse_each_others_prefixes_bit_exact() {
    let etcd = EtcdProcess::start().expect("etcd");
    let dir = tempfile::tempdir().unwrap();
    let flags = vec![
        "--etcd".to_string(),
        etcd.endpoint(),
        "--etcd-prefix".into(),
        "/t-remote".into(),
    ];
    let a = NodeProc::start("a", dir.path(), &flags, false);
    let b = NodeProc::start("b", dir.path(), &flags, false);
    for n in [&a, &b] {
        wait_members(n, &["a", "b"], Duration::from_secs(15)).await;
    }
    let remote = |addr: &str| {
        Some(RemoteConnector::connect_fn(
            addr.to_string(),
            ConnectorConfig {
                mode: "remote".into(),
                ..ConnectorConfig::default()
            },
            None,
        ))
    };
    let cfg = engine_config();
    let e1 = engine_with(remote(&a.grpc), &cfg);
    let e2 = engine_with(remote(&b.grpc), &cfg);

    // 5 full blocks (the nodes' RAM tiers are 32 MiB) plus 20 new tokens.
    let prompt = tokens(21, 320);
    let mut longer = prompt.clone();
    longer.extend(tokens(22, 20));
    let cold = generate(&e2.handle, &longer, 4, b"cold").await;
    assert_eq!(cold.usage.cached_tokens, 0);

    generate(&e1.handle, &prompt, 1, b"").await;
    let c1 = e1.connector.as_ref().expect("connector");
    assert!(
        c1.flush(Duration::from_secs(30)),
        "engine 1's saves finished"
    );
    assert_eq!(c1.stats().saved_blocks, 5);
    assert_eq!(c1.holder(), "a", "saved to node a");

    let warm = generate(&e2.handle, &longer, 4, b"").await;
    assert_eq!(
        warm.usage.cached_tokens, 320,
        "all five blocks loaded via node b"
    );
    assert_eq!(
        e2.connector
            .as_ref()
            .expect("connector")
            .stats()
            .loaded_blocks,
        5
    );
    assert_eq!(warm.tokens, cold.tokens);
    for (w, c) in warm.logits.iter().zip(&cold.logits) {
        assert!(same_bits(w, c), "logits differ from the cold run");
    }
    drop(e1);
    drop(e2);
}
