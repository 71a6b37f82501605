//! The node's membership metrics: how many members it sees and, with etcd,
//! whether its etcd session is live. They feed the `KvfabricMemberLost`
//! and `KvfabricEtcdUnreachable` alerts (deploy/prometheus/alerts.yml).
//! Kept beside membership, not in it: membership publishes views and owns
//! the etcd gauge; this module only registers and follows them.

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::cluster::membership::Membership;

/// `kvfabric_cluster_members` (nodes in this node's membership view, kept
/// current by a task that follows the view) and, with etcd,
/// `kvfabric_cluster_etcd_connected` (1 while the etcd session is live).
pub(crate) fn register(registry: &mut Registry, membership: &Membership) {
    let members = Gauge::<i64>::default();
    registry.register(
        "kvfabric_cluster_members",
        "Nodes in this node's membership view, itself included",
        members.clone(),
    );
    let mut views = membership.subscribe();
    tokio::spawn(async move {
        loop {
            let n = views.borrow_and_update().nodes.len();
            members.set(n as i64);
            if views.changed().await.is_err() {
                return;
            }
        }
    });
    if let Some(connected) = membership.etcd_connected() {
        registry.register(
            "kvfabric_cluster_etcd_connected",
            "1 while this node's etcd session (lease and watch) is live, 0 while etcd is unreachable",
            connected,
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::cluster::membership::{MembershipSource, NodeInfo};

    fn members(registry: &Registry) -> Option<i64> {
        crate::exposition::encode_text(registry)
            .lines()
            .find_map(|l| l.strip_prefix("kvfabric_cluster_members ")?.parse().ok())
    }

    async fn until(registry: &Registry, want: i64) {
        let start = Instant::now();
        while members(registry) != Some(want) {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "members {:?}, want {want}",
                members(registry)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn members_follows_the_view_when_a_peer_is_lost() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let node = |id: &str, addr: String| NodeInfo {
            node_id: id.into(),
            grpc_addr: addr,
            transfer_addr: String::new(),
        };
        let me = node("me", "127.0.0.1:1".into());
        let src = MembershipSource::Static {
            peers: vec![
                node("p", listener.local_addr().unwrap().to_string()),
                me.clone(),
            ],
            probe_interval: Duration::from_millis(100),
            failure_timeout: Duration::from_millis(500),
        };
        let m = Membership::start(me, src).await.unwrap();
        let mut registry = Registry::default();
        register(&mut registry, &m);
        assert!(
            !crate::exposition::encode_text(&registry).contains("etcd_connected"),
            "no etcd gauge without etcd"
        );
        until(&registry, 2).await;
        drop(listener);
        until(&registry, 1).await;
    }
}
