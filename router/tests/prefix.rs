//! `policy = "prefix"` in the live router, against scripted engines (axum:
//! completions name the engine, the keys route answers keys or fails) and
//! scripted nodes (a real tonic `KvEventService` whose events the test
//! sends): the router follows each node's events into its prefix index,
//! asks an engine for the request's keys, and routes to the engine whose
//! node holds the longest prefix; a RESYNC or a lost stream forgets what
//! that node held; a failed keys call or a dead node still serves
//! (least-loaded, counted). Disaggregated, each hop is routed by its own
//! engines' nodes with keys asked once. The same paths with real engines and nodes are
//! in the workspace's `tests/router_prefix.rs`.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use futures::Stream;
use kvfabric_proto::v1::kv_event_service_server::{KvEventService, KvEventServiceServer};
use kvfabric_proto::v1::{KvEvent, KvEventKind, KvEventsRequest};
use kvfabric_router::RouterConfig;
use kvfabric_testkit::router::{metric, plain, post_json, start_router};
use serde_json::{json, Value};
use tokio::sync::broadcast;

/// A scripted engine: completions answer its name; the keys route answers
/// one key per word of the prompt (word `n` -> `[n; 32]`) or fails.
#[derive(Clone)]
struct Engine {
    name: String,
    keys_fail: bool,
    served: Arc<AtomicU64>,
    keys_calls: Arc<AtomicU64>,
}

async fn complete(State(e): State<Engine>) -> Response {
    e.served.fetch_add(1, Ordering::SeqCst);
    axum::Json(json!({
        "id": "cmpl-s", "object": "text_completion", "model": "m",
        "choices": [{"index": 0, "text": e.name, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
    }))
    .into_response()
}

async fn keys(State(e): State<Engine>, body: Bytes) -> Response {
    e.keys_calls.fetch_add(1, Ordering::SeqCst);
    if e.keys_fail {
        let err = json!({"error": {"message": "no keys today", "type": "server_error"}});
        return (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(err)).into_response();
    }
    let v: Value = serde_json::from_slice(&body).expect("json body");
    let keys: Vec<String> = v["prompt"]
        .as_str()
        .expect("prompt")
        .split_whitespace()
        .map(|w| format!("{:02x}", w.parse::<u8>().expect("a number")).repeat(32))
        .collect();
    axum::Json(json!({"object": "kvfabric.block_keys", "block_tokens": 16, "block_keys": keys}))
        .into_response()
}

async fn start_engine(name: &str, keys_fail: bool) -> (String, Engine) {
    let e = Engine {
        name: name.into(),
        keys_fail,
        served: Arc::default(),
        keys_calls: Arc::default(),
    };
    let app = Router::new()
        .route("/v1/completions", post(complete))
        .route("/v1/kvfabric/keys/completions", post(keys))
        .with_state(e.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, e)
}

/// A scripted node: every subscriber gets the events sent on `tx`; `None`
/// ends the subscribers' streams (as a node restart does).
struct Node {
    addr: SocketAddr,
    tx: broadcast::Sender<Option<KvEvent>>,
}

struct Events(broadcast::Sender<Option<KvEvent>>);

type EventStream = Pin<Box<dyn Stream<Item = Result<KvEvent, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl KvEventService for Events {
    type KvEventsStream = EventStream;

    async fn kv_events(
        &self,
        _req: tonic::Request<KvEventsRequest>,
    ) -> Result<tonic::Response<EventStream>, tonic::Status> {
        let rx = self.0.subscribe();
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            let e = rx.recv().await.ok()??;
            Some((Ok(e), rx))
        });
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

async fn start_node() -> Node {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, _) = broadcast::channel(1024);
    let svc = KvEventServiceServer::new(Events(tx.clone()));
    let incoming = futures::stream::unfold(listener, |l| async move {
        let conn = l.accept().await.map(|(s, _)| s);
        Some((conn, l))
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(incoming),
    );
    Node { addr, tx }
}

impl Node {
    /// End every subscriber's stream.
    fn drop_streams(&self) {
        let _ = self.tx.send(None);
    }

    fn send(&self, kind: KvEventKind, key: u8) {
        let _ = self.tx.send(Some(KvEvent {
            kind: kind as i32,
            key: if kind == KvEventKind::Resync {
                Vec::new()
            } else {
                vec![key; 32]
            },
            ..KvEvent::default()
        }));
    }

    fn subscribers(&self) -> usize {
        self.tx.receiver_count()
    }
}

fn prefix_config(urls: &[String], nodes: &[Option<String>]) -> RouterConfig {
    let mut cfg = plain(urls);
    cfg.policy = "prefix".into();
    cfg.engine_nodes = urls
        .iter()
        .zip(nodes)
        .filter_map(|(u, n)| Some((u.clone(), n.clone()?)))
        .collect();
    cfg
}

async fn eventually(what: &str, mut ok: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !ok().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `node`, the first to announce anything, stores keys 1..=n; returns
/// once the router has applied the events.
async fn stored_first(router: SocketAddr, node: &Node, n: u8) {
    for k in 1..=n {
        node.send(KvEventKind::Stored, k);
    }
    eventually("indexed", async || {
        metric(router, "kvfabric_router_kv_events_total").await >= f64::from(n)
    })
    .await;
}

/// The engine that answered (its name is the text).
async fn route(addr: SocketAddr, prompt: &str) -> String {
    let body = json!({"model": "m", "prompt": prompt, "max_tokens": 1});
    let (status, v) = post_json(addr, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    v["choices"][0]["text"].as_str().expect("text").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_to_the_engine_whose_node_holds_their_prefix() {
    let mut urls = Vec::new();
    let mut engines = Vec::new();
    let mut nodes = Vec::new();
    for name in ["e0", "e1", "e2"] {
        let (url, e) = start_engine(name, false).await;
        urls.push(url);
        engines.push(e);
        nodes.push(start_node().await);
    }
    let addrs: Vec<Option<String>> = nodes.iter().map(|n| Some(n.addr.to_string())).collect();
    let router = start_router(prefix_config(&urls, &addrs)).await;
    eventually("every node has its subscriber", async || {
        nodes.iter().all(|n| n.subscribers() == 1)
    })
    .await;
    // Node 1 holds blocks 1..=8 of the prompt's 10; node 2 the first two.
    for k in 1..=8 {
        nodes[1].send(KvEventKind::Stored, k);
    }
    nodes[2].send(KvEventKind::Stored, 1);
    nodes[2].send(KvEventKind::Stored, 2);
    nodes[0].send(KvEventKind::Tier, 1);
    eventually("the router indexed the events", async || {
        metric(router.addr, "kvfabric_router_kv_events_total").await >= 10.0
    })
    .await;
    let prompt = "1 2 3 4 5 6 7 8 9 10";
    // Sequential requests (no load anywhere): least-loaded would rotate.
    for _ in 0..3 {
        assert_eq!(route(router.addr, prompt).await, "e1");
    }
    assert_eq!(engines[1].served.load(Ordering::SeqCst), 3);
    let keys_calls: u64 = engines
        .iter()
        .map(|e| e.keys_calls.load(Ordering::SeqCst))
        .sum();
    assert_eq!(keys_calls, 3, "one keys call per request");
    assert_eq!(
        metric(router.addr, "kvfabric_router_prefix_picks_total").await,
        3.0
    );
    assert_eq!(
        metric(router.addr, "kvfabric_router_prefix_prompt_blocks_total").await,
        30.0
    );
    assert_eq!(
        metric(router.addr, "kvfabric_router_prefix_matched_blocks_total").await,
        24.0
    );
    assert_eq!(
        metric(router.addr, "kvfabric_router_prefix_fallbacks_total").await,
        0.0
    );

    // Node 1 removes block 3: it holds 2 leading blocks, as node 2 does.
    nodes[1].send(KvEventKind::Removed, 3);
    eventually("the removal is indexed", async || {
        metric(router.addr, "kvfabric_router_kv_events_total").await >= 11.0
    })
    .await;
    let picked = route(router.addr, prompt).await;
    assert_ne!(picked, "e0", "e0 holds nothing");
    assert_eq!(
        metric(router.addr, "kvfabric_router_prefix_matched_blocks_total").await,
        26.0
    );

    // A RESYNC from node 2 and node 1's stream lost: both forgotten.
    let resyncs = metric(router.addr, "kvfabric_router_kv_event_resyncs_total").await;
    nodes[2].send(KvEventKind::Resync, 0);
    nodes[1].drop_streams();
    eventually("both engines forgotten", async || {
        metric(router.addr, "kvfabric_router_kv_event_resyncs_total").await >= resyncs + 2.0
    })
    .await;
    eventually("node 1 is followed again", async || {
        metric(router.addr, "kvfabric_router_kv_event_streams").await == 3.0
    })
    .await;
    let before = metric(router.addr, "kvfabric_router_prefix_matched_blocks_total").await;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..3 {
        seen.insert(route(router.addr, prompt).await);
    }
    assert_eq!(
        seen.len(),
        3,
        "nothing known cached: picks rotate, {seen:?}"
    );
    assert_eq!(
        metric(router.addr, "kvfabric_router_prefix_matched_blocks_total").await,
        before
    );
    router.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_keys_calls_and_dead_nodes_still_serve_least_loaded() {
    let (a, ea) = start_engine("a", true).await;
    let (b, eb) = start_engine("b", true).await;
    // Node addresses nobody listens on.
    let dead = |_| {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        Some(l.local_addr().expect("addr").to_string())
    };
    let nodes: Vec<Option<String>> = (0..2).map(dead).collect();
    let router = start_router(prefix_config(&[a, b], &nodes)).await;
    for _ in 0..4 {
        route(router.addr, "1 2 3").await;
    }
    assert_eq!(ea.served.load(Ordering::SeqCst), 2, "ties rotate");
    assert_eq!(eb.served.load(Ordering::SeqCst), 2);
    assert_eq!(
        metric(router.addr, "kvfabric_router_prefix_fallbacks_total").await,
        4.0
    );
    assert_eq!(
        metric(router.addr, "kvfabric_router_prefix_picks_total").await,
        0.0
    );
    eventually("the dead nodes are retried", async || {
        metric(router.addr, "kvfabric_router_kv_event_resyncs_total").await >= 4.0
    })
    .await;
    assert_eq!(
        metric(router.addr, "kvfabric_router_kv_event_streams").await,
        0.0
    );
    router.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefill_hop_goes_to_the_prefill_engine_holding_the_prefix() {
    let (p0, e0) = start_engine("p0", false).await;
    let (p1, e1) = start_engine("p1", false).await;
    let (d0, dec) = start_engine("d0", false).await;
    let (n0, n1) = (start_node().await, start_node().await);
    let mut cfg = kvfabric_testkit::router::disaggregated(&[p0.clone(), p1.clone()], &[d0]);
    cfg.policy = "prefix".into();
    cfg.engine_nodes = [(p0, n0.addr.to_string()), (p1, n1.addr.to_string())].into();
    let router = start_router(cfg).await;
    eventually("both nodes followed", async || {
        n0.subscribers() == 1 && n1.subscribers() == 1
    })
    .await;
    stored_first(router.addr, &n1, 4).await;
    for _ in 0..3 {
        assert_eq!(route(router.addr, "1 2 3 4 5").await, "d0");
    }
    assert_eq!(e1.served.load(Ordering::SeqCst), 3, "every prefill on p1");
    assert_eq!(e0.served.load(Ordering::SeqCst), 0);
    assert_eq!(dec.served.load(Ordering::SeqCst), 3);
    assert_eq!(
        dec.keys_calls.load(Ordering::SeqCst),
        0,
        "decode is not asked"
    );
    assert_eq!(
        metric(router.addr, "kvfabric_router_prefix_matched_blocks_total").await,
        12.0
    );
    router.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decode_hop_goes_to_the_decode_engine_holding_the_prefix() {
    let (p0, pre) = start_engine("p0", false).await;
    let (d0, e0) = start_engine("d0", false).await;
    let (d1, e1) = start_engine("d1", false).await;
    let (np, n0, n1) = (start_node().await, start_node().await, start_node().await);
    let mut cfg = kvfabric_testkit::router::disaggregated(
        std::slice::from_ref(&p0),
        &[d0.clone(), d1.clone()],
    );
    cfg.policy = "prefix".into();
    cfg.engine_nodes = [
        (p0, np.addr.to_string()),
        (d0, n0.addr.to_string()),
        (d1, n1.addr.to_string()),
    ]
    .into();
    let router = start_router(cfg).await;
    eventually("every node followed", async || {
        np.subscribers() == 1 && n0.subscribers() == 1 && n1.subscribers() == 1
    })
    .await;
    // d1's node holds what d1 decoded of an earlier turn.
    stored_first(router.addr, &n1, 4).await;
    for _ in 0..3 {
        assert_eq!(route(router.addr, "1 2 3 4 5").await, "d1");
    }
    assert_eq!(e1.served.load(Ordering::SeqCst), 3, "every decode on d1");
    assert_eq!(e0.served.load(Ordering::SeqCst), 0);
    assert_eq!(pre.served.load(Ordering::SeqCst), 3);
    // One keys call per request, to the prefill side, for both hops.
    assert_eq!(pre.keys_calls.load(Ordering::SeqCst), 3);
    let decode_keys = e0.keys_calls.load(Ordering::SeqCst) + e1.keys_calls.load(Ordering::SeqCst);
    assert_eq!(decode_keys, 0, "decode engines are not asked");
    let m = |name: &'static str| metric(router.addr, name);
    assert_eq!(m("kvfabric_router_decode_prefix_picks_total").await, 3.0);
    assert_eq!(
        m("kvfabric_router_decode_prefix_prompt_blocks_total").await,
        15.0
    );
    assert_eq!(
        m("kvfabric_router_decode_prefix_matched_blocks_total").await,
        12.0
    );
    // The prefill hop is counted on its own: its node held nothing.
    assert_eq!(m("kvfabric_router_prefix_picks_total").await, 3.0);
    assert_eq!(m("kvfabric_router_prefix_matched_blocks_total").await, 0.0);
    // Once d1's node forgets (a RESYNC), decode is least-loaded again.
    let resyncs = m("kvfabric_router_kv_event_resyncs_total").await;
    n1.send(KvEventKind::Resync, 0);
    eventually("forgotten", async || {
        metric(router.addr, "kvfabric_router_kv_event_resyncs_total").await >= resyncs + 1.0
    })
    .await;
    for _ in 0..4 {
        route(router.addr, "1 2 3 4 5").await;
    }
    assert!(
        e0.served.load(Ordering::SeqCst) >= 1,
        "ties rotate over the decode engines"
    );
    assert_eq!(
        m("kvfabric_router_decode_prefix_matched_blocks_total").await,
        12.0
    );
    router.shut_down().await;
}
