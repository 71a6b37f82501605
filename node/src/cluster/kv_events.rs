//! `KvEventService.KvEvents`: a node's block stored / removed / tier events
//! as a gRPC server stream, for routers that keep a prefix index.
//!
//! The events are the store's own change reports (the [`ChangeFeed`] the
//! directory announcer drains), published numbered to a bounded broadcast
//! ring: nothing polls what the node holds. Each subscriber reads the ring
//! at its own pace; one that falls more than [`crate::KV_EVENT_BUFFER`]
//! events behind gets a `RESYNC` event saying how many it missed, then the
//! events that follow — never a silent gap.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use kvfabric_proto::v1::kv_event_service_server::KvEventService;
use kvfabric_proto::v1::{KvEvent, KvEventKind, KvEventsRequest, Tier};
use tokio::sync::broadcast::error::RecvError;
use tonic::{Request, Response, Status};

use kvfabric_store::{BlockChange, ChangeFeed, KvEventRecord};

/// The KV event stream of one node.
pub struct KvEventRpc {
    feed: Arc<ChangeFeed>,
    node_id: String,
}

impl KvEventRpc {
    /// Events of `feed` (the store's change feed), published as `node_id`.
    pub fn new(feed: Arc<ChangeFeed>, node_id: String) -> Self {
        KvEventRpc { feed, node_id }
    }
}

/// The wire form of one change.
pub fn kv_event_pb(node_id: &str, r: &KvEventRecord) -> KvEvent {
    let kind = match r.change {
        BlockChange::Stored => KvEventKind::Stored,
        BlockChange::Removed => KvEventKind::Removed,
        BlockChange::Tier => KvEventKind::Tier,
    };
    KvEvent {
        sequence: r.sequence,
        node_id: node_id.to_owned(),
        kind: kind as i32,
        key: r.key.as_bytes().to_vec(),
        tier: r.tier as i32,
        dropped: 0,
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<KvEvent, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl KvEventService for KvEventRpc {
    type KvEventsStream = EventStream;

    async fn kv_events(
        &self,
        _req: Request<KvEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let rx = self.feed.subscribe();
        let node_id = self.node_id.clone();
        tracing::debug!(node = %node_id, "KV event subscriber joined");
        let stream = futures::stream::unfold(
            (rx, node_id, 0u64),
            |(mut rx, node, last)| async move {
                let event = match rx.recv().await {
                    Ok(r) => kv_event_pb(&node, &r),
                    Err(RecvError::Lagged(dropped)) => {
                        tracing::warn!(node = %node, dropped, "KV event subscriber lagged; sent RESYNC");
                        KvEvent {
                            sequence: last,
                            node_id: node.clone(),
                            kind: KvEventKind::Resync as i32,
                            key: Vec::new(),
                            tier: Tier::Unspecified as i32,
                            dropped,
                        }
                    }
                    // The feed is gone: the node is shutting down.
                    Err(RecvError::Closed) => return None,
                };
                let last = event.sequence.max(last);
                Some((Ok(event), (rx, node, last)))
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }
}
