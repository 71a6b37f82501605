//! Security II, end to end (real etcd, secured `kvfabric node` processes,
//! certificates from `kvfabric certs init --nodes .. --tools .. --tenants ..`,
//! a tenants file):
//!
//! - a tool's or a tenant's certificate is a client, never a member: the
//!   holder and directory services and the transfer plane refuse it, while
//!   the CacheService serves it under its API key, and a tenant's KV events
//!   show only its own blocks;
//! - `ctl status` through one node of a cluster with a tenants file shows
//!   every peer alive (node-to-node Stats carry the node's certificate);
//! - a member cannot answer for another node: a client meaning node b gets
//!   no connection from node c (gRPC and transfer), and with b's membership
//!   record in etcd forged to c's addresses, and c holding other bytes
//!   under b's key, a reader never gets c's bytes: c's announcement of other
//!   bytes is refused by the key's directory owner, and the connection meant
//!   for b never reaches c;
//! - `kvfabric certs revoke` cuts a certificate off within 5 s, on open
//!   connections (gRPC and transfer) and new ones.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kvfabric_node::cluster::client::{self, CacheClient};
use kvfabric_node::cluster::security::client_tls;
use kvfabric_proto::internal::v1::directory_service_client::DirectoryServiceClient;
use kvfabric_proto::internal::v1::holder_service_client::HolderServiceClient;
use kvfabric_proto::internal::v1::{LeaseManyRequest, LocateRequest};
use kvfabric_proto::v1::kv_event_service_client::KvEventServiceClient;
use kvfabric_proto::v1::{KvEventKind, KvEventsRequest};
use kvfabric_store::BlockKey;
use kvfabric_tenants::KeyHash;
use kvfabric_testkit::procs::node::*;
use kvfabric_testkit::procs::{certs_init_with, identity, metric_as, tls_flags};
use kvfabric_testkit::{eventually, EtcdProcess};
use kvfabric_transfer::security::NodeIdentity;
use kvfabric_transfer::{SharedRegion, TransferConfig, TransferEngine, TransferOp};
use tonic::metadata::MetadataMap;

const BIN: &str = env!("CARGO_BIN_EXE_kvfabric");
const TIMEOUT: Duration = Duration::from_secs(3);
const PREFIX: &str = "/roles";

/// acme and globex (tenants), ops (trusted: operators' tools).
fn write_tenants(path: &Path) {
    let t = |name: &str, trusted: bool| {
        format!(
            "[[tenants]]\nname = \"{name}\"\ntrusted = {trusted}\napi_keys = [\"{}\"]\n",
            KeyHash::of(&format!("key-{name}"))
        )
    };
    let text = [t("acme", false), t("globex", false), t("ops", true)].concat();
    std::fs::write(path, text).expect("tenants file");
}

/// Certificates, tenants file, etcd and secured nodes `ids`.
struct Cluster {
    dir: tempfile::TempDir,
    etcd: EtcdProcess,
    nodes: Vec<NodeProc>,
}

impl Cluster {
    fn start(ids: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        let nodes = ids.join(",");
        certs_init_with(
            &certs,
            &[
                "--nodes",
                &nodes,
                "--tools",
                "ops",
                "--tenants",
                "acme,globex",
            ],
        );
        let tenants = dir.path().join("tenants.toml");
        write_tenants(&tenants);
        let etcd = EtcdProcess::start().expect("etcd");
        let nodes = ids
            .iter()
            .map(|id| {
                let mut f = vec![
                    "--etcd".into(),
                    etcd.endpoint(),
                    "--etcd-prefix".into(),
                    PREFIX.into(),
                    "--transfer-transport".into(),
                    "tcp".into(),
                    "--tenants-file".into(),
                    tenants.display().to_string(),
                ];
                f.extend(tls_flags(&certs, id));
                f.extend([
                    "--tls-crl".into(),
                    certs.join("ca.crl").display().to_string(),
                ]);
                NodeProc::start(id, dir.path(), &f, false)
            })
            .collect();
        Cluster { dir, etcd, nodes }
    }

    fn certs(&self) -> std::path::PathBuf {
        self.dir.path().join("certs")
    }

    fn id(&self, name: &str) -> Arc<NodeIdentity> {
        identity(&self.certs(), name)
    }

    /// A CacheService client of `node` with `name`'s certificate.
    async fn client(&self, node: usize, name: &str) -> CacheClient {
        let id = self.id(name);
        let n = &self.nodes[node];
        let (c, _) = eventually(
            &format!("{} over TLS", n.id),
            Duration::from_secs(20),
            || {
                let id = id.clone();
                async move { client::connect_with(&n.grpc, TIMEOUT, Some(&id)).await.ok() }
            },
        )
        .await;
        c
    }
}

fn bearer(key: &str) -> MetadataMap {
    let mut m = MetadataMap::new();
    m.insert("authorization", format!("Bearer {key}").parse().unwrap());
    m
}

async fn put(c: &mut CacheClient, api_key: &str, key: &BlockKey, bytes: &[u8]) {
    client::put_block_with(c, key, &layout(), bytes, false, bearer(api_key))
        .await
        .expect("put");
}

async fn get(c: &mut CacheClient, api_key: &str, key: &BlockKey) -> Option<Vec<u8>> {
    client::get_block_with(c, key, bearer(api_key))
        .await
        .ok()
        .flatten()
        .map(|(_, b)| b)
}

/// A gRPC channel to `addr` with `id`'s certificate, verifying the server
/// as node `expected` (None: any node).
async fn channel(
    addr: &str,
    id: &NodeIdentity,
    expected: Option<&str>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(client_tls(id, expected))
        .unwrap()
        .connect_timeout(TIMEOUT)
        .connect()
        .await
}

async fn engine(id: Arc<NodeIdentity>) -> (TransferEngine, kvfabric_transfer::SegmentId) {
    let cfg = TransferConfig {
        identity: Some(id),
        transport: kvfabric_transfer::TransportChoice::Tcp,
        op_timeout_ms: 3000,
        ..TransferConfig::default()
    };
    let mut registry = prometheus_client::registry::Registry::default();
    let e = TransferEngine::start(cfg, &mut registry)
        .await
        .expect("engine");
    let seg = e.register(Arc::new(
        SharedRegion::create("t", 1 << 20).expect("region"),
    ));
    (e, seg)
}

/// `kvfabric ctl status --json` through `addr` as the ops tool with its
/// key: (node id, alive) of every node listed.
fn status(certs: &Path, addr: &str) -> Vec<(String, bool)> {
    let out = std::process::Command::new("timeout")
        .arg("30")
        .arg(BIN)
        .args([
            "ctl",
            "--addr",
            addr,
            "--timeout-ms",
            "3000",
            "--api-key",
            "key-ops",
        ])
        .args(tls_flags(certs, "ops"))
        .args(["status", "--json"])
        .output()
        .expect("run ctl");
    if !out.status.success() {
        return Vec::new();
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let mut nodes: Vec<(String, bool)> = v["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| {
            let id = n["node_id"].as_str().unwrap_or("").to_string();
            (id, n["alive"].as_bool().unwrap_or(false))
        })
        .collect();
    nodes.sort();
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_and_tenant_certificates_are_clients_never_members() {
    let cl = Cluster::start(&["a", "b"]);
    let (a, certs) = (&cl.nodes[0], cl.certs());

    // Peers alive through a node with a tenants file (was: b shown dead).
    let want = vec![("a".to_string(), true), ("b".to_string(), true)];
    eventually(
        "ctl status to list a and b alive",
        Duration::from_secs(30),
        || {
            let ok = status(&certs, &a.grpc) == want;
            async move { ok.then_some(()) }
        },
    )
    .await;

    // The tenant's certificate is a CacheService client under its key...
    let mut ops = cl.client(0, "ops").await;
    let mut acme = cl.client(0, "acme").await;
    let k = keys(40, 2);
    let bytes = data(&k[0], 4096);
    put(&mut ops, "key-ops", &k[0], &bytes).await;
    put(&mut acme, "key-acme", &k[1], &data(&k[1], 4096)).await;
    assert_eq!(
        get(&mut acme, "key-acme", &k[1]).await.map(|b| b.len()),
        Some(4096)
    );

    // ...and no member: no lease, no locate, no transfer connection.
    let acme_id = cl.id("acme");
    let ch = channel(&a.grpc, &acme_id, None).await.expect("TLS to a");
    let lease = HolderServiceClient::new(ch.clone())
        .lease_many(LeaseManyRequest {
            keys: vec![k[0].as_bytes().to_vec()],
            ttl_ms: 10_000,
            reader: "acme".into(),
        })
        .await
        .expect_err("a tenant leased a block");
    assert_eq!(lease.code(), tonic::Code::Unauthenticated, "{lease:?}");
    let locate = DirectoryServiceClient::new(ch)
        .locate(LocateRequest {
            keys: vec![k[0].as_bytes().to_vec()],
            lookup: false,
        })
        .await
        .expect_err("a tenant located a block");
    assert_eq!(locate.code(), tonic::Code::Unauthenticated, "{locate:?}");
    for name in ["acme", "ops"] {
        let (e, seg) = engine(cl.id(name)).await;
        let any = kvfabric_transfer::SegmentId(1);
        let r = e
            .batch(&a.transfer, vec![TransferOp::read(seg, 0, any, 0, 4096)])
            .await;
        assert!(
            matches!(
                &r[0],
                Err(kvfabric_transfer::TransferError::Connection { .. })
            ),
            "{name}'s certificate opened a transfer connection: {r:?}"
        );
    }

    // KV events: acme sees its own block, not globex's nor ops'.
    let ch = channel(&a.grpc, &acme_id, None).await.expect("TLS to a");
    let subscribe = |key: &'static str| {
        let mut ev = KvEventServiceClient::new(ch.clone());
        async move {
            let mut r = tonic::Request::new(KvEventsRequest {});
            *r.metadata_mut() = bearer(key);
            ev.kv_events(r).await.expect("subscribe").into_inner()
        }
    };
    let (mut of_acme, mut of_ops) = (subscribe("key-acme").await, subscribe("key-ops").await);
    let mut globex = cl.client(0, "globex").await;
    let more = keys(41, 3);
    put(&mut ops, "key-ops", &more[0], &data(&more[0], 4096)).await;
    put(&mut globex, "key-globex", &more[1], &data(&more[1], 4096)).await;
    put(&mut acme, "key-acme", &more[2], &data(&more[2], 4096)).await;
    let all = stored(&mut of_ops, 3).await;
    assert_eq!(
        stored(&mut of_acme, 1).await,
        vec![all[2].clone()],
        "only acme's own"
    );
    drop(cl.etcd);
}

/// The keys of the next `n` Stored events (10 s at most each).
async fn stored(
    events: &mut tonic::Streaming<kvfabric_proto::v1::KvEvent>,
    n: usize,
) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while out.len() < n {
        let e = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .expect("an event in time")
            .expect("stream")
            .expect("open");
        if e.kind() == KvEventKind::Stored {
            out.push(e.key);
        }
    }
    out
}

/// Write `value` under `key` in etcd through its JSON gateway, as any
/// process that reaches etcd can.
fn etcd_put(endpoint: &str, key: &str, value: &str) {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let body = format!("{{\"key\":\"{}\",\"value\":\"{}\"}}", b64(key), b64(value));
    let out = std::process::Command::new("curl")
        .args([
            "-sf",
            "-X",
            "POST",
            &format!("{endpoint}/v3/kv/put"),
            "-d",
            &body,
        ])
        .output()
        .expect("curl");
    assert!(out.status.success(), "etcd put: {:?}", out);
}

/// The gRPC address `ctl status` through `addr` lists for node `id`.
fn listed_addr(certs: &Path, addr: &str, id: &str) -> Option<String> {
    let out = std::process::Command::new(BIN)
        .args(["ctl", "--addr", addr, "--api-key", "key-ops"])
        .args(tls_flags(certs, "ops"))
        .args(["status", "--json"])
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v["nodes"]
        .as_array()?
        .iter()
        .find(|n| n["node_id"] == id)
        .and_then(|n| n["grpc_addr"].as_str().map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_answer_for_another_node() {
    let cl = Cluster::start(&["a", "b", "c"]);
    let (a, c) = (&cl.nodes[0], &cl.nodes[2]);
    let ida = cl.id("a");
    let mut on_a = cl.client(0, "ops").await;
    let mut on_b = cl.client(1, "ops").await;
    let mut on_c = cl.client(2, "ops").await;

    // Straight to c (up and serving), meaning b: no gRPC and no transfer connection.
    assert!(
        channel(&c.grpc, &ida, Some("b")).await.is_err(),
        "c answered as b"
    );
    assert!(
        channel(&c.grpc, &ida, Some("c")).await.is_ok(),
        "c answers as c"
    );
    let (e, seg) = engine(ida.clone()).await;
    e.expect_node(&c.transfer, "b");
    let any = kvfabric_transfer::SegmentId(1);
    let r = e
        .batch(&c.transfer, vec![TransferOp::read(seg, 0, any, 0, 4096)])
        .await;
    assert!(
        matches!(
            &r[0],
            Err(kvfabric_transfer::TransferError::Connection { .. })
        ),
        "c's transfer port answered as b: {r:?}"
    );

    // b holds the block; a reads it.
    let key = keys(42, 1)[0];
    let good = data(&key, 4096);
    put(&mut on_b, "key-ops", &key, &good).await;
    eventually("a to read b's block", Duration::from_secs(20), || {
        let mut on_a = on_a.clone();
        let good = good.clone();
        async move { (get(&mut on_a, "key-ops", &key).await == Some(good)).then_some(()) }
    })
    .await;

    // c stores other bytes under the key: its announcement is refused.
    let evil = vec![0xee; 4096];
    put(&mut on_c, "key-ops", &key, &evil).await;
    let nodes = &cl.nodes;
    eventually(
        "the owner to refuse c's announcement",
        Duration::from_secs(20),
        || {
            let refused: f64 = nodes
                .iter()
                .map(|n| {
                    metric_as(
                        &n.http,
                        "kvfabric_directory_conflicting_announces",
                        Some("key-ops"),
                    )
                })
                .sum();
            async move { (refused >= 1.0).then_some(()) }
        },
    )
    .await;

    // b's record forged to c's addresses: the cluster sees "b" at c.
    let forged = format!(
        "{{\"node_id\":\"b\",\"grpc_addr\":\"{}\",\"transfer_addr\":\"{}\"}}",
        c.grpc, c.transfer
    );
    etcd_put(&cl.etcd.endpoint(), &format!("{PREFIX}/nodes/zz"), &forged);
    let certs = cl.certs();
    eventually("a to see b at c's address", Duration::from_secs(20), || {
        let seen = listed_addr(&certs, &a.grpc, "b") == Some(c.grpc.clone());
        async move { seen.then_some(()) }
    })
    .await;
    // a's reads of the key never return c's bytes.
    for _ in 0..10 {
        let got = get(&mut on_a, "key-ops", &key).await;
        assert!(
            got.as_ref().is_none_or(|g| *g == good),
            "a served c's bytes as b's"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(cl.etcd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_certificate_is_refused_within_5s_on_open_and_new_connections() {
    let cl = Cluster::start(&["a", "b", "c"]);
    let a = &cl.nodes[0];
    // Open connections: ops' gRPC client, c's transfer link to a.
    let mut ops = cl.client(0, "ops").await;
    let _ = cl.client(2, "ops").await; // c is up
    let key = keys(43, 1)[0];
    put(&mut ops, "key-ops", &key, &data(&key, 4096)).await;
    let (e, seg) = engine(cl.id("c")).await;
    let any = kvfabric_transfer::SegmentId(1);
    let read = || TransferOp::read(seg, 0, any, 0, 4096);
    let r = e.batch(&a.transfer, vec![read()]).await;
    assert!(
        !matches!(
            &r[0],
            Err(kvfabric_transfer::TransferError::Connection { .. })
        ),
        "c's link is up (its READ of no segment refused by a, not the link): {r:?}"
    );

    let out = std::process::Command::new(BIN)
        .args([
            "certs",
            "revoke",
            &cl.certs().display().to_string(),
            "ops",
            "c",
        ])
        .output()
        .expect("certs revoke");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let revoked_at = std::time::Instant::now();
    eventually(
        "ops' open connection refused",
        Duration::from_secs(5),
        || {
            let mut ops = ops.clone();
            async move {
                let r = client::get_block_with(&mut ops, &key, bearer("key-ops")).await;
                matches!(r, Err(s) if s.code() == tonic::Code::Unauthenticated).then_some(())
            }
        },
    )
    .await;
    eventually("c's transfer link cut", Duration::from_secs(5), || {
        let e = &e;
        async move {
            let r = e.batch(&a.transfer, vec![read()]).await;
            matches!(
                &r[0],
                Err(kvfabric_transfer::TransferError::Connection { .. })
            )
            .then_some(())
        }
    })
    .await;
    assert!(revoked_at.elapsed() < Duration::from_secs(5));
    // New connections: refused the same way; b's certificate still serves.
    let mut fresh = client::connect_with(&a.grpc, TIMEOUT, Some(&cl.id("ops")))
        .await
        .expect("the handshake itself still completes");
    let r = client::get_block_with(&mut fresh, &key, bearer("key-ops")).await;
    assert_eq!(
        r.err().map(|s| s.code()),
        Some(tonic::Code::Unauthenticated)
    );
    let mut member = client::connect_with(&a.grpc, TIMEOUT, Some(&cl.id("b")))
        .await
        .expect("b connects");
    assert!(
        get(&mut member, "key-ops", &key).await.is_some(),
        "b is not revoked"
    );
    drop(cl.etcd);
}
