//! The console's HTTP side on a standalone node, without a browser: the page
//! and its vendored assets are served from the binary, and the JSON API
//! answers with this node, its tiers, its hit ratio (from the same counters
//! as /metrics) and a history ring that fills at `console_interval_ms`.

use std::time::{Duration, Instant};

use kvfabric_node::NodeServer;
use kvfabric_proto::v1::cache_service_client::CacheServiceClient;
use kvfabric_proto::v1::LookupRequest;
use kvfabric_store::{NodeConfig, Registry, Store};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` with an operator's key (the tenants node below has alice as a
/// trusted tenant; nodes without a tenants file ignore it).
async fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = "Authorization: Bearer key-alice\r\n";
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

async fn json(addr: &str, path: &str) -> Value {
    let (status, body) = http_get(addr, path).await;
    assert!(status.contains("200"), "{path}: {status}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// A standalone node of `cfg` serving gRPC and HTTP on free ports: its gRPC
/// address, its HTTP address, and the sender that stops it.
async fn standalone(
    cfg: NodeConfig,
) -> (
    std::net::SocketAddr,
    String,
    tokio::sync::oneshot::Sender<()>,
) {
    let mut registry = Registry::default();
    let store = Store::open(cfg, &mut registry).unwrap();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (g, h) = (grpc.local_addr().unwrap(), http.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        NodeServer::standalone(store, registry, grpc, http).serve(async {
            let _ = rx.await;
        }),
    );
    (g, h.to_string(), tx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_page_assets_and_api_on_a_standalone_node() {
    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::mib(4),
        console_interval_ms: 100,
        console_history_samples: 50,
        ..Default::default()
    };
    let (g, http, tx) = standalone(cfg).await;

    let (status, page) = http_get(&http, "/").await;
    assert!(status.contains("200"), "{status}");
    assert!(
        page.contains("/console/vendor/uplot/uPlot.iife.min.js")
            && page.contains("/console/app.js")
    );
    for asset in [
        "/console/app.js",
        "/console/app.css",
        "/console/vendor/uplot/uPlot.iife.min.js",
        "/console/vendor/uplot/uPlot.min.css",
    ] {
        let (status, body) = http_get(&http, asset).await;
        assert!(
            status.contains("200") && body.len() > 100,
            "{asset}: {status}"
        );
    }
    assert!(http_get(&http, "/console/vendor/uplot/LICENSE")
        .await
        .1
        .contains("MIT License"));

    let c = json(&http, "/api/v1/cluster").await;
    assert_eq!(c["nodes"].as_array().map(Vec::len), Some(1), "{c}");
    let me = &c["nodes"][0];
    assert_eq!(me["node_id"], "node-0");
    assert_eq!(me["state"], "alive");
    assert!(me["hit_ratio"].is_null(), "no lookups yet: no ratio, {me}");
    assert_eq!(me["tiers"][0]["tier"], "ram");
    assert_eq!(me["tiers"][0]["capacity_bytes"], 4 << 20);

    // Lookups of absent keys: misses only, so the ratio is 0 (not null) and
    // the history's looked-up series gets values.
    let mut client = CacheServiceClient::connect(format!("http://{g}"))
        .await
        .unwrap();
    for i in 0..5u8 {
        client
            .lookup(LookupRequest {
                keys: vec![vec![i; 32], vec![i + 100; 32]],
                with_holders: false,
            })
            .await
            .unwrap();
    }
    let c = json(&http, "/api/v1/cluster").await;
    assert_eq!(c["nodes"][0]["hit_ratio"], 0.0, "{c}");
    assert_eq!(
        c["nodes"][0]["miss_blocks"], 10,
        "two keys missed per lookup"
    );

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let h = json(&http, "/api/v1/history").await;
        let node = &h["nodes"][0];
        let t = node["t"].as_array().map_or(0, Vec::len);
        let looked_up = node["values"]["lookup_blocks_per_s"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(looked_up.len(), t, "one value per sample");
        assert!(t <= 50, "the ring keeps console_history_samples");
        if looked_up
            .iter()
            .any(|v| v.as_f64().is_some_and(|x| x > 0.0))
        {
            assert!(h["series"]
                .as_array()
                .is_some_and(|s| s.iter().any(|x| x["name"] == "hit_ratio")));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "history never showed the lookups: {h}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let top = json(&http, "/api/v1/top-prefixes").await;
    assert!(
        top["prefixes"].as_array().is_some_and(|p| p.is_empty()),
        "no prefix found: {top}"
    );
    let _ = tx.send(());
}

/// GET /api/v1/capacity says how many sampled lookups the curve rests on
/// and how many it needs (the console's "too few samples: N of M needed"),
/// and that none were dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_api_carries_the_sample_count_and_the_minimum() {
    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::mib(4),
        planner_sample_rate: 1.0,
        ..Default::default()
    };
    let (g, http, tx) = standalone(cfg).await;
    let client = CacheServiceClient::connect(format!("http://{g}"))
        .await
        .unwrap();
    let lookups = |n: u32, from: u32| {
        let mut client = client.clone();
        async move {
            for i in from..from + n {
                let k = |j: u32| [i.to_le_bytes(), j.to_le_bytes()].concat().repeat(4);
                client
                    .lookup(LookupRequest {
                        keys: vec![k(0), k(1)],
                        with_holders: false,
                    })
                    .await
                    .unwrap();
            }
        }
    };
    lookups(5, 0).await;
    let c = json(&http, "/api/v1/capacity").await;
    let min = c["min_samples"].as_u64().unwrap_or(0);
    assert!(
        min > 10,
        "a curve needs more than a handful of samples: {c}"
    );
    assert_eq!(c["sampled_lookups"], 10, "every key sampled at rate 1: {c}");
    assert_eq!(c["lookups"], 10, "{c}");
    assert_eq!(c["dropped_samples"], 0, "{c}");
    assert_eq!(c["tiers"][0]["tier"], "ram", "{c}");
    lookups(min as u32 / 2 + 1, 5).await;
    let c = json(&http, "/api/v1/capacity").await;
    assert!(c["sampled_lookups"].as_u64() >= Some(min), "{c}");
    let _ = tx.send(());
}

/// Top prefixes per tenant: on a (one-node) cluster with a tenants file,
/// lookups by two tenants of the same chain are counted apart, and
/// `?namespace=` picks one tenant's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_prefixes_are_counted_per_tenant() {
    use kvfabric_node::cluster::{ClusterConfig, ClusterNode};
    use kvfabric_store::{BlockKey, BlockOrder, DType, KvLayout, PutOptions};

    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    let hash = |k: &str| format!("\"{}\"", kvfabric_tenants::KeyHash::of(k));
    std::fs::write(
        &tenants,
        format!(
            "[[tenants]]\nname = \"alice\"\ntrusted = true\napi_keys = [{}]\n[[tenants]]\nname = \"bob\"\ntrusted = true\napi_keys = [{}]\n",
            hash("key-alice"),
            hash("key-bob")
        ),
    )
    .unwrap();
    let mut registry = Registry::default();
    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::mib(4),
        tenants_file: Some(tenants),
        ..Default::default()
    };
    let store = Store::open(cfg, &mut registry).unwrap();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (g, h) = (grpc.local_addr().unwrap(), http.local_addr().unwrap());
    let cluster = ClusterConfig {
        transfer_listen: "127.0.0.1:0".into(),
        transfer_transport: "tcp".into(),
        ..ClusterConfig::default()
    };
    let node = ClusterNode::start(store, cluster, g, &mut registry)
        .await
        .unwrap();
    let layout = KvLayout {
        layers: 1,
        kv_heads: 1,
        head_dim: 16,
        dtype: DType::F16,
        block_tokens: 16,
        order: BlockOrder::LayerKvTokenHead,
    };
    let keys: Vec<BlockKey> = (1..=3u8).map(|i| BlockKey([i; 32])).collect();
    for k in &keys {
        let data = vec![7u8; layout.block_bytes()];
        node.store()
            .put(*k, layout, &data, PutOptions::default())
            .unwrap();
    }
    node.sync().await;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        NodeServer::cluster(node.clone(), registry, grpc, http).serve(async {
            let _ = rx.await;
        }),
    );
    let mut client = CacheServiceClient::connect(format!("http://{g}"))
        .await
        .unwrap();
    for (who, times) in [("key-alice", 3), ("key-bob", 1)] {
        for _ in 0..times {
            let mut req = tonic::Request::new(LookupRequest {
                keys: keys.iter().map(|k| k.0.to_vec()).collect(),
                with_holders: false,
            });
            req.metadata_mut()
                .insert("authorization", format!("Bearer {who}").parse().unwrap());
            let found = client.lookup(req).await.unwrap().into_inner();
            assert_eq!(found.prefix_blocks, 3);
        }
    }
    let http = h.to_string();
    let top = json(&http, "/api/v1/top-prefixes").await;
    let p = top["prefixes"].as_array().cloned().unwrap_or_default();
    assert_eq!(p.len(), 2, "{top}");
    assert_eq!(
        (p[0]["namespace"].as_str(), p[0]["hits"].as_u64()),
        (Some("alice"), Some(3))
    );
    assert_eq!(
        (p[1]["namespace"].as_str(), p[1]["hits"].as_u64()),
        (Some("bob"), Some(1))
    );
    assert_eq!(p[0]["depth_blocks"], 3);
    assert_eq!(p[0]["depth_tokens"], 48, "3 blocks of 16 tokens, held here");
    assert_eq!(p[0]["holders"], serde_json::json!(["node-0"]));
    assert_eq!(p[0]["size_bytes"], 3 * layout.block_bytes() as u64);
    assert_eq!(top["namespaces"], serde_json::json!(["alice", "bob"]));
    let bob = json(&http, "/api/v1/top-prefixes?namespace=bob").await;
    assert_eq!(bob["prefixes"].as_array().map(Vec::len), Some(1), "{bob}");
    assert_eq!(bob["prefixes"][0]["namespace"], "bob");
    let _ = tx.send(());
}
