//! The two hops with the real fabric: a prefill-role engine and a
//! decode-role engine, each with its own embedded fabric node of one
//! cluster (a real etcd). The prefill
//! answer carries `kv_transfer_params` naming the saved blocks, the decode
//! engine loads them instead of recomputing, and the routed text is still
//! exactly a colocated engine's.

use std::time::Duration;

use kvfabric_connector::{ConnectorConfig, EmbeddedNode, FabricConnector};
use kvfabric_engine::http::EngineMetrics;
use kvfabric_engine::Role;
use kvfabric_node::cluster::ClusterConfig;
use kvfabric_store::NodeConfig;
use kvfabric_testkit::router::*;
use kvfabric_testkit::EtcdProcess;
use serde_json::json;

async fn fabric_engine(node: &EmbeddedNode, role: Role) -> TestEngine {
    let metrics = EngineMetrics::new();
    let mut running = kvfabric_engine::EngineBuilder::new(engine_config(role))
        .metrics(metrics.clone())
        .connector(FabricConnector::connect_fn(
            node.node().clone(),
            ConnectorConfig::default(),
        ))
        .start(loaded().model.clone())
        .expect("start engine with connector");
    let registry = std::mem::take(&mut running.registry);
    serve_running(running, metrics, registry).await
}

async fn fabric_node(etcd: &EtcdProcess, id: &str) -> EmbeddedNode {
    EmbeddedNode::start(
        NodeConfig {
            node_id: id.into(),
            ram_capacity: bytesize::ByteSize::mib(64),
            grpc_listen: "127.0.0.1:0".parse().expect("addr"),
            http_listen: "127.0.0.1:0".parse().expect("addr"),
            ..NodeConfig::default()
        },
        ClusterConfig {
            etcd: vec![etcd.endpoint()],
            etcd_prefix: "/t-two-hop".into(),
            ..ClusterConfig::default()
        },
    )
    .await
    .expect("fabric node")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_loads_the_prefill_engines_blocks() {
    let etcd = EtcdProcess::start().expect("etcd");
    let node = fabric_node(&etcd, "router-test").await;
    let decode_node = fabric_node(&etcd, "decode-node").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while node.node().view().nodes.len() < 2 || decode_node.node().view().nodes.len() < 2 {
        assert!(std::time::Instant::now() < deadline, "membership");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut prefill = fabric_engine(&node, Role::Prefill).await;
    let mut decode = fabric_engine(&decode_node, Role::Decode).await;
    let mut colocated = start_engine(Role::Both).await;
    let router = start_router(disaggregated(&[prefill.url()], &[decode.url()])).await;

    // Several prompts, streamed and not: the routed text is the colocated text.
    for (i, topic) in ["rivers", "compilers", "bread"].iter().enumerate() {
        let prompt = format!("Session {i}. Write three sentences about {topic}. ").repeat(12);
        let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0});
        let (_, want) = post_json(colocated.addr, "/v1/completions", &body).await;
        let (status, got) = post_json(router.addr, "/v1/completions", &body).await;
        assert_eq!(status, 200, "{got}");
        assert_eq!(answer_text(&got), answer_text(&want), "prompt {i}");
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let (status, events) = post_stream(router.addr, "/v1/completions", &streamed).await;
        assert_eq!(status, 200);
        assert_eq!(
            stream_text(&events).0,
            answer_text(&want),
            "prompt {i} streamed"
        );
    }

    // About 150 tokens: two full 64-token blocks.
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(15);
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0});

    let (status, want) = post_json(colocated.addr, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{want}");
    let (status, got) = post_json(router.addr, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(answer_text(&got), answer_text(&want));

    // The decode engine reused the saved blocks instead of computing them.
    let prompt_tokens = got["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt_tokens");
    let full_blocks = prompt_tokens / 64;
    assert!(full_blocks >= 2, "prompt of {prompt_tokens} tokens");
    let reused = metric(decode.addr, "kvfabric_engine_prefix_cache_hit_tokens_total").await;
    assert!(reused >= 64.0, "decode reused {reused} tokens");
    // ... and it got them from the other node, through the fabric.
    let loaded = metric(decode.addr, "kvfabric_connector_loaded_blocks_total").await;
    assert!(
        loaded >= 3.0,
        "decode loaded {loaded} blocks from the prefill node"
    );

    // What the prefill engine answers a prefill hop: the saved blocks' keys.
    let mut hop = body.clone();
    hop["max_tokens"] = json!(1);
    hop["kv_transfer_params"] = json!({"do_remote_decode": true});
    let (status, v) = post_json(prefill.addr, "/v1/completions", &hop).await;
    assert_eq!(status, 200, "{v}");
    let params = &v["kv_transfer_params"];
    assert_eq!(params["holder"], "router-test", "{v}");
    assert_eq!(params["block_tokens"], 64);
    let keys = params["block_keys"].as_array().expect("block_keys");
    assert_eq!(keys.len() as u64, full_blocks, "{v}");
    assert!(keys.iter().all(|k| k
        .as_str()
        .is_some_and(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))));
    assert_eq!(
        params["cached_tokens"],
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
    );

    router.shut_down().await;
    prefill.shut_down().await;
    decode.shut_down().await;
    colocated.shut_down().await;
    tokio::time::timeout(Duration::from_secs(30), node.stop())
        .await
        .expect("node stops");
    tokio::time::timeout(Duration::from_secs(30), decode_node.stop())
        .await
        .expect("node stops");
}
