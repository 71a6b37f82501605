//! The gRPC CacheService and HTTP endpoints of a node, over loopback.

use std::time::Duration;

use kvfabric_node::NodeServer;
use kvfabric_proto::v1::cache_service_client::CacheServiceClient;
use kvfabric_proto::v1::{
    ExistsRequest, GetRequest, KvLayout, LookupRequest, PinRequest, PutHeader, PutRequest,
    RemoveRequest, StatsRequest, UnpinRequest,
};
use kvfabric_store::{NodeConfig, Registry, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

const BLOCK: usize = 2 * 2 * 1024 * 64 * 4; // layout(): 2 layers x K,V x 1024 tokens x 64 x f32

fn layout() -> KvLayout {
    KvLayout {
        layers: 2,
        kv_heads: 1,
        head_dim: 64,
        dtype: 1,
        block_tokens: 1024,
        order: 1,
    }
}

fn key(i: u8) -> Vec<u8> {
    vec![i; 32]
}

fn data(i: u8) -> Vec<u8> {
    (0..BLOCK).map(|j| (j as u8) ^ i).collect()
}

fn put_msgs(
    k: Vec<u8>,
    size: u64,
    chunks: Vec<Vec<u8>>,
    layout: Option<KvLayout>,
) -> Vec<PutRequest> {
    let mut msgs = Vec::new();
    for (n, c) in chunks.into_iter().enumerate() {
        msgs.push(PutRequest {
            header: (n == 0).then(|| PutHeader {
                key: k.clone(),
                layout,
                size,
                ..Default::default()
            }),
            data: c.into(),
        });
    }
    msgs
}

/// A RAM-only store with room for `ram_blocks` blocks, evicting only when full.
fn open_store(ram_blocks: usize, registry: &mut Registry) -> Store {
    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::b((ram_blocks * BLOCK) as u64),
        high_watermark: 1.0,
        low_watermark: 1.0,
        max_block_size: bytesize::ByteSize::b(2 * BLOCK as u64),
        ..Default::default()
    };
    Store::open(cfg, registry).unwrap()
}

async fn start(ram_blocks: usize) -> (String, String, tokio::sync::oneshot::Sender<()>) {
    let mut registry = Registry::default();
    let store = open_store(ram_blocks, &mut registry);
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

async fn http_get(addr: &str, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

type Client = CacheServiceClient<tonic::transport::Channel>;

/// Put `chunks` under `k` as one client stream declaring `size` bytes.
async fn put(
    c: &mut Client,
    k: Vec<u8>,
    size: u64,
    chunks: Vec<Vec<u8>>,
    layout: Option<KvLayout>,
) -> Result<kvfabric_proto::v1::PutResponse, tonic::Status> {
    let msgs = put_msgs(k, size, chunks, layout);
    c.put(tokio_stream::iter(msgs))
        .await
        .map(|r| r.into_inner())
}

/// Put one whole block of `data(i)` under `key(i)`.
async fn put_block(
    c: &mut Client,
    i: u8,
) -> Result<kvfabric_proto::v1::PutResponse, tonic::Status> {
    put(c, key(i), BLOCK as u64, vec![data(i)], Some(layout())).await
}

/// Every byte a Get of `k` (from `offset`, `length` 0 = to the end) streams.
async fn get_bytes(
    c: &mut Client,
    k: Vec<u8>,
    offset: u64,
    length: u64,
) -> Result<Vec<u8>, tonic::Status> {
    let req = GetRequest {
        key: k,
        offset,
        length,
    };
    let mut s = c.get(req).await?.into_inner();
    let mut got = Vec::new();
    while let Some(m) = s.message().await? {
        got.extend_from_slice(&m.data);
    }
    Ok(got)
}

#[tokio::test]
async fn put_get_lookup_errors_and_metrics() {
    let (url, http, stop) = start(3).await;
    let mut c = CacheServiceClient::connect(url).await.unwrap();
    c = c
        .max_decoding_message_size(8 << 20)
        .max_encoding_message_size(8 << 20);
    puts_gets_and_lookups(&mut c).await;
    bad_inputs_are_refused(&mut c).await;
    a_full_pinned_store_refuses_and_keeps_its_blocks(&mut c).await;
    stats_health_and_metrics(&mut c, &http).await;
    let _ = stop.send(());
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// An inline put, a put streamed in 3 chunks, an idempotent re-put; Get of
/// the whole block, of a range and of a miss; Exists and Lookup.
async fn puts_gets_and_lookups(c: &mut Client) {
    assert!(!put_block(c, 1).await.unwrap().already_present);
    let d2 = data(2);
    let chunks = vec![
        d2[..1000].to_vec(),
        d2[1000..70000].to_vec(),
        d2[70000..].to_vec(),
    ];
    put(c, key(2), BLOCK as u64, chunks, Some(layout()))
        .await
        .unwrap();
    let again = put(c, key(1), BLOCK as u64, vec![data(9)], Some(layout())).await;
    assert!(again.unwrap().already_present);

    // Get streams the header then the bytes; ranges work.
    let mut s = c
        .get(GetRequest {
            key: key(2),
            offset: 0,
            length: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let first = s.message().await.unwrap().unwrap();
    assert_eq!(first.header.unwrap().size, BLOCK as u64);
    assert_eq!(get_bytes(c, key(2), 0, 0).await.unwrap(), d2);
    assert_eq!(get_bytes(c, key(2), 10, 5).await.unwrap(), d2[10..15]);
    let miss = get_bytes(c, key(7), 0, 0).await.unwrap_err();
    assert_eq!(miss.code(), Code::NotFound);

    let ex = c
        .exists(ExistsRequest {
            keys: vec![key(1), key(3), key(2)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ex.present, vec![true, false, true]);
    let lk = c
        .lookup(LookupRequest {
            keys: vec![key(1), key(2), key(3), key(1)],
            with_holders: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((lk.prefix_blocks, lk.holders.len()), (2, 2));
}

/// Bad inputs: each its status code and reason, nothing stored damaged.
async fn bad_inputs_are_refused(c: &mut Client) {
    let bad_key = c
        .exists(ExistsRequest {
            keys: vec![vec![1; 31]],
        })
        .await
        .unwrap_err();
    assert_eq!(bad_key.code(), Code::InvalidArgument);
    let e = put(c, vec![1; 33], BLOCK as u64, vec![data(1)], Some(layout()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let mut unknown = layout();
    unknown.dtype = 42;
    let e = put(c, key(4), BLOCK as u64, vec![data(4)], Some(unknown))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(e.message().contains("dtype"));
    // Declared sizes: over max_block_size, more and fewer bytes than declared.
    for (size, reason) in [
        (3 * BLOCK as u64, Some("max_block_size")),
        (BLOCK as u64 + 1, Some("declared")),
        (BLOCK as u64 - 1, None),
    ] {
        let e = put(c, key(4), size, vec![data(4)], Some(layout()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        if let Some(reason) = reason {
            assert!(e.message().contains(reason), "{e}");
        }
    }
    // A wrong-size put of an existing key is refused too and changes nothing.
    let e = put(c, key(1), 7, vec![data(1)], Some(layout()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

/// Everything pinned and no room: RESOURCE_EXHAUSTED, and every stored
/// block reads back whole; then unpin and remove.
async fn a_full_pinned_store_refuses_and_keeps_its_blocks(c: &mut Client) {
    put_block(c, 3).await.unwrap();
    let keys = vec![key(1), key(2), key(3)];
    let p = c
        .pin(PinRequest {
            keys: keys.clone(),
            ttl_ms: 0,
        })
        .await
        .unwrap();
    assert_eq!(p.into_inner().pinned, 3);
    let e = put_block(c, 5).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    for i in 1..=3u8 {
        assert_eq!(
            get_bytes(c, key(i), 0, 0).await.unwrap(),
            data(i),
            "block {i} damaged"
        );
    }
    let u = c.unpin(UnpinRequest { keys }).await.unwrap();
    assert_eq!(u.into_inner().unpinned, 3);
    let rm = c
        .remove(RemoveRequest {
            keys: vec![key(3), key(8)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rm.removed, 1);
}

/// Stats count what happened; /health and /metrics answer.
async fn stats_health_and_metrics(c: &mut Client, http: &str) {
    let st = c.stats(StatsRequest {}).await.unwrap().into_inner();
    assert_eq!(st.tiers[0].blocks, 2);
    assert!(st.tiers[0].hits >= 5);

    let health = http_get(http, "/health").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let metrics = http_get(http, "/metrics").await;
    for name in [
        "kvfabric_store_used_bytes{tier=\"Ram\"}",
        "kvfabric_store_hits_total",
        "kvfabric_store_checksum_failures",
        "kvfabric_store_op_seconds_bucket",
        "kvfabric_store_lookup_hit_tokens_total",
    ] {
        assert!(metrics.contains(name), "missing {name} in\n{metrics}");
    }
}

/// A Get stream's chunks are slices of the RAM arena held by the block's
/// read lease: until the last chunk is consumed the block must not be
/// evicted or its extent reused, even when puts need its room.
#[tokio::test]
async fn a_get_stream_keeps_its_block_leased_until_consumed() {
    use kvfabric_node::CacheServer;
    use kvfabric_proto::v1::cache_service_server::CacheService;
    use kvfabric_store::{BlockKey, PutOptions};

    let store = open_store(2, &mut Registry::default());
    let lay: kvfabric_store::KvLayout = (&layout()).try_into().unwrap();
    let k = |i: u8| BlockKey::from_slice(&key(i)).unwrap();
    for i in 1..=2u8 {
        store
            .put(k(i), lay, &data(i), PutOptions::default())
            .unwrap();
    }
    let server = CacheServer::new(store.clone(), "test".into());
    // Block 1 is the least recently used; open its stream, do not read it yet.
    let mut stream = server
        .get(tonic::Request::new(GetRequest {
            key: key(1),
            offset: 0,
            length: 0,
        }))
        .await
        .unwrap()
        .into_inner();
    // Two more blocks need both slots: only block 2 may go; block 1 is leased.
    store
        .put(k(3), lay, &data(3), PutOptions::default())
        .unwrap();
    let refused = store.put(k(4), lay, &data(4), PutOptions::default());
    assert!(
        refused.is_err() || !store.exists(&[k(3)])[0],
        "block 4 must take block 3's room, never the leased block 1's"
    );
    let mut got = Vec::new();
    while let Some(m) = futures::StreamExt::next(&mut stream).await {
        got.extend_from_slice(&m.unwrap().data);
    }
    assert_eq!(got, data(1), "the streamed block was overwritten");
    assert!(!store.exists(&[k(2)])[0], "block 2 was the one to go");
}

/// `kvfabric node` serves no VRAM tier: a `vram_capacity` is refused with
/// the reason, not silently ignored.
#[tokio::test]
async fn a_node_refuses_a_vram_capacity() {
    let cfg = NodeConfig {
        grpc_listen: "127.0.0.1:0".parse().unwrap(),
        http_listen: "127.0.0.1:0".parse().unwrap(),
        ram_capacity: bytesize::ByteSize::mib(4),
        vram_capacity: bytesize::ByteSize::mib(64),
        ..Default::default()
    };
    let out = NodeServer::open(cfg, kvfabric_node::cluster::ClusterConfig::default()).await;
    let err = out.err().expect("refused").to_string();
    assert!(err.contains("vram_capacity"), "{err}");
}
