//! The cluster as the console shows it: every member's summary, gathered
//! over the internal `ConsoleService.Summary` RPC (this node answers its own
//! from memory), and each member's state:
//!
//! - **alive**: in the membership view, and its summary came back;
//! - **suspect**: in the view, but its summary did not come back within the
//!   cluster's RPC timeout (overloaded, partitioned, or dying before its
//!   lease runs out);
//! - **gone**: seen by this node earlier, no longer in the view (left, or
//!   its lease expired: within the membership TTL of a crash).

use std::sync::Arc;

use kvfabric_proto::internal::v1::console_service_client::ConsoleServiceClient;
use kvfabric_proto::internal::v1::console_service_server::ConsoleService;
use kvfabric_proto::internal::v1::{SummaryRequest, SummaryResponse};
use tonic::{Request, Response, Status};

use super::Console;

/// A member's state in the console.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    Alive,
    Suspect,
    Gone,
}

impl NodeState {
    /// The word the API and the page use.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Alive => "alive",
            NodeState::Suspect => "suspect",
            NodeState::Gone => "gone",
        }
    }
}

/// One member as gathered.
#[derive(Clone, Debug)]
pub struct Member {
    pub node_id: String,
    pub grpc_addr: String,
    pub state: NodeState,
    /// Its summary; None unless alive.
    pub summary: Option<SummaryResponse>,
}

/// The `ConsoleService` a cluster node serves to its peers' consoles.
pub struct ConsoleRpc(pub Arc<Console>);

#[tonic::async_trait]
impl ConsoleService for ConsoleRpc {
    async fn summary(
        &self,
        req: Request<SummaryRequest>,
    ) -> Result<Response<SummaryResponse>, Status> {
        // Peers' consoles only: a summary names every tenant.
        let identity = self.0.node.as_ref().and_then(|n| n.identity());
        crate::cluster::security::authorize(identity, &req, "")?;
        let with_history = req.into_inner().with_history;
        let console = self.0.clone();
        let s = tokio::task::spawn_blocking(move || console.summary(with_history))
            .await
            .map_err(|e| Status::internal(format!("summary task: {e}")))?;
        Ok(Response::new(s))
    }
}

impl Console {
    /// Every member this node knows of, in id order, with its state and (when
    /// alive) its summary.
    pub async fn members(self: &Arc<Self>, with_history: bool) -> Vec<Member> {
        self.note_members();
        let me = self.summary_node_id();
        let (view, timeout) = match &self.node {
            Some(n) => (
                n.view().nodes.keys().cloned().collect::<Vec<_>>(),
                n.config().rpc_timeout(),
            ),
            None => (vec![me.clone()], std::time::Duration::from_secs(1)),
        };
        let seen = self.seen.lock().clone();
        let asks = seen.into_iter().map(|(id, addr)| {
            let in_view = view.contains(&id);
            let me = me.clone();
            async move {
                let summary = if !in_view {
                    None
                } else if id == me {
                    let c = self.clone();
                    tokio::task::spawn_blocking(move || c.summary(with_history))
                        .await
                        .ok()
                } else {
                    self.ask(&id, &addr, with_history, timeout).await
                };
                let state = match (in_view, &summary) {
                    (false, _) => NodeState::Gone,
                    (true, Some(_)) => NodeState::Alive,
                    (true, None) => NodeState::Suspect,
                };
                Member {
                    node_id: id,
                    grpc_addr: addr,
                    state,
                    summary,
                }
            }
        });
        futures::future::join_all(asks).await
    }

    pub(crate) fn summary_node_id(&self) -> String {
        match &self.node {
            Some(n) => n.info().node_id.clone(),
            None => self.store.config().node_id.clone(),
        }
    }

    async fn ask(
        &self,
        id: &str,
        addr: &str,
        with_history: bool,
        timeout: std::time::Duration,
    ) -> Option<SummaryResponse> {
        let node = self.node.as_ref()?;
        let ch = node.channel(id, addr).ok()?;
        let mut client = ConsoleServiceClient::new(ch)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        match tokio::time::timeout(timeout, client.summary(SummaryRequest { with_history })).await {
            Ok(Ok(r)) => Some(r.into_inner()),
            Ok(Err(s)) => {
                tracing::debug!(peer = %addr, status = %s, "console summary failed");
                None
            }
            Err(_) => {
                tracing::debug!(peer = %addr, "console summary timed out");
                None
            }
        }
    }
}
