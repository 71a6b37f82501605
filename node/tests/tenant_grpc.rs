//! Tenants on the gRPC CacheService of a node: no key or a wrong key is
//! UNAUTHENTICATED with a reason; a tenant's keys are scoped, so tenant B
//! sending tenant A's exact key neither sees A's block (Lookup, Exists,
//! Get) nor overwrites or removes it; a trusted tenant uses keys as sent; a
//! revoked key is refused after one reload; a tenant's KV event stream
//! shows only its own blocks, a trusted caller's shows every block; the
//! HTTP port (metrics, console) answers only a trusted tenant's key.

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
    let (c, stop, _, _) = start_at(tenants).await;
    (c, stop)
}

/// [`start`], and the node's gRPC URL and HTTP address.
async fn start_at(
    tenants: &Path,
) -> (
    CacheServiceClient<Channel>,
    tokio::sync::oneshot::Sender<()>,
    String,
    String,
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
    let http_addr = http.local_addr().expect("addr").to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        NodeServer::standalone(store, registry, grpc, http).serve(async {
            let _ = rx.await;
        }),
    );
    let client = CacheServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    (client, tx, format!("http://{addr}"), http_addr)
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

/// The keys of the next `n` Stored events on `events` (waits at most 10 s).
async fn stored_keys(
    events: &mut tonic::Streaming<kvfabric_proto::v1::KvEvent>,
    n: usize,
) -> Vec<Vec<u8>> {
    use kvfabric_proto::v1::KvEventKind;
    let mut keys = Vec::new();
    while keys.len() < n {
        let e = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .expect("an event in time")
            .expect("stream")
            .expect("open");
        if e.kind() == KvEventKind::Stored {
            keys.push(e.key);
        }
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_kv_events_of_its_own_blocks_only() {
    use kvfabric_proto::v1::kv_event_service_client::KvEventServiceClient;
    use kvfabric_proto::v1::KvEventsRequest;
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("tenants.toml");
    write_tenants(&path, &["key-a"]);
    let (mut c, _stop, addr, _) = start_at(&path).await;
    let mut ev = KvEventServiceClient::connect(addr).await.expect("connect");
    let err = ev
        .kv_events(req(KvEventsRequest {}, None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "no key, no events");
    let subscribe = |key: &'static str| {
        let mut ev = ev.clone();
        async move {
            ev.kv_events(req(KvEventsRequest {}, Some(key)))
                .await
                .expect("subscribe")
                .into_inner()
        }
    };
    let mut of_b = subscribe("key-b").await;
    let mut of_ops = subscribe("key-ops").await;
    // a's block first, then b's: b's stream must skip a's and show its own.
    put(&mut c, Some("key-a"), &[0xa1; 32], 1)
        .await
        .expect("a puts");
    put(&mut c, Some("key-b"), &[0xb1; 32], 2)
        .await
        .expect("b puts");
    let everything = stored_keys(&mut of_ops, 2).await;
    let b_sees = stored_keys(&mut of_b, 1).await;
    assert_eq!(b_sees.len(), 1);
    assert!(everything.contains(&b_sees[0]), "b sees its own block");
    assert_ne!(b_sees[0], everything[0], "b never sees a's block");
    // A later block of a's, then one of b's: still only b's reaches b.
    put(&mut c, Some("key-a"), &[0xa2; 32], 3)
        .await
        .expect("a puts");
    put(&mut c, Some("key-b"), &[0xb2; 32], 4)
        .await
        .expect("b puts");
    let later = stored_keys(&mut of_ops, 2).await;
    assert_eq!(stored_keys(&mut of_b, 1).await, vec![later[1].clone()]);
}

/// The status code of `GET path` on `http` with `auth` as Authorization.
async fn http_status(http: &str, path: &str, auth: Option<&str>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(http).await.expect("http");
    let auth = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    let req = format!("GET {path} HTTP/1.1\r\nHost: node\r\n{auth}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("send");
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.expect("read");
    let text = String::from_utf8_lossy(&out);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status line")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_port_answers_operators_only() {
    use base64::Engine;
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("tenants.toml");
    write_tenants(&path, &["key-a"]);
    let (_c, _stop, _, http) = start_at(&path).await;
    let basic = |k: &str| {
        let b = base64::engine::general_purpose::STANDARD.encode(format!("me:{k}"));
        format!("Basic {b}")
    };
    for path in ["/metrics", "/", "/api/v1/capacity"] {
        assert_eq!(
            http_status(&http, path, None).await,
            401,
            "{path} without a key"
        );
        assert_eq!(
            http_status(&http, path, Some("Bearer nope")).await,
            401,
            "{path}"
        );
        assert_eq!(
            http_status(&http, path, Some("Bearer key-a")).await,
            403,
            "{path} for a tenant that is no operator"
        );
        assert_eq!(
            http_status(&http, path, Some("Bearer key-ops")).await,
            200,
            "{path}"
        );
        assert_eq!(
            http_status(&http, path, Some(&basic("key-ops"))).await,
            200,
            "{path}"
        );
    }
    assert_eq!(
        http_status(&http, "/health", None).await,
        200,
        "health stays open"
    );
}
