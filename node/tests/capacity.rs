//! The capacity planner over a node's endpoints: GET /api/v1/capacity, the
//! Capacity RPC (what `kvfabric ctl capacity` calls) and the
//! `kvfabric_planner_hit_ratio` gauges agree, and with every key sampled the
//! point at the tier's size is the node's own lookup hit ratio.

use kvfabric_node::NodeServer;
use kvfabric_proto::v1::cache_service_client::CacheServiceClient;
use kvfabric_proto::v1::{
    CapacityRequest, GetRequest, KvLayout, LookupRequest, PutHeader, PutRequest, StatsRequest,
};
use kvfabric_store::{CapacityReport, EvictionPolicy, NodeConfig, Registry, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// 1 layer x K,V x 32 tokens x 16 x f32: one 4 KiB arena slot.
const BLOCK: usize = 2 * 32 * 16 * 4;

fn layout() -> KvLayout {
    KvLayout {
        layers: 1,
        kv_heads: 1,
        head_dim: 16,
        dtype: 1,
        block_tokens: 32,
        order: 1,
    }
}

async fn start(ram_blocks: usize) -> (String, String, tokio::sync::oneshot::Sender<()>) {
    let mut registry = Registry::default();
    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::b((ram_blocks * 4096) as u64),
        high_watermark: 1.0,
        low_watermark: 1.0,
        eviction: EvictionPolicy::S3fifo,
        planner_sample_rate: 1.0,
        ..Default::default()
    };
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
    (format!("http://{g}"), h.to_string(), tx)
}

async fn http_body(addr: &str, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

fn key(i: u32) -> Vec<u8> {
    let mut k = vec![0u8; 32];
    k[..4].copy_from_slice(&i.to_le_bytes());
    k
}

#[tokio::test]
async fn capacity_over_http_grpc_and_metrics() {
    let (url, http, stop) = start(32).await;
    let mut c = CacheServiceClient::connect(url).await.unwrap();
    // A loop of 48 keys over a 32-block tier, plus a hot set of 8.
    for i in 0..600u32 {
        let k = key(if i % 2 == 0 { 1000 + i % 8 } else { i % 48 });
        let found = c
            .lookup(LookupRequest {
                keys: vec![k.clone()],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if found.prefix_blocks == 0 {
            let put = PutRequest {
                header: Some(PutHeader {
                    key: k,
                    layout: Some(layout()),
                    size: BLOCK as u64,
                    ..Default::default()
                }),
                data: vec![3u8; BLOCK].into(),
            };
            c.put(tokio_stream::iter(vec![put])).await.unwrap();
        } else {
            // Read the hit, as a connector does (the read is what the order sees).
            let mut s = c
                .get(GetRequest {
                    key: k,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            while s.message().await.unwrap().is_some() {}
        }
    }
    let grpc: CapacityReport = kvfabric_node::wire::capacity_from_proto(
        c.capacity(CapacityRequest {}).await.unwrap().into_inner(),
    );
    let body = http_body(&http, "/api/v1/capacity").await;
    let http_report: CapacityReport = serde_json::from_str(&body).unwrap();
    assert_eq!(grpc, http_report);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let ram = &v["tiers"][0];
    assert_eq!(ram["tier"], "ram");
    assert_eq!(ram["policy"], "s3fifo");
    assert_eq!(ram["capacity_bytes"], 32 * 4096);
    assert_eq!(ram["points"].as_array().unwrap().len(), 8);

    let stats = c.stats(StatsRequest {}).await.unwrap().into_inner();
    let own = stats.hit_blocks as f64 / (stats.hit_blocks + stats.miss_blocks) as f64;
    let at = |s: f64| {
        grpc.tiers[0]
            .points
            .iter()
            .find(|p| p.scale == s)
            .unwrap()
            .token_hit_ratio
    };
    assert!((at(1.0) - own).abs() < 1e-9, "{} vs {own}", at(1.0));
    assert!(at(4.0) > at(0.25), "{:?}", grpc.tiers[0].points);
    assert_eq!(grpc.lookups, 600);

    let metrics = http_body(&http, "/metrics").await;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("kvfabric_planner_hit_ratio{tier=\"ram\",scale=\"1\"}"))
        .unwrap_or_else(|| panic!("no planner gauge in\n{metrics}"));
    let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((value - own).abs() < 1e-9, "{line}");
    let _ = stop.send(());
}
