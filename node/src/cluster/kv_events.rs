//! `KvEventService.KvEvents`: a node's block stored / removed / tier events
//! as a gRPC server stream, for routers that keep a prefix index.
//!
//! The events are the store's own change reports (the [`ChangeFeed`] the
//! directory announcer drains), published numbered to a bounded broadcast
//! ring: nothing polls what the node holds. Each subscriber reads the ring
//! at its own pace; one that falls more than [`crate::KV_EVENT_BUFFER`]
//! events behind gets a `RESYNC` event saying how many it missed, then the
//! events that follow — never a silent gap.
//!
//! A tenant that is not `trusted` is streamed only the events of its own
//! blocks (those that count to its owner in the tiers' shares: its name, or
//! its shared namespace): block keys are public functions of namespace and
//! tokens, so another tenant's keys would let it confirm guesses of their
//! prompts. Trusted callers (operators, routers, engines in remote mode)
//! and single-tenant mode see every event.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use kvfabric_proto::v1::kv_event_service_server::KvEventService;
use kvfabric_proto::v1::{KvEvent, KvEventKind, KvEventsRequest, Tier};
use kvfabric_tenants::Identity;
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

/// Whose events a caller may see: `None` every block's, `Some(owner)` only
/// the blocks that count to `owner` (an untrusted tenant).
fn visible_owner<T>(req: &Request<T>) -> Option<std::sync::Arc<str>> {
    let who = req.extensions().get::<Identity>()?;
    let tenant = who.tenant().filter(|t| !t.trusted)?;
    Some(tenant.owner.clone())
}

/// The next event `rx` has for a caller that sees `only`'s blocks (`None`:
/// all); lag is reported whoever asks. `None` once the feed is gone.
async fn next_visible(
    rx: &mut tokio::sync::broadcast::Receiver<KvEventRecord>,
    only: Option<&str>,
) -> Option<Result<KvEventRecord, u64>> {
    loop {
        match rx.recv().await {
            Ok(r) if only.is_none_or(|o| r.owner.as_deref() == Some(o)) => return Some(Ok(r)),
            Ok(_) => continue,
            Err(RecvError::Lagged(dropped)) => return Some(Err(dropped)),
            Err(RecvError::Closed) => return None,
        }
    }
}

#[tonic::async_trait]
impl KvEventService for KvEventRpc {
    type KvEventsStream = EventStream;

    async fn kv_events(
        &self,
        req: Request<KvEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let only = visible_owner(&req);
        let rx = self.feed.subscribe();
        let node_id = self.node_id.clone();
        tracing::debug!(node = %node_id, only = ?only, "KV event subscriber joined");
        let stream = futures::stream::unfold(
            (rx, node_id, 0u64, only),
            |(mut rx, node, last, only)| async move {
                let event = match next_visible(&mut rx, only.as_deref()).await? {
                    Ok(r) => kv_event_pb(&node, &r),
                    Err(dropped) => {
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
                };
                let last = event.sequence.max(last);
                Some((Ok(event), (rx, node, last, only)))
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }
}
