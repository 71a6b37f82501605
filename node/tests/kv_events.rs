//! A node's KV event stream (`KvEventService.KvEvents`): a subscriber sees
//! blocks stored, then removed (by a Remove and by eviction), in order and
//! numbered without gaps; a subscriber that falls behind the bounded buffer
//! is told how many events it missed (RESYNC), never left with a silent gap.

use std::time::Duration;

use futures::StreamExt;
use kvfabric_node::cluster::KvEventRpc;
use kvfabric_node::NodeServer;
use kvfabric_proto::v1::kv_event_service_client::KvEventServiceClient;
use kvfabric_proto::v1::kv_event_service_server::KvEventService;
use kvfabric_proto::v1::{KvEvent, KvEventKind, KvEventsRequest, Tier};
use kvfabric_store::{
    BlockKey, ChangeFeed, NodeConfig, PutOptions, Registry, Store, KV_EVENT_BUFFER,
};
use kvfabric_testkit::cluster::{data, key, layout};

const LIMIT: Duration = Duration::from_secs(30);

/// A RAM-only store with room for `blocks` blocks of `layout(8)`, evicting only when full.
fn open_store(blocks: usize, registry: &mut Registry) -> Store {
    let block = layout(8).block_bytes();
    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::b((blocks * block) as u64),
        high_watermark: 1.0,
        low_watermark: 1.0,
        ..Default::default()
    };
    Store::open(cfg, registry).expect("store")
}

fn put(store: &Store, k: BlockKey) {
    let l = layout(8);
    store
        .put(k, l, &data(&k, l.block_bytes()), PutOptions::default())
        .expect("put");
}

fn summary(e: &KvEvent) -> (KvEventKind, Vec<u8>) {
    (e.kind(), e.key.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_sees_stored_then_removed_in_order() {
    tokio::time::timeout(LIMIT, async {
        let mut registry = Registry::default();
        let store = open_store(4, &mut registry);
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let http = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = format!("http://{}", grpc.local_addr().expect("addr"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = store.clone();
        tokio::spawn(
            NodeServer::standalone(served, registry, grpc, http).serve(async {
                let _ = stopped.await;
            }),
        );
        let mut client = loop {
            match KvEventServiceClient::connect(addr.clone()).await {
                Ok(c) => break c,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let mut events = client
            .kv_events(KvEventsRequest {})
            .await
            .expect("subscribe")
            .into_inner();
        // 4 fit; the 5th evicts the oldest (k0); then k1 is removed.
        let k: Vec<BlockKey> = (0..5).map(|i| key(7, i)).collect();
        for x in &k {
            put(&store, *x);
        }
        assert_eq!(store.remove(&[k[1]]).expect("remove"), 1);
        let mut got = Vec::new();
        while got.len() < 7 {
            let e = events.next().await.expect("stream open").expect("event");
            got.push(e);
        }
        let kinds: Vec<(KvEventKind, Vec<u8>)> = got.iter().map(summary).collect();
        let stored = |i: usize| (KvEventKind::Stored, k[i].as_bytes().to_vec());
        let removed = |i: usize| (KvEventKind::Removed, k[i].as_bytes().to_vec());
        // The eviction of k0 makes room for k4, so it comes before k4's Stored.
        assert_eq!(
            kinds,
            vec![
                stored(0),
                stored(1),
                stored(2),
                stored(3),
                removed(0),
                stored(4),
                removed(1)
            ],
            "{got:#?}"
        );
        for (i, e) in got.iter().enumerate() {
            assert_eq!(e.sequence, got[0].sequence + i as u64, "no gaps");
            assert_eq!(e.node_id, addr.trim_start_matches("http://"));
            assert_eq!(e.dropped, 0);
            let tier = if e.kind() == KvEventKind::Stored {
                Tier::Ram
            } else {
                Tier::Unspecified
            };
            assert_eq!(e.tier(), tier);
        }
        let _ = stop.send(());
    })
    .await
    .expect("in time");
}

#[tokio::test]
async fn a_lagging_subscriber_is_told_how_many_events_it_missed() {
    let mut registry = Registry::default();
    let extra = 100;
    let store = open_store(KV_EVENT_BUFFER + extra, &mut registry);
    let feed = std::sync::Arc::new(ChangeFeed::events_only());
    store.watch_changes(feed.clone());
    let rpc = KvEventRpc::new(feed, "n0".into());
    let mut events = rpc
        .kv_events(tonic::Request::new(KvEventsRequest {}))
        .await
        .expect("subscribe")
        .into_inner();
    // The subscriber reads nothing while more than its buffer's worth happens.
    let total = KV_EVENT_BUFFER + extra;
    for i in 0..total {
        put(&store, key(9, i as u32));
    }
    let first = events.next().await.expect("open").expect("event");
    assert_eq!(first.kind(), KvEventKind::Resync, "{first:?}");
    assert_eq!(first.dropped, extra as u64);
    // Then the newest events, numbered on from where the gap ends.
    let next = events.next().await.expect("open").expect("event");
    assert_eq!(next.kind(), KvEventKind::Stored);
    assert_eq!(next.sequence, extra as u64 + 1);
    assert_eq!(next.key, key(9, extra as u32).as_bytes().to_vec());
}
