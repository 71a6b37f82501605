//! Per-tenant shares of a node's tiers, end to end (what must hold: "one
//! tenant filling the cache does not evict another tenant's blocks below its
//! share"): a `kvfabric node` process with a tenants file of two untrusted
//! tenants; tenant b stores blocks through the gRPC CacheService with its
//! key, tenant a then writes three times the RAM tier with its own; every
//! block of b's still reads back bit-identical, and
//! `kvfabric_tenant_tier_bytes` shows each tenant's bytes. A node restarted
//! over its disk tier counts the blocks it recovers to the same tenants.

use std::time::Duration;

use kvfabric_proto::v1::cache_service_client::CacheServiceClient;
use kvfabric_proto::v1::{GetRequest, PutHeader, PutRequest};
use kvfabric_store::{BlockKey, BlockOrder, DType, KvLayout};
use kvfabric_testkit::metrics::metric_sum;
use kvfabric_testkit::procs::{get_ok_as, NodeProc};
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// 256 KiB blocks: the node's 32 MiB RAM tier holds 128.
fn layout() -> KvLayout {
    KvLayout {
        layers: 2,
        kv_heads: 2,
        head_dim: 1024,
        dtype: DType::F16,
        block_tokens: 16,
        order: BlockOrder::LayerKvTokenHead,
    }
}

const BLOCK: usize = 256 << 10;

/// The interceptor that adds a tenant's key.
type AddKey =
    Box<dyn FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Send>;

type Client = CacheServiceClient<InterceptedService<Channel, AddKey>>;

async fn client(addr: &str, key: &str) -> Client {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let channel = loop {
        let e = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("url");
        match e.connect().await {
            Ok(c) => break c,
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "node never answered: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let auth: MetadataValue<_> = format!("Bearer {key}").parse().expect("metadata");
    let f: AddKey = Box::new(move |mut r: tonic::Request<()>| {
        r.metadata_mut().insert("authorization", auth.clone());
        Ok(r)
    });
    CacheServiceClient::with_interceptor(channel, f)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

fn key(tenant: u8, i: u32) -> BlockKey {
    let mut k = [tenant; 32];
    k[..4].copy_from_slice(&i.to_le_bytes());
    BlockKey(k)
}

fn data(tenant: u8, i: u32) -> Vec<u8> {
    (0..BLOCK)
        .map(|j| (j as u32).wrapping_mul(131).wrapping_add(i) as u8 ^ tenant)
        .collect()
}

async fn put(c: &mut Client, tenant: u8, i: u32) {
    put_with(c, tenant, i, false).await
}

async fn put_with(c: &mut Client, tenant: u8, i: u32, durable: bool) {
    let msg = PutRequest {
        header: Some(PutHeader {
            key: key(tenant, i).as_bytes().to_vec(),
            layout: Some((&layout()).into()),
            size: BLOCK as u64,
            checksum: None,
            durable,
            tokens: 0,
        }),
        data: data(tenant, i).into(),
    };
    c.put(futures::stream::iter(vec![msg])).await.expect("put");
}

/// Whether `tenant`'s block `i` reads back bit-identical.
async fn intact(c: &mut Client, tenant: u8, i: u32) -> bool {
    let req = GetRequest {
        key: key(tenant, i).as_bytes().to_vec(),
        ..Default::default()
    };
    let Ok(resp) = c.get(req).await else {
        return false;
    };
    let mut stream = resp.into_inner();
    let mut got = Vec::new();
    while let Ok(Some(m)) = stream.message().await {
        got.extend_from_slice(&m.data);
    }
    got == data(tenant, i)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_filling_the_cache_leaves_another_its_share() {
    let dir = tempfile::tempdir().expect("dir");
    let tenants = dir.path().join("tenants.toml");
    let hash = |k: &str| kvfabric_tenants::KeyHash::of(k).to_string();
    std::fs::write(
        &tenants,
        format!(
            "[[tenants]]\nname = \"a\"\napi_keys = [\"{}\"]\nram_share = 0.5\ndisk_share = 0.5\n\
             [[tenants]]\nname = \"b\"\napi_keys = [\"{}\"]\nram_share = 0.5\ndisk_share = 0.5\n\
             [[tenants]]\nname = \"ops\"\ntrusted = true\napi_keys = [\"{}\"]\n",
            hash("key-a"),
            hash("key-b"),
            hash("key-ops")
        ),
    )
    .expect("tenants file");
    let flags = vec!["--tenants-file".to_string(), tenants.display().to_string()];
    let node = NodeProc::start("n", dir.path(), &flags, false);
    let (mut a, mut b) = (
        client(&node.grpc, "key-a").await,
        client(&node.grpc, "key-b").await,
    );

    // b: 40 blocks (10 MiB), under its default share (half of 32 MiB).
    for i in 0..40 {
        put(&mut b, b'b', i).await;
    }
    // a: three times the tier.
    for i in 0..384 {
        put(&mut a, b'a', i).await;
    }
    let mut kept = 0;
    for i in 0..40 {
        kept += u32::from(intact(&mut b, b'b', i).await);
    }
    assert_eq!(kept, 40, "b lost blocks under its share\n{}", node.log());
    let text = get_ok_as(&node.http, "/metrics", Some("key-ops")).expect("metrics");
    let bytes = |t: &str| {
        metric_sum(
            &text,
            "kvfabric_tenant_tier_bytes",
            &[("tenant", t), ("tier", "Ram")],
        )
    };
    assert!(bytes("b") >= (40 * BLOCK) as f64, "b: {}", bytes("b"));
    assert!(bytes("a") > 0.0, "a: {}", bytes("a"));
    let share = metric_sum(
        &text,
        "kvfabric_tenant_tier_share_bytes",
        &[("tenant", "b"), ("tier", "Ram")],
    );
    assert_eq!(share, (16 << 20) as f64, "b's default share: half the tier");
}

/// Each tenant's bytes in `tier` on the node whose HTTP is `http`.
fn tier_bytes(http: &str, tenant: &str, tier: &str) -> f64 {
    let text = get_ok_as(http, "/metrics", Some("key-ops")).expect("metrics");
    metric_sum(
        &text,
        "kvfabric_tenant_tier_bytes",
        &[("tenant", tenant), ("tier", tier)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_counts_recovered_blocks_to_their_tenants() {
    let dir = tempfile::tempdir().expect("dir");
    let tenants = dir.path().join("tenants.toml");
    let hash = |k: &str| kvfabric_tenants::KeyHash::of(k).to_string();
    std::fs::write(
        &tenants,
        format!(
            "[[tenants]]\nname = \"a\"\napi_keys = [\"{}\"]\nram_share = 0.5\ndisk_share = 0.5\n\
             [[tenants]]\nname = \"b\"\napi_keys = [\"{}\"]\nram_share = 0.5\ndisk_share = 0.5\n\
             [[tenants]]\nname = \"ops\"\ntrusted = true\napi_keys = [\"{}\"]\n",
            hash("key-a"),
            hash("key-b"),
            hash("key-ops")
        ),
    )
    .expect("tenants file");
    let flags = vec!["--tenants-file".to_string(), tenants.display().to_string()];
    let mut node = NodeProc::start("n", dir.path(), &flags, true);
    {
        let (mut a, mut b) = (
            client(&node.grpc, "key-a").await,
            client(&node.grpc, "key-b").await,
        );
        // Durable: on disk with a synced index entry before the answer.
        for i in 0..8 {
            put_with(&mut a, b'a', i, true).await;
        }
        for i in 0..4 {
            put_with(&mut b, b'b', i, true).await;
        }
    }
    let before = (
        tier_bytes(&node.http, "a", "Disk"),
        tier_bytes(&node.http, "b", "Disk"),
    );
    assert!(before.0 > 0.0 && before.1 > 0.0, "{before:?}");
    node.restart();
    let mut b = client(&node.grpc, "key-b").await;
    let after = (
        tier_bytes(&node.http, "a", "Disk"),
        tier_bytes(&node.http, "b", "Disk"),
    );
    assert_eq!(after, before, "owners lost in the restart\n{}", node.log());
    assert_eq!(tier_bytes(&node.http, "default", "Disk"), 0.0);
    for i in 0..4 {
        assert!(
            intact(&mut b, b'b', i).await,
            "b's block {i} after the restart"
        );
    }
}
