//! Tenants on the gRPC CacheService of a node: no key or a wrong key is
//! UNAUTHENTICATED with a reason; a tenant's keys are scoped, so tenant B
//! sending tenant A's exact key neither sees A's block (Lookup, Exists,
//! Get) nor overwrites or removes it; a trusted tenant uses keys as sent; a
//! revoked key is refused after one reload.

use std::path::Path;
use std::time::{Duration, Instant};

use kvfabric_node::NodeServer;
use kvfabric_proto::v1::cache_service_client::CacheServiceClient;
use kvfabric_proto::v1::{
    ExistsRequest, GetRequest, KvLayout, LookupRequest, PutHeader, PutRequest, RemoveRequest,
};
use kvfabric_store::{NodeConfig, Registry, Store};
use kvfabric_tenants::KeyHash;
use tonic::transport::Channel;
use tonic::{Code, Request};

const BLOCK: usize = 2 * 2 * 64 * 64 * 4;

fn layout() -> KvLayout {
    KvLayout {
        layers: 2,
        kv_heads: 1,
        head_dim: 64,
        dtype: 1,
        block_tokens: 64,
        order: 1,
    }
}

fn write_tenants(path: &Path, a_keys: &[&str]) {
    let list = |ks: &[&str]| {
        ks.iter()
            .map(|k| format!("\"{}\"", KeyHash::of(k)))
            .collect::<Vec<_>>()
            .join(",")
    };
    let text = format!(
        "[[tenants]]\nname = \"a\"\napi_keys = [{}]\n[[tenants]]\nname = \"b\"\napi_keys = [{}]\n[[tenants]]\nname = \"ops\"\ntrusted = true\napi_keys = [{}]\n",
        list(a_keys),
        list(&["key-b"]),
        list(&["key-ops"]),
    );
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

async fn start(
    tenants: &Path,
) -> (
    CacheServiceClient<Channel>,
    tokio::sync::oneshot::Sender<()>,
) {
    let mut registry = Registry::default();
    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::b((16 * BLOCK) as u64),
        tenants_file: Some(tenants.to_path_buf()),
        tenants_reload_ms: 50,
        ..Default::default()
    };
    let store = Store::open(cfg, &mut registry).expect("store");
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let http = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = grpc.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        NodeServer::standalone(store, registry, grpc, http).serve(async {
            let _ = rx.await;
        }),
    );
    let client = CacheServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    (client, tx)
}

fn req<T>(msg: T, key: Option<&str>) -> Request<T> {
    let mut r = Request::new(msg);
    if let Some(k) = key {
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {k}").parse().expect("ascii"),
        );
    }
    r
}

async fn put(
    c: &mut CacheServiceClient<Channel>,
    api_key: Option<&str>,
    key: &[u8],
    fill: u8,
) -> Result<(), tonic::Status> {
    let msg = PutRequest {
        header: Some(PutHeader {
            key: key.to_vec(),
            layout: Some(layout()),
            size: BLOCK as u64,
            ..Default::default()
        }),
        data: vec![fill; BLOCK].into(),
    };
    c.put(req(futures::stream::iter(vec![msg]), api_key))
        .await
        .map(|_| ())
}

async fn get(
    c: &mut CacheServiceClient<Channel>,
    api_key: &str,
    key: &[u8],
) -> Result<Vec<u8>, tonic::Status> {
    let r = GetRequest {
        key: key.to_vec(),
        offset: 0,
        length: 0,
    };
    let mut stream = c.get(req(r, Some(api_key))).await?.into_inner();
    let mut out = Vec::new();
    while let Some(m) = stream.message().await? {
        out.extend_from_slice(&m.data);
    }
    Ok(out)
}

async fn lookup(c: &mut CacheServiceClient<Channel>, api_key: &str, key: &[u8]) -> u32 {
    let r = LookupRequest {
        keys: vec![key.to_vec()],
        ..Default::default()
    };
    c.lookup(req(r, Some(api_key)))
        .await
        .expect("lookup")
        .into_inner()
        .prefix_blocks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_b_can_neither_read_nor_poison_tenant_a_blocks() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("tenants.toml");
    write_tenants(&path, &["key-a"]);
    let (mut c, _stop) = start(&path).await;
    let k = vec![0x42u8; 32];

    for key in [None, Some("key-x")] {
        let e = put(&mut c, key, &k, 1).await.expect_err("no valid key");
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert!(!e.message().is_empty());
        let e = c
            .exists(req(
                ExistsRequest {
                    keys: vec![k.clone()],
                },
                key,
            ))
            .await
            .expect_err("no valid key");
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    }

    put(&mut c, Some("key-a"), &k, 0xAA).await.expect("A puts");
    assert_eq!(lookup(&mut c, "key-a", &k).await, 1);
    assert_eq!(
        lookup(&mut c, "key-b", &k).await,
        0,
        "B sees nothing of A's"
    );
    let e = get(&mut c, "key-b", &k)
        .await
        .expect_err("B cannot read A's block");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    // B puts different bytes under the same key: its own block, A's is intact.
    put(&mut c, Some("key-b"), &k, 0xBB).await.expect("B puts");
    assert_eq!(
        get(&mut c, "key-a", &k).await.expect("A reads"),
        vec![0xAA; BLOCK]
    );
    assert_eq!(
        get(&mut c, "key-b", &k).await.expect("B reads"),
        vec![0xBB; BLOCK]
    );
    let removed = c
        .remove(req(
            RemoveRequest {
                keys: vec![k.clone()],
            },
            Some("key-b"),
        ))
        .await
        .expect("remove")
        .into_inner()
        .removed;
    assert_eq!(removed, 1, "B removed its own block");
    assert_eq!(
        get(&mut c, "key-a", &k).await.expect("A still reads"),
        vec![0xAA; BLOCK]
    );
    // A trusted tenant uses keys as sent: A's block is not at the raw key.
    assert_eq!(lookup(&mut c, "key-ops", &k).await, 0);
    put(&mut c, Some("key-ops"), &k, 0xCC)
        .await
        .expect("ops puts");
    assert_eq!(
        get(&mut c, "key-ops", &k).await.expect("ops reads"),
        vec![0xCC; BLOCK]
    );
    assert_eq!(
        get(&mut c, "key-a", &k).await.expect("A reads"),
        vec![0xAA; BLOCK]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_is_unauthenticated_after_one_reload() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("tenants.toml");
    write_tenants(&path, &["key-a", "key-a2"]);
    let (mut c, _stop) = start(&path).await;
    assert_eq!(lookup(&mut c, "key-a", &[1; 32]).await, 0);
    write_tenants(&path, &["key-a2"]);
    let revoked = Instant::now();
    loop {
        let r = LookupRequest {
            keys: vec![vec![1; 32]],
            ..Default::default()
        };
        match c.lookup(req(r, Some("key-a"))).await {
            Err(e) if e.code() == Code::Unauthenticated => break,
            _ => assert!(revoked.elapsed() < Duration::from_secs(2), "still accepted"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(lookup(&mut c, "key-a2", &[1; 32]).await, 0);
}
