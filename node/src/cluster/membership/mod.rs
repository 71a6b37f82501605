//! Membership: which nodes are alive, as one shared, versioned view.
//!
//! Three sources, one output (a `watch` channel of [`MembershipView`]):
//! - **single**: just this node (the embedded default; zero setup);
//! - **static**: a configured peer list, each peer probed (TCP connect to its
//!   gRPC address) every `probe_interval`; a peer silent for `failure_timeout`
//!   leaves the view, and rejoins when it answers again;
//! - **etcd**: each node puts `<prefix>/nodes/<id>` under a lease (TTL default
//!   5 s) kept alive at TTL/3, and watches the prefix. A dead node's lease
//!   expires and its key vanishes. If etcd itself goes away, the last view is
//!   kept (nodes go on serving what they know) and the node re-registers with a
//!   fresh lease when etcd returns.
//!
//! No consensus of our own: etcd is the only source of truth when configured.
//! With etcd, [`Membership::etcd_connected`] is a gauge that reads 1 while a
//! session (lease and watch) is live and 0 while etcd is unreachable; the node
//! exports it as `kvfabric_cluster_etcd_connected`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

mod etcd;
mod view;

use crate::{BadNodeArgument, NodeError};
use view::publish;
pub use view::{MembershipView, NodeInfo};

/// Where membership comes from.
#[derive(Clone, Debug)]
pub enum MembershipSource {
    /// Only this node.
    Single,
    /// A fixed peer list with liveness probes.
    Static {
        peers: Vec<NodeInfo>,
        probe_interval: Duration,
        failure_timeout: Duration,
    },
    /// etcd leases and a watch.
    Etcd {
        endpoints: Vec<String>,
        prefix: String,
        ttl: Duration,
    },
}

/// A running membership source.
pub struct Membership {
    view: watch::Receiver<Arc<MembershipView>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    /// 1 while an etcd session is live (etcd source only).
    etcd_connected: Option<Gauge>,
}

impl Membership {
    /// Start publishing the view for node `me`.
    pub async fn start(me: NodeInfo, source: MembershipSource) -> Result<Self, NodeError> {
        let mut initial = MembershipView::default();
        initial.nodes.insert(me.node_id.clone(), me.clone());
        let (tx, rx) = watch::channel(Arc::new(initial));
        let (stop_tx, stop_rx) = oneshot::channel();
        let mut etcd_connected = None;
        let task = match source {
            MembershipSource::Single => None,
            MembershipSource::Static {
                peers,
                probe_interval,
                failure_timeout,
            } => Some(tokio::spawn(run_static(
                me,
                peers,
                probe_interval,
                failure_timeout,
                tx,
                stop_rx,
            ))),
            MembershipSource::Etcd {
                endpoints,
                prefix,
                ttl,
            } => {
                if endpoints.is_empty() {
                    return Err(NodeError::InvalidArgument(BadNodeArgument::NoEtcdEndpoint));
                }
                let connected = Gauge::default();
                etcd_connected = Some(connected.clone());
                Some(tokio::spawn(etcd::run_etcd(
                    me, endpoints, prefix, ttl, tx, stop_rx, connected,
                )))
            }
        };
        Ok(Membership {
            view: rx,
            stop: Some(stop_tx),
            task,
            etcd_connected,
        })
    }

    /// With etcd: a gauge that reads 1 while a session is live, 0 while
    /// etcd is unreachable. None for the other sources.
    pub fn etcd_connected(&self) -> Option<Gauge> {
        self.etcd_connected.clone()
    }

    /// The current view.
    pub fn view(&self) -> Arc<MembershipView> {
        self.view.borrow().clone()
    }

    /// A receiver that sees every new view.
    pub fn subscribe(&self) -> watch::Receiver<Arc<MembershipView>> {
        self.view.clone()
    }

    /// Leave cleanly: with etcd, the lease is revoked so peers see us go at once.
    pub async fn leave(mut self) {
        self.shutdown().await;
    }

    async fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(3), task).await;
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn run_static(
    me: NodeInfo,
    peers: Vec<NodeInfo>,
    probe_interval: Duration,
    failure_timeout: Duration,
    tx: watch::Sender<Arc<MembershipView>>,
    mut stop: oneshot::Receiver<()>,
) {
    let peers: Vec<NodeInfo> = peers
        .into_iter()
        .filter(|p| p.node_id != me.node_id)
        .collect();
    let mut last_seen: Vec<Option<Instant>> = vec![None; peers.len()];
    let mut tick = tokio::time::interval(probe_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {}
        }
        let probes = peers
            .iter()
            .map(|p| probe(&p.grpc_addr, probe_interval.min(Duration::from_secs(1))));
        let results = futures::future::join_all(probes).await;
        let now = Instant::now();
        let mut view = MembershipView::default();
        view.nodes.insert(me.node_id.clone(), me.clone());
        for ((peer, ok), seen) in peers.iter().zip(results).zip(last_seen.iter_mut()) {
            if ok {
                *seen = Some(now);
            }
            if seen.is_some_and(|t| now.duration_since(t) < failure_timeout) {
                view.nodes.insert(peer.node_id.clone(), peer.clone());
            }
        }
        publish(&tx, view);
    }
}

async fn probe(addr: &str, timeout: Duration) -> bool {
    matches!(
        tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvfabric_store::keys::BlockKey;
    use kvfabric_testkit::EtcdProcess;

    fn node(id: &str, port: u16) -> NodeInfo {
        NodeInfo {
            node_id: id.into(),
            grpc_addr: format!("127.0.0.1:{port}"),
            transfer_addr: format!("127.0.0.1:{}", port + 1),
        }
    }

    async fn wait_for(
        m: &Membership,
        what: &str,
        f: impl Fn(&MembershipView) -> bool,
        within: Duration,
    ) -> Duration {
        let start = Instant::now();
        let mut rx = m.subscribe();
        loop {
            if f(&rx.borrow()) {
                return start.elapsed();
            }
            match tokio::time::timeout(within.saturating_sub(start.elapsed()), rx.changed()).await {
                Ok(Ok(())) => {}
                _ => panic!(
                    "timed out after {within:?} waiting for {what}; view {:?}",
                    rx.borrow().nodes.keys()
                ),
            }
        }
    }

    fn etcd(endpoint: String) -> MembershipSource {
        MembershipSource::Etcd {
            endpoints: vec![endpoint],
            prefix: "/kvfabric-test".into(),
            ttl: Duration::from_secs(2),
        }
    }

    #[tokio::test]
    async fn etcd_join_crash_and_clean_leave() {
        let etcd_proc = EtcdProcess::start().unwrap();
        let a = Membership::start(node("a", 1000), etcd(etcd_proc.endpoint()))
            .await
            .unwrap();
        let b = Membership::start(node("b", 2000), etcd(etcd_proc.endpoint()))
            .await
            .unwrap();
        let c = Membership::start(node("c", 3000), etcd(etcd_proc.endpoint()))
            .await
            .unwrap();
        wait_for(
            &a,
            "a sees b and c",
            |v| v.contains("b") && v.contains("c"),
            Duration::from_secs(5),
        )
        .await;

        // Crash: b's task dies without revoking its lease; a sees it go within TTL + 1 s.
        let mut b = b;
        if let Some(t) = b.task.take() {
            t.abort();
        }
        b.stop.take();
        let took = wait_for(
            &a,
            "b expires",
            |v| !v.contains("b"),
            Duration::from_secs(6),
        )
        .await;
        assert!(
            took <= Duration::from_secs(3) + Duration::from_millis(500),
            "took {took:?}"
        );

        // Clean leave: c revokes its lease; a sees it at once.
        c.leave().await;
        let took = wait_for(&a, "c leaves", |v| !v.contains("c"), Duration::from_secs(2)).await;
        assert!(took < Duration::from_secs(1), "took {took:?}");
        assert_eq!(a.view().nodes.len(), 1);
    }

    #[tokio::test]
    async fn etcd_outage_keeps_view_then_rejoins() {
        let mut etcd_proc = EtcdProcess::start().unwrap();
        let a = Membership::start(node("a", 1000), etcd(etcd_proc.endpoint()))
            .await
            .unwrap();
        let b = Membership::start(node("b", 2000), etcd(etcd_proc.endpoint()))
            .await
            .unwrap();
        wait_for(&a, "a sees b", |v| v.contains("b"), Duration::from_secs(5)).await;
        let connected = a.etcd_connected().expect("an etcd source has the gauge");
        assert_eq!(connected.get(), 1, "session live");
        etcd_proc.stop();
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(
            a.view().contains("b"),
            "the last view is kept while etcd is down"
        );
        assert_eq!(connected.get(), 0, "etcd unreachable reads 0");
        etcd_proc.restart().unwrap();
        // After etcd returns, the old leases are gone; both re-register.
        tokio::time::sleep(Duration::from_secs(4)).await;
        wait_for(
            &a,
            "a sees b again",
            |v| v.contains("b"),
            Duration::from_secs(8),
        )
        .await;
        wait_for(
            &b,
            "b sees a again",
            |v| v.contains("a"),
            Duration::from_secs(8),
        )
        .await;
        let back = Instant::now();
        while connected.get() != 1 {
            assert!(
                back.elapsed() < Duration::from_secs(10),
                "the gauge never read 1 again"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn static_peers_probe_liveness() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let peer = NodeInfo {
            node_id: "p".into(),
            grpc_addr: format!("127.0.0.1:{port}"),
            transfer_addr: String::new(),
        };
        let src = MembershipSource::Static {
            peers: vec![peer, node("me", 1)],
            probe_interval: Duration::from_millis(200),
            failure_timeout: Duration::from_secs(1),
        };
        let m = Membership::start(node("me", 1), src).await.unwrap();
        assert!(m.etcd_connected().is_none(), "no etcd, no etcd gauge");
        wait_for(&m, "peer up", |v| v.contains("p"), Duration::from_secs(3)).await;
        drop(listener);
        wait_for(
            &m,
            "peer down",
            |v| !v.contains("p"),
            Duration::from_secs(3),
        )
        .await;
        assert!(m.view().contains("me"));
    }

    #[tokio::test]
    async fn single_and_bad_config() {
        let m = Membership::start(node("solo", 1), MembershipSource::Single)
            .await
            .unwrap();
        let key = BlockKey([3; 32]);
        assert_eq!(
            m.view().owner(&key).map(|n| n.node_id.as_str()),
            Some("solo")
        );
        let bad = MembershipSource::Etcd {
            endpoints: vec![],
            prefix: "/x".into(),
            ttl: Duration::from_secs(5),
        };
        assert!(Membership::start(node("x", 1), bad).await.is_err());
    }
}
