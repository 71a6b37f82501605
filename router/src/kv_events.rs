//! Following the engines' nodes: one long-lived `KvEventService/KvEvents`
//! subscription per engine that has a node address (`engine_nodes`),
//! applied to the shared [`PrefixIndex`] under that engine's index.
//!
//! A node does not replay: a subscriber starts from "now". So whenever what
//! the index holds for an engine may be wrong — a `RESYNC` event (the
//! subscriber fell behind the node's ring), the stream ending or breaking,
//! a failed connect — the engine's blocks are forgotten
//! ([`PrefixIndex::clear_engine`]) and rebuilt from the events that follow
//! the next subscription. Reconnects back off from 100 ms to 5 s (reset once
//! a stream is up). Forgetting only makes an engine look colder than it is:
//! routing stays correct, the fabric serves any block from any node.
//!
//! In a secured cluster the subscription is a client of the node like
//! `kvfabric ctl`: the binary hands in the client TLS built from
//! `[cluster.security]` (`cluster::security::load_client`); a node with a
//! tenants file also wants `kv_events_api_key`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvfabric_proto::v1::kv_event_service_client::KvEventServiceClient;
use kvfabric_proto::v1::{KvEvent, KvEventKind, KvEventsRequest};
use tokio::task::JoinHandle;
use tonic::metadata::MetadataValue;
use tonic::transport::{ClientTlsConfig, Endpoint};

use crate::metrics::RouterMetrics;
use crate::pick::PrefixIndex;

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How to reach the nodes.
#[derive(Clone, Debug, Default)]
pub(crate) struct NodeClient {
    /// Client TLS of a secured cluster (None: plaintext).
    pub tls: Option<ClientTlsConfig>,
    /// `authorization: Bearer <key>` for nodes with a tenants file.
    pub api_key: Option<String>,
    /// Connect limit.
    pub connect_timeout: Duration,
}

/// Subscribe to `node` for `engine` until the task is aborted.
pub(crate) fn follow(
    engine: usize,
    node: String,
    client: NodeClient,
    index: Arc<Mutex<PrefixIndex>>,
    metrics: RouterMetrics,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut backoff = BACKOFF_MIN;
        loop {
            match subscribe(engine, &node, &client, &index, &metrics).await {
                Ok(true) => backoff = BACKOFF_MIN,
                Ok(false) => {}
                Err(e) => tracing::warn!(engine, %node, error = %e, "KV event stream failed"),
            }
            forget(&index, engine, &metrics);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    })
}

/// One subscription: Ok(true) when the stream was up and then ended.
async fn subscribe(
    engine: usize,
    node: &str,
    client: &NodeClient,
    index: &Mutex<PrefixIndex>,
    metrics: &RouterMetrics,
) -> Result<bool, String> {
    let scheme = if client.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{node}"))
        .map_err(|e| format!("bad node address: {e}"))?
        .connect_timeout(client.connect_timeout)
        .tcp_nodelay(true);
    if let Some(tls) = &client.tls {
        endpoint = endpoint
            .tls_config(tls.clone())
            .map_err(|e| format!("tls: {e}"))?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut request = tonic::Request::new(KvEventsRequest {});
    if let Some(key) = &client.api_key {
        let value = MetadataValue::try_from(format!("Bearer {key}"))
            .map_err(|e| format!("kv_events_api_key: {e}"))?;
        request.metadata_mut().insert("authorization", value);
    }
    let mut stream = KvEventServiceClient::new(channel)
        .kv_events(request)
        .await
        .map_err(|s| format!("subscribe: {}", s.message()))?
        .into_inner();
    tracing::info!(engine, %node, "following the node's KV events");
    metrics.kv_event_streams.inc();
    let _up = StreamUp(metrics.clone());
    loop {
        match stream.message().await {
            Ok(Some(event)) => apply(index, engine, &event, metrics),
            Ok(None) => return Ok(true),
            Err(s) => return Err(format!("stream broke: {}", s.message())),
        }
    }
}

/// Decrements `kv_event_streams` when a stream ends, whichever way.
struct StreamUp(RouterMetrics);

impl Drop for StreamUp {
    fn drop(&mut self) {
        self.0.kv_event_streams.dec();
    }
}

/// Apply one event to `engine`'s entries.
pub(crate) fn apply(
    index: &Mutex<PrefixIndex>,
    engine: usize,
    event: &KvEvent,
    metrics: &RouterMetrics,
) {
    let kind = KvEventKind::try_from(event.kind).unwrap_or(KvEventKind::Unspecified);
    let stored = match kind {
        KvEventKind::Stored => true,
        KvEventKind::Removed => false,
        KvEventKind::Resync => {
            tracing::warn!(
                engine,
                dropped = event.dropped,
                "KV event stream lagged; forgetting the engine's blocks"
            );
            forget(index, engine, metrics);
            return;
        }
        KvEventKind::Tier | KvEventKind::Unspecified => return,
    };
    let Ok(key) = <[u8; 32]>::try_from(event.key.as_slice()) else {
        return;
    };
    lock(index).apply(engine, key, stored);
    metrics.kv_events.inc();
}

fn forget(index: &Mutex<PrefixIndex>, engine: usize, metrics: &RouterMetrics) {
    lock(index).clear_engine(engine);
    metrics.kv_event_resyncs.inc();
}

/// The index (a poisoned lock only means a panic elsewhere; the map is usable).
pub(crate) fn lock(index: &Mutex<PrefixIndex>) -> std::sync::MutexGuard<'_, PrefixIndex> {
    index.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: KvEventKind, key: u8) -> KvEvent {
        KvEvent {
            kind: kind as i32,
            key: vec![key; 32],
            ..KvEvent::default()
        }
    }

    #[test]
    fn events_build_the_index_and_resync_forgets_the_engine() {
        let index = Mutex::new(PrefixIndex::new());
        let m = RouterMetrics::new();
        apply(&index, 0, &event(KvEventKind::Stored, 1), &m);
        apply(&index, 0, &event(KvEventKind::Stored, 2), &m);
        apply(&index, 1, &event(KvEventKind::Stored, 1), &m);
        apply(&index, 1, &event(KvEventKind::Tier, 2), &m);
        let keys = [[1u8; 32], [2u8; 32]];
        assert_eq!(lock(&index).cached_blocks(&keys, 2), vec![2, 1]);
        apply(&index, 0, &event(KvEventKind::Removed, 2), &m);
        assert_eq!(lock(&index).cached_blocks(&keys, 2), vec![1, 1]);
        let mut bad = event(KvEventKind::Stored, 3);
        bad.key.truncate(5);
        apply(&index, 0, &bad, &m);
        apply(&index, 0, &event(KvEventKind::Resync, 0), &m);
        assert_eq!(lock(&index).cached_blocks(&keys, 2), vec![0, 1]);
        assert_eq!(m.kv_events.get(), 4);
        assert_eq!(m.kv_event_resyncs.get(), 1);
    }
}
