//! etcd membership: register this node under a lease, list and watch the
//! registered nodes, publish each view; a lost session is retried with
//! backoff until the membership stops.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, GetOptions, PutOptions, WatchOptions};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{oneshot, watch};

use super::view::{publish, MembershipView, NodeInfo};

/// Keep `me` registered in etcd and publish every membership change on
/// `tx`; each lost session is retried with backoff, until `stop`.
pub(super) async fn run_etcd(
    me: NodeInfo,
    endpoints: Vec<String>,
    prefix: String,
    ttl: Duration,
    tx: watch::Sender<Arc<MembershipView>>,
    mut stop: oneshot::Receiver<()>,
    connected: Gauge,
) {
    let nodes_prefix = format!("{}/nodes/", prefix.trim_end_matches('/'));
    let mut backoff = Duration::from_millis(200);
    loop {
        let session = etcd_session(
            &me,
            &endpoints,
            &nodes_prefix,
            ttl,
            (&tx, &connected),
            &mut stop,
        );
        let end = session.await;
        connected.set(0);
        match end {
            Ok(SessionEnd::Stopped) => return,
            Ok(SessionEnd::Lost(why)) | Err(why) => {
                tracing::warn!(%why, "etcd session lost; keeping the last membership view and retrying");
            }
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

enum SessionEnd {
    Stopped,
    Lost(String),
}

/// One registration + watch session against etcd; ends when etcd fails or we stop.
async fn etcd_session(
    me: &NodeInfo,
    endpoints: &[String],
    nodes_prefix: &str,
    ttl: Duration,
    (tx, connected): (&watch::Sender<Arc<MembershipView>>, &Gauge),
    stop: &mut oneshot::Receiver<()>,
) -> Result<SessionEnd, String> {
    let e = |what: &str, err: etcd_client::Error| format!("{what}: {err}");
    let opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(2));
    let mut client = Client::connect(endpoints, Some(opts))
        .await
        .map_err(|x| e("connect", x))?;
    let (lease, revision, mut nodes) =
        register_and_list(&mut client, me, nodes_prefix, ttl).await?;
    // Registered and listed: the session is live (set before the view it
    // gives is published, so whoever sees that view sees the gauge at 1).
    connected.set(1);
    publish(
        tx,
        MembershipView {
            nodes: nodes.clone(),
        },
    );

    let mut watch_stream = client
        .watch(
            nodes_prefix,
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(revision + 1),
            ),
        )
        .await
        .map_err(|x| e("watch", x))?;
    let (mut keeper, mut keep_stream) = client
        .lease_keep_alive(lease)
        .await
        .map_err(|x| e("keepalive", x))?;
    let mut tick = tokio::time::interval(ttl / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_ack = Instant::now();
    loop {
        tokio::select! {
            _ = &mut *stop => {
                let _ = tokio::time::timeout(Duration::from_secs(1), client.lease_revoke(lease)).await;
                return Ok(SessionEnd::Stopped);
            }
            _ = tick.tick() => {
                if last_ack.elapsed() > ttl {
                    return Ok(SessionEnd::Lost("lease keep-alive unanswered for a whole TTL".into()));
                }
                if let Err(x) = keeper.keep_alive().await {
                    return Ok(SessionEnd::Lost(e("keepalive send", x)));
                }
            }
            ack = keep_stream.message() => match ack {
                Ok(Some(resp)) if resp.ttl() > 0 => last_ack = Instant::now(),
                Ok(Some(_)) => return Ok(SessionEnd::Lost("lease expired".into())),
                Ok(None) => return Ok(SessionEnd::Lost("keep-alive stream closed".into())),
                Err(x) => return Ok(SessionEnd::Lost(e("keepalive", x))),
            },
            msg = watch_stream.message() => match msg {
                Ok(Some(resp)) => {
                    if let Some(end) = apply_events(&resp, nodes_prefix, me, &mut nodes) {
                        return Ok(end);
                    }
                    publish(tx, MembershipView { nodes: nodes.clone() });
                }
                Ok(None) => return Ok(SessionEnd::Lost("watch stream closed".into())),
                Err(x) => return Ok(SessionEnd::Lost(e("watch", x))),
            },
        }
    }
}

/// Register `me` under a lease of `ttl`, then list the registered nodes
/// (`me` included): (lease id, the listing's revision, the nodes).
async fn register_and_list(
    client: &mut Client,
    me: &NodeInfo,
    nodes_prefix: &str,
    ttl: Duration,
) -> Result<(i64, i64, BTreeMap<String, NodeInfo>), String> {
    let e = |what: &str, err: etcd_client::Error| format!("{what}: {err}");
    let ttl_s = ttl.as_secs().max(1) as i64;
    let lease = client
        .lease_grant(ttl_s, None)
        .await
        .map_err(|x| e("lease grant", x))?
        .id();
    let me_key = format!("{nodes_prefix}{}", me.node_id);
    let me_json = serde_json::to_string(me).map_err(|x| x.to_string())?;
    client
        .put(
            me_key.clone(),
            me_json,
            Some(PutOptions::new().with_lease(lease)),
        )
        .await
        .map_err(|x| e("register", x))?;
    let listing = client
        .get(nodes_prefix, Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|x| e("list", x))?;
    let revision = listing.header().map_or(0, |h| h.revision());
    let mut nodes = BTreeMap::new();
    for kv in listing.kvs() {
        if let Some(info) = parse_node(kv.value()) {
            nodes.insert(info.node_id.clone(), info);
        }
    }
    nodes.insert(me.node_id.clone(), me.clone());
    Ok((lease, revision, nodes))
}

/// Apply one watch answer's puts and deletes to `nodes`; the session's end
/// when it deleted our own registration.
fn apply_events(
    resp: &etcd_client::WatchResponse,
    nodes_prefix: &str,
    me: &NodeInfo,
    nodes: &mut BTreeMap<String, NodeInfo>,
) -> Option<SessionEnd> {
    for ev in resp.events() {
        let Some(kv) = ev.kv() else { continue };
        let Ok(key) = kv.key_str() else { continue };
        let id = key.trim_start_matches(nodes_prefix).to_string();
        match ev.event_type() {
            EventType::Put => {
                if let Some(info) = parse_node(kv.value()) {
                    nodes.insert(info.node_id.clone(), info);
                }
            }
            EventType::Delete => {
                if id == me.node_id {
                    return Some(SessionEnd::Lost("our registration vanished".into()));
                }
                nodes.remove(&id);
            }
        }
    }
    None
}

fn parse_node(value: &[u8]) -> Option<NodeInfo> {
    match serde_json::from_slice(value) {
        Ok(n) => Some(n),
        Err(err) => {
            tracing::warn!(%err, "ignoring a malformed node record in etcd");
            None
        }
    }
}
