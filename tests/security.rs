//! Node identity and the data plane, end to end: certificates
//! made by `kvfabric certs init`, real etcd, real `kvfabric node` processes
//! in `authenticate` mode, and in-process transfer engines as the members
//! (or outsiders) that try what the threat model says must fail.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kvfabric_node::cluster::client;
use kvfabric_node::cluster::security::client_tls;
use kvfabric_proto::internal::v1::directory_service_client::DirectoryServiceClient;
use kvfabric_proto::internal::v1::holder_service_client::HolderServiceClient;
use kvfabric_proto::internal::v1::{
    AnnounceRequest, DirectoryEntry, LeaseManyRequest, ReleaseManyRequest,
};
use kvfabric_proto::v1::Holder;
use kvfabric_testkit::procs::certs_init;
use kvfabric_testkit::procs::node::*;
use kvfabric_testkit::{eventually, EtcdProcess};
use kvfabric_transfer::security::{Capability, NodeIdentity, SecurityMode};
use kvfabric_transfer::{SharedRegion, TransferConfig, TransferEngine, TransferError, TransferOp};

const TIMEOUT: Duration = Duration::from_secs(3);

fn identity(dir: &Path, node: &str) -> Arc<NodeIdentity> {
    identity_in(dir, node, SecurityMode::Authenticate)
}

fn identity_in(dir: &Path, node: &str, mode: SecurityMode) -> Arc<NodeIdentity> {
    let read = |f: String| std::fs::read(dir.join(f)).expect("cert file");
    Arc::new(
        NodeIdentity::from_pem(
            mode,
            read(format!("{node}.crt")),
            read(format!("{node}.key")),
            read("ca.crt".into()),
        )
        .expect("identity loads"),
    )
}

/// `node`'s TLS flags (testkit's) with the tcp transport.
fn tls_flags(dir: &Path, node: &str) -> Vec<String> {
    let mut flags = kvfabric_testkit::procs::tls_flags(dir, node);
    flags.extend(["--transfer-transport".into(), "tcp".into()]);
    flags
}

/// An in-process transfer engine with `id` (None: no certificate at all).
async fn engine(id: Option<Arc<NodeIdentity>>) -> (TransferEngine, kvfabric_transfer::SegmentId) {
    let cfg = TransferConfig {
        identity: id,
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

async fn channel(addr: &str, id: &NodeIdentity) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(client_tls(id, None))
        .unwrap()
        .connect_timeout(TIMEOUT)
        .connect()
        .await
        .expect("member connects")
}

async fn secure_client(node: &NodeProc, id: &NodeIdentity) -> client::CacheClient {
    let (c, _) = eventually(
        &format!("{} to answer over TLS", node.id),
        Duration::from_secs(15),
        || async {
            client::connect_with(&node.grpc, TIMEOUT, Some(id))
                .await
                .ok()
        },
    )
    .await;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secured_cluster_refuses_outsiders_impostors_and_stray_reads() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let rogue = dir.path().join("rogue");
    certs_init(&certs, "a,b,c,d");
    certs_init(&rogue, "c");
    let etcd = EtcdProcess::start().expect("etcd");
    let flags = |n: &str| {
        let mut f = vec![
            "--etcd".into(),
            etcd.endpoint(),
            "--etcd-prefix".into(),
            "/sec".into(),
        ];
        f.extend(tls_flags(&certs, n));
        f
    };
    let a = NodeProc::start("a", dir.path(), &flags("a"), false);
    let b = NodeProc::start("b", dir.path(), &flags("b"), false);
    let (ida, idc, idd) = (
        identity(&certs, "a"),
        identity(&certs, "c"),
        identity(&certs, "d"),
    );
    let wrong = identity(&rogue, "c");
    let key = members_read_across_nodes(&a, &b, &ida).await;
    grpc_refuses_outsiders(&a, &wrong, &key).await;
    no_announce_under_another_id(&a, &idc).await;
    let remote = leases_bound_transfer_reads(&a, &idc, &idd, &key).await;
    transfer_refuses_outsiders(&a, wrong, remote).await;
    drop((a, b));
}

/// A member's cross-node read works: put on a, get from b (b leases at a,
/// shows the capability over an authenticated transfer connection). The
/// block's key.
async fn members_read_across_nodes(
    a: &NodeProc,
    b: &NodeProc,
    ida: &NodeIdentity,
) -> kvfabric_store::BlockKey {
    let mut ca = secure_client(a, ida).await;
    let cb = secure_client(b, ida).await;
    let key = keys(1, 1)[0];
    let bytes = data(&key, 4096);
    client::put_block(&mut ca, &key, &layout(), &bytes, false)
        .await
        .expect("put on a");
    let (got, _) = eventually("b to read a's block", Duration::from_secs(15), || {
        let mut cb = cb.clone();
        async move { client::get_block(&mut cb, &key).await.ok().flatten() }
    })
    .await;
    assert_eq!(
        got.1,
        bytes,
        "bit-exact across the secured data plane\n{}",
        b.log()
    );
    key
}

/// gRPC: no certificate, or one of another CA (`wrong`): no connection.
async fn grpc_refuses_outsiders(
    a: &NodeProc,
    wrong: &NodeIdentity,
    key: &kvfabric_store::BlockKey,
) {
    let plain = client::connect(&a.grpc, TIMEOUT).await;
    let plain_ok = match plain {
        Ok(mut c) => client::get_block(&mut c, key).await.is_ok(),
        Err(_) => false,
    };
    assert!(!plain_ok, "a client without a certificate was served");
    assert!(
        client::connect_with(&a.grpc, TIMEOUT, Some(wrong))
            .await
            .is_err(),
        "a certificate of another CA was accepted"
    );
}

/// A member (c) cannot announce under another node's id.
async fn no_announce_under_another_id(a: &NodeProc, idc: &NodeIdentity) {
    let mut dirc = DirectoryServiceClient::new(channel(&a.grpc, idc).await);
    let announce = |claim: &str| AnnounceRequest {
        node_id: claim.into(),
        entries: vec![DirectoryEntry {
            key: keys(2, 1)[0].as_bytes().to_vec(),
            holder: Some(Holder {
                node_id: claim.into(),
                tier: 1,
                size: 4096,
                checksum: 0,
            }),
        }],
    };
    let denied = dirc
        .announce(announce("b"))
        .await
        .expect_err("c announced as b");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    assert!(
        dirc.announce(announce("c")).await.is_ok(),
        "c may announce as itself"
    );
}

fn forbidden(r: &[Result<(), TransferError>]) -> bool {
    matches!(r[0], Err(TransferError::Forbidden { .. }))
}

/// Lease `key` at a as c (claiming d is refused), then READ through the
/// transfer plane: only the leased range, only with the capability, only
/// by c, never a WRITE, and not once released or expired. a's arena
/// segment.
async fn leases_bound_transfer_reads(
    a: &NodeProc,
    idc: &Arc<NodeIdentity>,
    idd: &Arc<NodeIdentity>,
    key: &kvfabric_store::BlockKey,
) -> kvfabric_transfer::SegmentId {
    let mut holder = HolderServiceClient::new(channel(&a.grpc, idc).await);
    let lease = |reader: &str, ttl_ms: u64| LeaseManyRequest {
        keys: vec![key.as_bytes().to_vec()],
        ttl_ms,
        reader: reader.into(),
    };
    let e = holder
        .lease_many(lease("d", 10_000))
        .await
        .expect_err("c leased as d");
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    let l = holder
        .lease_many(lease("c", 10_000))
        .await
        .unwrap()
        .into_inner()
        .leases
        .remove(0);
    let cap = Capability::decode(&l.capability).expect("a capability with the lease");
    let remote = kvfabric_transfer::SegmentId(l.segment_id);
    let (ec, segc) = engine(Some(idc.clone())).await;
    let read = |off: u64, len: u64| TransferOp::read(segc, 0, remote, l.offset + off, len);
    let r = ec
        .batch(&a.transfer, vec![read(0, l.size).with_capability(cap)])
        .await;
    assert!(r[0].is_ok(), "the leased range reads: {r:?}");
    let r = ec
        .batch(
            &a.transfer,
            vec![read(0, l.size + 4096).with_capability(cap)],
        )
        .await;
    assert!(forbidden(&r), "a READ past the leased range: {r:?}");
    let r = ec.batch(&a.transfer, vec![read(0, l.size)]).await;
    assert!(forbidden(&r), "a READ without a capability: {r:?}");
    let (ed, segd) = engine(Some(idd.clone())).await;
    let op = TransferOp::read(segd, 0, remote, l.offset, l.size).with_capability(cap);
    let r = ed.batch(&a.transfer, vec![op]).await;
    assert!(forbidden(&r), "d showing c's capability: {r:?}");

    // Remote WRITE into memory a never granted (its arena) is refused.
    let w = TransferOp::write(segc, 0, remote, l.offset, 4096);
    let r = ec.batch(&a.transfer, vec![w]).await;
    assert!(forbidden(&r), "an ungranted remote WRITE: {r:?}");

    // Released, or expired: the capability is dead.
    holder
        .release_many(ReleaseManyRequest {
            lease_ids: vec![l.lease_id],
        })
        .await
        .unwrap();
    let r = ec
        .batch(&a.transfer, vec![read(0, l.size).with_capability(cap)])
        .await;
    assert!(forbidden(&r), "a READ after the lease was released: {r:?}");
    let l = holder
        .lease_many(lease("c", 1))
        .await
        .unwrap()
        .into_inner()
        .leases
        .remove(0);
    let cap = Capability::decode(&l.capability).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let op = TransferOp::read(segc, 0, remote, l.offset, l.size).with_capability(cap);
    let r = ec.batch(&a.transfer, vec![op]).await;
    assert!(forbidden(&r), "a READ after the lease expired: {r:?}");
    remote
}

/// Transfer: no certificate, or another CA's (`wrong`): no connection, no op.
async fn transfer_refuses_outsiders(
    a: &NodeProc,
    wrong: Arc<NodeIdentity>,
    remote: kvfabric_transfer::SegmentId,
) {
    let (outsider, sego) = engine(None).await;
    let r = outsider
        .batch(
            &a.transfer,
            vec![TransferOp::read(sego, 0, remote, 0, 4096)],
        )
        .await;
    assert!(
        r[0].is_err(),
        "a transfer client without a certificate was served"
    );
    let (rogue_e, segr) = engine(Some(wrong)).await;
    let r = rogue_e
        .batch(
            &a.transfer,
            vec![TransferOp::read(segr, 0, remote, 0, 4096)],
        )
        .await;
    assert!(
        matches!(
            r[0],
            Err(TransferError::Connection { .. }) | Err(TransferError::Timeout { .. })
        ),
        "another CA's certificate opened a transfer connection: {r:?}"
    );
}

/// `authenticate` mode: a block altered in flight fails its keyed MAC and
/// the READ is refused (the store serves that as a miss); the next READ on
/// the same connection is served intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_altered_in_flight_is_refused_in_authenticate_mode() {
    let dir = tempfile::tempdir().unwrap();
    certs_init(dir.path(), "h,r");
    let (holder, hseg) = engine(Some(identity(dir.path(), "h"))).await;
    let (reader, rseg) = engine(Some(identity(dir.path(), "r"))).await;
    let addr = holder.local_addr().to_string();
    let cap = holder.issue_capability(1, hseg, 0, 1 << 20, Duration::from_secs(30), "r");
    let op = TransferOp::read(rseg, 0, hseg, 0, 1 << 20).with_capability(cap);
    assert!(reader.batch(&addr, vec![op]).await[0].is_ok());
    holder.inject_payload_corruption(1);
    let r = reader.batch(&addr, vec![op]).await;
    assert!(
        matches!(r[0], Err(TransferError::Checksum { .. })),
        "altered block accepted: {r:?}"
    );
    assert!(
        reader.batch(&addr, vec![op]).await[0].is_ok(),
        "the next READ is served"
    );
    // A granted WRITE lands; the grant's end closes the range again.
    let g = reader.grant_write(rseg, 0, 4096, "h", Duration::from_secs(30));
    let w = TransferOp::write(hseg, 0, rseg, 0, 4096);
    assert!(holder
        .batch(&reader.local_addr().to_string(), vec![w])
        .await[0]
        .is_ok());
    reader.revoke_write(g);
    let r = holder
        .batch(&reader.local_addr().to_string(), vec![w])
        .await;
    assert!(
        matches!(r[0], Err(TransferError::Forbidden { .. })),
        "{r:?}"
    );
}

/// `encrypt` mode: pipelined, sliced READs inside TLS arrive intact (every
/// frame is flushed through the TLS session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypt_mode_moves_sliced_reads_intact() {
    let dir = tempfile::tempdir().unwrap();
    certs_init(dir.path(), "h,r");
    let id = |n: &str| Some(identity_in(dir.path(), n, SecurityMode::Encrypt));
    let (holder, hseg) = engine(id("h")).await;
    let (reader, rseg) = engine(id("r")).await;
    let addr = holder.local_addr().to_string();
    let cap = holder.issue_capability(1, hseg, 0, 1 << 20, Duration::from_secs(30), "r");
    let ops: Vec<TransferOp> = (0..4)
        .map(|i| TransferOp::read(rseg, i << 18, hseg, i << 18, 1 << 18).with_capability(cap))
        .collect();
    let r = reader.batch(&addr, ops).await;
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
}

/// An embedded node `id` in `authenticate` mode with its certificate from
/// `certs` (made by `kvfabric certs init`), moving blocks over tcp.
async fn secure_embedded(
    etcd: &EtcdProcess,
    certs: &Path,
    id: &str,
) -> kvfabric_connector::EmbeddedNode {
    let ip = std::net::IpAddr::from([127, 0, 0, 1]);
    let cfg = kvfabric_store::NodeConfig {
        node_id: id.into(),
        grpc_listen: std::net::SocketAddr::new(ip, 0),
        http_listen: std::net::SocketAddr::new(ip, 0),
        ram_capacity: bytesize::ByteSize::mib(256),
        ..Default::default()
    };
    let cluster = kvfabric_node::cluster::ClusterConfig {
        etcd: vec![etcd.endpoint()],
        etcd_prefix: "/sec-engine".into(),
        lease_ttl_ms: 2000,
        transfer_listen: std::net::SocketAddr::new(ip, 0).to_string(),
        // Bytes in flight: tcp (shm maps the holder's memory, nothing travels).
        transfer_transport: "tcp".into(),
        security: kvfabric_transfer::security::SecurityConfig::from_dir(
            certs,
            id,
            SecurityMode::Authenticate,
        ),
        ..Default::default()
    };
    kvfabric_connector::EmbeddedNode::start(cfg, cluster)
        .await
        .expect("embedded node in authenticate mode")
}

/// `authenticate` mode with real engines: engine A's prefix, read by engine
/// B from node A with one payload altered in flight, fails its keyed MAC;
/// B counts the block as a failed load (a miss), recomputes, and its tokens
/// and logits are bitwise those of a run with no cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_altered_block_is_a_miss_and_recomputed_bit_exact() {
    use kvfabric_testkit::fabric::{engine, engine_config, generate, same_bits, tokens};
    let dir = tempfile::tempdir().unwrap();
    certs_init(dir.path(), "a,b");
    let etcd = EtcdProcess::start().expect("etcd");
    let a = secure_embedded(&etcd, dir.path(), "a").await;
    let b = secure_embedded(&etcd, dir.path(), "b").await;
    kvfabric_testkit::fabric::wait_members(&[&a, &b], 2).await;
    let cfg = engine_config();
    let (ea, eb) = (engine(Some(&a), &cfg), engine(Some(&b), &cfg));
    // 5 full blocks, then 20 new tokens.
    let prompt = tokens(31, 320);
    let mut longer = prompt.clone();
    longer.extend(tokens(32, 20));
    let cold = generate(&eb.handle, &longer, 4, b"cold").await;
    assert_eq!(cold.usage.cached_tokens, 0);

    generate(&ea.handle, &prompt, 1, b"").await;
    let ca = ea.connector.as_ref().expect("connector");
    assert!(ca.flush(Duration::from_secs(30)), "A's saves finished");
    assert_eq!(ca.stats().saved_blocks, 5);
    // Node A alters the next payload it sends (under its MAC tag).
    a.node().transfer().inject_payload_corruption(1);

    let warm = generate(&eb.handle, &longer, 4, b"").await;
    let cb = eb.connector.as_ref().expect("connector");
    let st = cb.stats();
    eprintln!(
        "altered block: {} cached tokens, {} blocks loaded, {} failed (recomputed)",
        warm.usage.cached_tokens, st.loaded_blocks, st.load_failed_blocks
    );
    assert!(
        st.load_failed_blocks >= 1,
        "the altered block was not counted as a failed load: {st:?}"
    );
    assert!(
        warm.usage.cached_tokens < 320,
        "the altered block was used: {} cached tokens",
        warm.usage.cached_tokens
    );
    assert_eq!(
        warm.tokens, cold.tokens,
        "greedy tokens differ from a cold run"
    );
    for (w, c) in warm.logits.iter().zip(&cold.logits) {
        assert!(same_bits(w, c), "logits differ from a cold run");
    }
}
