//! Cross-node prefix reuse through the connector: two engines, each with an
//! embedded fabric node, on a real etcd. What engine A computed, engine B
//! loads (no session routing), and B's output is bitwise what B computes
//! with no cache at all; corrupted blocks are recomputed, not used. Reuse
//! runs with f16 KV (the default) and f32 KV; engines of different KV dtypes
//! never read each other's blocks. The 2048-token reuse also runs across two
//! hosts of a test bed (network namespaces), where the transfer has to go
//! over TCP.

use std::net::IpAddr;
use std::time::Duration;

use kvfabric_engine::KvDtype;
use kvfabric_testbed::Testbed;
use kvfabric_testkit::fabric::*;
use kvfabric_testkit::EtcdProcess;

const PROMPT: usize = 2048;
const EXTRA: usize = 64;
const GEN: usize = 4;

/// A 2048-token prompt prefilled on A; the same prompt + 64 tokens on B ->
/// B reports >= 1984 cached tokens loaded from A, and its logits and greedy
/// tokens are bitwise those of a cold run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_computed_on_a_is_reused_bit_exact_on_b_f16() {
    reuse_bit_exact(KvDtype::F16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_computed_on_a_is_reused_bit_exact_on_b_f32() {
    reuse_bit_exact(KvDtype::F32).await;
}

async fn reuse_bit_exact(kv_dtype: KvDtype) {
    let etcd = EtcdProcess::start().expect("etcd");
    let a = node(&etcd, "/t-reuse", "a").await;
    let b = node(&etcd, "/t-reuse", "b").await;
    wait_members(&[&a, &b], 2).await;
    let cfg = kvfabric_engine::EngineConfig {
        kv_dtype,
        ..engine_config()
    };
    let ea = engine(Some(&a), &cfg);
    let eb = engine(Some(&b), &cfg);

    let prompt = tokens(7, PROMPT);
    let mut longer = prompt.clone();
    longer.extend(tokens(8, EXTRA));

    // Cold on B, in a namespace nobody else uses: nothing to reuse.
    let cold = generate(&eb.handle, &longer, GEN, b"cold").await;
    assert_eq!(cold.usage.cached_tokens, 0);

    let first = generate(&ea.handle, &prompt, 1, b"").await;
    assert_eq!(first.usage.cached_tokens, 0);
    let ca = ea.connector.as_ref().expect("connector");
    assert!(ca.flush(Duration::from_secs(30)), "A's saves finished");
    assert_eq!(ca.stats().saved_blocks, (PROMPT / 64) as u64);

    let warm = generate(&eb.handle, &longer, GEN, b"").await;
    let cb = eb.connector.as_ref().expect("connector");
    assert!(
        warm.usage.cached_tokens >= PROMPT - 64,
        "B reused {} tokens",
        warm.usage.cached_tokens
    );
    assert_eq!(
        cb.stats().loaded_blocks,
        (PROMPT / 64) as u64,
        "loaded from the fabric"
    );
    assert_eq!(cb.stats().streamed_loads, 1, "loaded layer by layer");
    // A stored its blocks under this dtype's keys, each this dtype's KV bytes
    // (f16: half of f32's) and the connector's per-layer checksum trailer,
    // and those are the blocks B loaded.
    let layout = kv_layout(kv_dtype);
    let keys = kvfabric_store::KeyChain::new(b"", &model().fingerprint(), &layout).keys(&prompt);
    for info in a.node().store().block_infos(&keys) {
        let info = info.expect("A holds every block of the prompt");
        assert_eq!(info.layout, layout);
        let trailer = kvfabric_connector::trailer::trailer_len(&layout);
        assert_eq!(info.len, (layout.block_bytes() + trailer) as u64);
    }
    assert_eq!(warm.tokens, cold.tokens);
    for (w, c) in warm.logits.iter().zip(&cold.logits) {
        assert!(same_bits(w, c), "logits differ from the cold run");
    }
    eprintln!("cold ttft {:?}, warm ttft {:?}", cold.ttft, warm.ttft);
    drop(ea);
    drop(eb);
    a.stop().await;
    b.stop().await;
}

/// Run `fut` on a worker of `rt` (inside that runtime's host) and wait.
fn on<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    rt.block_on(rt.spawn(fut))
        .expect("task on a host's runtime")
}

/// The same reuse with A and B on two hosts (network namespaces joined by a
/// bridge; etcd on A's host). Abstract Unix sockets are per namespace, so
/// the shm handshake fails and B's node reads A's blocks over TCP: its
/// transfer metrics count every loaded byte under tcp and none under shm.
#[test]
fn prefix_computed_on_a_is_reused_bit_exact_on_b_across_hosts() {
    let Some(bed) = Testbed::up_or_skip(2, None) else {
        return;
    };
    let (ip0, ip1) = (IpAddr::V4(bed.host(0).ip()), IpAddr::V4(bed.host(1).ip()));
    let rt0 = bed.host(0).runtime(2).expect("runtime in host 0");
    let rt1 = bed.host(1).runtime(2).expect("runtime in host 1");
    let etcd = rt0
        .block_on(rt0.spawn_blocking(move || EtcdProcess::start_on(ip0)))
        .expect("etcd task")
        .expect("etcd on host 0");
    let a = on(&rt0, node_on(etcd.endpoint(), "/t-hosts", "a", ip0));
    let b = on(&rt1, node_on(etcd.endpoint(), "/t-hosts", "b", ip1));
    rt0.block_on(wait_members(&[&a, &b], 2));
    // Engines start from a thread of their host: every thread they start
    // and every task their connector spawns stays inside it.
    let start = |rt: &tokio::runtime::Runtime, node: &kvfabric_connector::EmbeddedNode| {
        let n = node.node().clone();
        rt.block_on(rt.spawn_blocking(move || {
            let connect = kvfabric_connector::FabricConnector::connect_fn(
                n,
                kvfabric_connector::ConnectorConfig::default(),
            );
            engine_with(Some(connect), &engine_config())
        }))
        .expect("engine start task")
    };
    let ea = start(&rt0, &a);
    let eb = start(&rt1, &b);

    let prompt = tokens(7, PROMPT);
    let mut longer = prompt.clone();
    longer.extend(tokens(8, EXTRA));
    let (hb, hl) = (eb.handle.clone(), longer.clone());
    let cold = on(&rt1, async move { generate(&hb, &hl, GEN, b"cold").await });
    assert_eq!(cold.usage.cached_tokens, 0);
    let (ha, hp) = (ea.handle.clone(), prompt.clone());
    let first = on(&rt0, async move { generate(&ha, &hp, 1, b"").await });
    assert_eq!(first.usage.cached_tokens, 0);
    let ca = ea.connector.as_ref().expect("connector");
    assert!(ca.flush(Duration::from_secs(30)), "A's saves finished");

    let (hb, hl) = (eb.handle.clone(), longer.clone());
    let warm = on(&rt1, async move { generate(&hb, &hl, GEN, b"").await });
    let cb = eb.connector.as_ref().expect("connector");
    assert!(
        warm.usage.cached_tokens >= PROMPT - 64,
        "B reused {} tokens",
        warm.usage.cached_tokens
    );
    assert_eq!(cb.stats().loaded_blocks, (PROMPT / 64) as u64);
    assert_eq!(warm.tokens, cold.tokens);
    for (w, c) in warm.logits.iter().zip(&cold.logits) {
        assert!(same_bits(w, c), "logits differ from the cold run");
    }

    let http = b.http_addr();
    let text = rt1
        .block_on(rt1.spawn_blocking(move || node_metrics(http)))
        .expect("metrics task");
    let bytes = |transport| {
        metric_sum(
            &text,
            "kvfabric_transfer_bytes_total",
            &[("transport", transport), ("direction", "Read")],
        )
    };
    let layout = {
        let c = &model().config;
        // The engines keep the default KV dtype.
        let dtype = kvfabric_engine::EngineConfig::default().kv_dtype;
        kvfabric_engine::kv::KvPool::layout_for(c.layers, c.kv_heads, c.head_dim, 64, dtype.into())
    };
    let prefix_bytes = (PROMPT / 64) as f64 * layout.block_bytes() as f64;
    assert!(
        bytes("Tcp") >= prefix_bytes,
        "B's node read {} bytes over tcp, the prefix is {prefix_bytes}:\n{text}",
        bytes("Tcp")
    );
    assert_eq!(bytes("Shm"), 0.0, "shm used between two hosts");
    eprintln!(
        "across hosts: cold ttft {:?}, warm ttft {:?}, {} bytes over tcp",
        cold.ttft,
        warm.ttft,
        bytes("Tcp")
    );
    drop((ea, eb));
    on(&rt0, a.stop());
    on(&rt1, b.stop());
    drop(etcd);
}

/// A block corrupted in A's store fails its checksum on B: B uses the
/// blocks before it, recomputes it and everything after, and the output is
/// still bitwise the cold run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_block_is_recomputed_with_everything_after_it() {
    let etcd = EtcdProcess::start().expect("etcd");
    let a = node(&etcd, "/t-corrupt", "a").await;
    let b = node(&etcd, "/t-corrupt", "b").await;
    wait_members(&[&a, &b], 2).await;
    let mut cfg = engine_config();
    cfg.kv_pool = bytesize::ByteSize::mib(64);
    let ea = engine(Some(&a), &cfg);
    let eb = engine(Some(&b), &cfg);

    let prompt = tokens(11, 640);
    let mut longer = prompt.clone();
    longer.extend(tokens(12, 10));
    let cold = generate(&eb.handle, &longer, GEN, b"cold").await;
    generate(&ea.handle, &prompt, 1, b"").await;
    let ca = ea.connector.as_ref().expect("connector");
    assert!(ca.flush(Duration::from_secs(30)));

    // Flip one byte in layer 20 of block 4 of the prompt where A's store
    // keeps it: B's layer-wise load has already streamed layers 0..20 of
    // every block into a forward pass when the check fails.
    let keys = kvfabric_store::KeyChain::new(b"", &model().fingerprint(), &kv_layout(cfg.kv_dtype))
        .keys(&prompt[..640]);
    let store = a.node().store();
    let lease = store
        .lease(&keys[4])
        .expect("lease")
        .expect("A holds block 4");
    let layer_bytes = lease.info().layout.layer_bytes();
    let at = lease.region_offset() as usize + 20 * layer_bytes + 1000;
    drop(lease);
    // SAFETY: test-only corruption of a committed block nobody is reading.
    unsafe { store.region().slice_mut(at, 1).expect("in region")[0] ^= 0x5a };

    let warm = generate(&eb.handle, &longer, GEN, b"").await;
    let stats = eb.connector.as_ref().expect("connector").stats();
    assert_eq!(
        warm.usage.cached_tokens,
        4 * 64,
        "blocks 0..4 reused, 4.. recomputed"
    );
    assert_eq!(stats.loaded_blocks, 4);
    assert!(stats.load_failed_blocks >= 1);
    assert_eq!(
        stats.streamed_loads, 1,
        "the load streamed before the bad layer"
    );
    assert_eq!(warm.tokens, cold.tokens);
    for (w, c) in warm.logits.iter().zip(&cold.logits) {
        assert!(same_bits(w, c), "logits differ from the cold run");
    }
    drop(ea);
    drop(eb);
    a.stop().await;
    b.stop().await;
}

/// A request queued behind another on B gets its prefix pulled from A into
/// B's own node while it waits (prefetch); it is then loaded from there. The
/// copies count to the request's tenant in B's tier shares, as its saves do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_prefetches_its_prefix_into_its_own_node() {
    let etcd = EtcdProcess::start().expect("etcd");
    let a = node(&etcd, "/t-prefetch", "a").await;
    let b = node(&etcd, "/t-prefetch", "b").await;
    wait_members(&[&a, &b], 2).await;
    let cfg = engine_config();
    let ea = engine(Some(&a), &cfg);
    let one_at_a_time = kvfabric_engine::EngineConfig {
        max_seqs: 1,
        ..engine_config()
    };
    let eb = engine(Some(&b), &one_at_a_time);

    let prompt = tokens(31, 320);
    generate(&ea.handle, &prompt, 1, b"").await;
    assert!(ea
        .connector
        .as_ref()
        .expect("connector")
        .flush(Duration::from_secs(30)));

    // B is busy decoding something else; the second request has to wait.
    let busy = {
        let h = eb.handle.clone();
        let other = tokens(32, 40);
        tokio::spawn(async move { generate(&h, &other, 48, b"").await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut longer = prompt.clone();
    longer.extend(tokens(33, 10));
    let warm = generate_as(&eb.handle, &longer, 2, b"", Some("tenant-b".into())).await;
    busy.await.expect("busy request");
    assert_eq!(warm.usage.cached_tokens, 320);
    let stats = eb.connector.as_ref().expect("connector").stats();
    assert_eq!(
        stats.prefetched_blocks, 5,
        "pulled into B's node while queued"
    );
    let keys = kvfabric_store::KeyChain::new(b"", &model().fingerprint(), &kv_layout(cfg.kv_dtype))
        .keys(&prompt);
    let held = b.node().store().block_infos(&keys);
    assert!(
        held.iter().all(Option::is_some),
        "B's own node holds the prefix"
    );
    let usage = b.node().store().tenant_usage();
    let owned = usage.iter().find(|u| &*u.owner == "tenant-b");
    let copied: u64 = held.iter().flatten().map(|i| i.len).sum();
    assert!(
        owned.is_some_and(|u| u.ram_used >= copied),
        "the prefetched copies ({copied} bytes) count to the request's tenant: {usage:?}"
    );
    drop(ea);
    drop(eb);
    a.stop().await;
    b.stop().await;
}

/// The reference model's block layout with 64-token blocks of `dtype`.
fn kv_layout(dtype: KvDtype) -> kvfabric_store::KvLayout {
    let c = &model().config;
    kvfabric_engine::kv::KvPool::layout_for(c.layers, c.kv_heads, c.head_dim, 64, dtype.into())
}

/// An f32-KV engine and an f16-KV engine on one cluster: the blocks each
/// saves are keyed by its dtype, so neither loads the other's (they would
/// be read as the wrong element type), and both still save their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_of_different_kv_dtypes_never_share_blocks() {
    let etcd = EtcdProcess::start().expect("etcd");
    let a = node(&etcd, "/t-dtype", "a").await;
    let b = node(&etcd, "/t-dtype", "b").await;
    wait_members(&[&a, &b], 2).await;
    let f32_cfg = kvfabric_engine::EngineConfig {
        kv_dtype: KvDtype::F32,
        ..engine_config()
    };
    let e32 = engine(Some(&a), &f32_cfg);
    let e16 = engine(Some(&b), &engine_config());
    let prompt = tokens(41, 256);
    let mut longer = prompt.clone();
    longer.extend(tokens(42, 10));

    generate(&e32.handle, &prompt, 1, b"").await;
    let c32 = e32.connector.as_ref().expect("connector");
    assert!(c32.flush(Duration::from_secs(30)));
    assert_eq!(c32.stats().saved_blocks, 4);
    let on16 = generate(&e16.handle, &longer, 1, b"").await;
    let c16 = e16.connector.as_ref().expect("connector");
    assert_eq!(on16.usage.cached_tokens, 0, "f16 engine reused f32 blocks");
    assert_eq!(c16.stats().loaded_blocks, 0);
    assert!(c16.flush(Duration::from_secs(30)));
    assert_eq!(c16.stats().saved_blocks, 4, "its own f16 blocks");

    // And the other way: the f32 engine finds only its own blocks (namespace
    // "" holds both dtypes' blocks of this prefix now).
    let other = tokens(43, 256);
    generate(&e16.handle, &other, 1, b"").await;
    assert!(c16.flush(Duration::from_secs(30)));
    let on32 = generate(&e32.handle, &other, 1, b"").await;
    assert_eq!(on32.usage.cached_tokens, 0, "f32 engine reused f16 blocks");
    let both = [kv_layout(KvDtype::F32), kv_layout(KvDtype::F16)].map(|l| {
        let keys = kvfabric_store::KeyChain::new(b"", &model().fingerprint(), &l).keys(&prompt);
        a.node()
            .store()
            .block_infos(&keys)
            .iter()
            .chain(b.node().store().block_infos(&keys).iter())
            .filter(|i| i.is_some())
            .count()
    });
    assert_eq!(
        both,
        [4, 4],
        "each dtype's blocks are held under its own keys"
    );
    drop(e32);
    drop(e16);
    a.stop().await;
    b.stop().await;
}
