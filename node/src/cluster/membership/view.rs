//! The view every membership source publishes: the live nodes and how each
//! is reached, and the one way a source publishes a new view (only when it
//! changed). A leaf below the sources (`mod.rs`'s single and static ones,
//! `etcd.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::cluster::rendezvous;
use kvfabric_store::keys::BlockKey;

/// How a node is reached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Unique node id.
    pub node_id: String,
    /// gRPC address (host:port) of its CacheService and internal services.
    pub grpc_addr: String,
    /// Transfer-engine address (host:port).
    pub transfer_addr: String,
}

/// The live nodes, this one included, keyed by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MembershipView {
    pub nodes: BTreeMap<String, NodeInfo>,
}

impl MembershipView {
    /// The live node that owns `key` (rendezvous hashing).
    pub fn owner(&self, key: &BlockKey) -> Option<&NodeInfo> {
        let id = rendezvous::owner(self.nodes.keys().map(String::as_str), key)?;
        self.nodes.get(id)
    }

    /// True when `node_id` is in the view.
    pub fn contains(&self, node_id: &str) -> bool {
        self.nodes.contains_key(node_id)
    }
}

/// Send `view` to the subscribers when it differs from the current one.
pub(super) fn publish(tx: &watch::Sender<Arc<MembershipView>>, view: MembershipView) {
    tx.send_if_modified(|cur| {
        if **cur == view {
            false
        } else {
            tracing::info!(nodes = ?view.nodes.keys().collect::<Vec<_>>(), "membership changed");
            *cur = Arc::new(view);
            true
        }
    });
}
