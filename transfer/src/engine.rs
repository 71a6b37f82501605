//! The transfer engine: owns the segment table, the tcp and shm servers, the
//! per-peer connection state, and turns a batch of ops into per-op results
//! over the transport chosen for the peer.
//!
//! Per peer the engine pools links of every transport (tcp connections, shm
//! sockets, rdma queue pairs; see `peer.rs`); each batch checks out its own,
//! so concurrent batches to one peer run in parallel.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::config::TransferConfig;
use crate::metrics::{DirectionLabel, TransferMetrics, TransportLabel};
use crate::op::{BatchReport, Notification, OpKind, TransferOp};
use crate::peer::PeerState;
use crate::protocol::{Hello, MAX_NOTIFY_BYTES};
use crate::segment::{check_range, SegmentId, SegmentMeta, SegmentTable, TransportKeys};
use crate::shm;
use crate::{tcp_client, tcp_server, SharedRegion, TransferError};

/// The transport that carries a peer's batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Shm,
    /// Only with the `rdma` feature, a device on both ends and a working
    /// queue-pair exchange.
    Rdma,
}

/// An op whose local range has been checked, holding its local region.
#[derive(Debug, Clone)]
pub(crate) struct PreparedOp {
    pub op: TransferOp,
    pub local: Arc<SharedRegion>,
}

/// State shared by the engine handle, its servers and its batches.
pub(crate) struct Inner {
    pub config: TransferConfig,
    pub segments: SegmentTable,
    pub metrics: TransferMetrics,
    pub hello: Hello,
    pub node: String,
    pub corrupt: AtomicU32,
    pub notify_tx: broadcast::Sender<Notification>,
    peers: Mutex<HashMap<String, Arc<PeerState>>>,
    #[cfg(feature = "rdma")]
    pub rdma: Option<crate::rdma_link::RdmaNic>,
}

impl Inner {
    /// Consume one armed payload corruption (test hook), if any.
    pub fn take_corruption(&self) -> bool {
        self.corrupt
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// A running transfer engine. Dropping it stops its servers.
pub struct TransferEngine {
    inner: Arc<Inner>,
    local_addr: SocketAddr,
    servers: Vec<JoinHandle<()>>,
}

impl TransferEngine {
    /// Bind the tcp listener and the shm socket, register metrics, and serve.
    pub async fn start(
        config: TransferConfig,
        registry: &mut Registry,
    ) -> Result<Self, TransferError> {
        if config.connections_per_peer == 0 || config.slice_bytes == 0 {
            return Err(TransferError::InvalidArgument(
                "connections_per_peer and slice_bytes must be positive".into(),
            ));
        }
        let listener = TcpListener::bind(&config.listen).await?;
        let local_addr = listener.local_addr()?;
        let pid = std::process::id();
        let socket = shm::socket_name(pid, local_addr.port());
        let shm_listener = shm::bind(&socket)?;
        #[cfg(feature = "rdma")]
        let nic = crate::rdma_link::RdmaNic::discover();
        let hello = Hello {
            pid,
            boot_id: boot_id(),
            shm_socket: socket,
            #[cfg(feature = "rdma")]
            rdma: nic.is_some(),
            #[cfg(not(feature = "rdma"))]
            rdma: false,
        };
        let node = config
            .node_name
            .clone()
            .unwrap_or_else(|| local_addr.to_string());
        let (notify_tx, _) = broadcast::channel(1024);
        let inner = Arc::new(Inner {
            metrics: TransferMetrics::register(registry),
            config,
            segments: SegmentTable::default(),
            hello,
            node,
            corrupt: AtomicU32::new(0),
            notify_tx,
            peers: Mutex::new(HashMap::new()),
            #[cfg(feature = "rdma")]
            rdma: nic,
        });
        let servers = vec![
            tokio::spawn(tcp_server::accept_loop(listener, inner.clone())),
            tokio::spawn(shm::accept_loop(shm_listener, inner.clone())),
        ];
        tracing::info!(addr = %local_addr, "transfer engine listening");
        Ok(TransferEngine {
            inner,
            local_addr,
            servers,
        })
    }

    /// The address peers reach this engine at.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Register a region; peers may then read and write inside it.
    pub fn register(&self, region: Arc<SharedRegion>) -> SegmentId {
        #[cfg(feature = "rdma")]
        let nic_region = region.clone();
        let id = self.inner.segments.register(region);
        #[cfg(feature = "rdma")]
        if let Some(nic) = &self.inner.rdma {
            nic.register(id, nic_region);
        }
        id
    }

    /// Unregister a segment: every later op naming it is refused.
    pub fn unregister(&self, id: SegmentId) -> Result<(), TransferError> {
        #[cfg(feature = "rdma")]
        if let Some(nic) = &self.inner.rdma {
            nic.unregister(id);
        }
        self.inner
            .segments
            .unregister(id)
            .map(|_| ())
            .ok_or_else(|| TransferError::UnknownSegment {
                side: "local".into(),
                segment: id.0,
            })
    }

    /// Metadata of a registered segment, to hand to peers.
    pub fn segment_meta(&self, id: SegmentId) -> Result<SegmentMeta, TransferError> {
        let region = self
            .inner
            .segments
            .get(id)
            .ok_or_else(|| TransferError::UnknownSegment {
                side: "local".into(),
                segment: id.0,
            })?;
        Ok(SegmentMeta {
            node: self.inner.node.clone(),
            id,
            len: region.len() as u64,
            keys: TransportKeys {
                boot_id: self.inner.hello.boot_id.clone(),
                pid: self.inner.hello.pid,
                shm_socket: self.inner.hello.shm_socket.clone(),
                #[cfg(feature = "rdma")]
                rdma: self.inner.rdma.as_ref().and_then(|nic| nic.key(id)),
                #[cfg(not(feature = "rdma"))]
                rdma: None,
            },
        })
    }

    /// Notifications delivered by peers (see [`Self::batch_then_notify`]).
    pub fn notifications(&self) -> broadcast::Receiver<Notification> {
        self.inner.notify_tx.subscribe()
    }

    /// The transport chosen for `peer`, once a batch has reached it.
    pub fn transport_for(&self, peer: &str) -> Option<Transport> {
        let peers = lock(&self.inner.peers);
        peers.get(peer).and_then(|p| p.chosen())
    }

    /// Arm the next `count` checksummed payloads this engine sends (or copies,
    /// for shm) to be corrupted in flight. Fault injection for tests.
    #[doc(hidden)]
    pub fn inject_payload_corruption(&self, count: u32) {
        self.inner.corrupt.store(count, Ordering::Relaxed);
    }

    /// Run `ops` against the peer at `peer` (its transfer address). One result
    /// per op, in order; an op succeeds only if all of its bytes arrived (and
    /// matched their checksum when asked).
    pub async fn batch(&self, peer: &str, ops: Vec<TransferOp>) -> Vec<Result<(), TransferError>> {
        let n = ops.len() as i64;
        self.inner.metrics.in_flight_ops.inc_by(n);
        let results = self.run(peer, ops).await;
        self.inner.metrics.in_flight_ops.dec_by(n);
        results
    }

    /// Like [`Self::batch`], then, if every op succeeded, deliver `note` to the
    /// peer's [`Self::notifications`] (e.g. "your blocks are in").
    pub async fn batch_then_notify(
        &self,
        peer: &str,
        ops: Vec<TransferOp>,
        note: Vec<u8>,
    ) -> BatchReport {
        let ops = self.batch(peer, ops).await;
        let notified = if ops.iter().all(|r| r.is_ok()) {
            self.notify(peer, &note).await
        } else {
            Err(TransferError::InvalidArgument(
                "notification withheld: an op failed".into(),
            ))
        };
        BatchReport { ops, notified }
    }

    /// Send a notification to a peer.
    pub async fn notify(&self, peer: &str, note: &[u8]) -> Result<(), TransferError> {
        if note.len() as u64 > MAX_NOTIFY_BYTES {
            return Err(TransferError::InvalidArgument(
                "notification too large".into(),
            ));
        }
        let state = self.peer_state(peer);
        match state.choose(&self.inner, peer).await? {
            Transport::Shm => {
                let mut link = match state.shm_checkout(&self.inner, peer) {
                    Ok(l) => l,
                    Err(e) => {
                        state.shm_broken();
                        return Err(e);
                    }
                };
                let r = link.notify(&self.inner, peer, note).await;
                match r {
                    Ok(()) => state.shm_put_back(&self.inner, link),
                    Err(_) => state.shm_broken(),
                }
                r
            }
            // rdma carries data only; notifications ride its control plane, tcp.
            Transport::Tcp | Transport::Rdma => {
                let mut conns = state.tcp_checkout(&self.inner, peer, 1).await?;
                let mut c = conns.pop().ok_or_else(|| TransferError::Connection {
                    peer: peer.into(),
                    reason: "no connection".into(),
                })?;
                tcp_client::notify(&self.inner, peer, &mut c, note).await?;
                state.tcp_put_back(vec![c], false);
                Ok(())
            }
        }
    }

    /// Stop serving; in-flight served requests are cut off.
    pub fn shutdown(self) {}

    async fn run(&self, peer: &str, ops: Vec<TransferOp>) -> Vec<Result<(), TransferError>> {
        let mut results: Vec<Option<Result<(), TransferError>>> = vec![None; ops.len()];
        let mut prepared = Vec::with_capacity(ops.len());
        let mut index = Vec::with_capacity(ops.len());
        for (i, op) in ops.into_iter().enumerate() {
            match self.prepare(op) {
                Ok(p) => {
                    prepared.push(p);
                    index.push(i);
                }
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        if !prepared.is_empty() {
            let state = self.peer_state(peer);
            let outcome = match state.choose(&self.inner, peer).await {
                Ok(Transport::Shm) => self.run_shm(peer, &state, prepared).await,
                Ok(Transport::Tcp) => self.run_tcp(peer, &state, prepared).await,
                Ok(Transport::Rdma) => self.run_rdma(peer, &state, prepared).await,
                Err(e) => vec![Err(e); index.len()],
            };
            for (i, r) in index.into_iter().zip(outcome) {
                results[i] = Some(r);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(TransferError::InvalidArgument("op not run".into()))))
            .collect()
    }

    /// Check the local side of an op before anything moves.
    fn prepare(&self, op: TransferOp) -> Result<PreparedOp, TransferError> {
        if op.len == 0 {
            return Err(TransferError::InvalidArgument("zero-length op".into()));
        }
        let local = self
            .inner
            .segments
            .resolve("local", op.local.0, op.local_offset, op.len)?;
        check_range(&local, op.local_offset, op.len)?;
        Ok(PreparedOp { op, local })
    }

    /// Run ops over tcp and count them in the tcp metrics.
    async fn run_tcp(
        &self,
        peer: &str,
        state: &PeerState,
        ops: Vec<PreparedOp>,
    ) -> Vec<Result<(), TransferError>> {
        let flows: Vec<(OpKind, u64)> = ops.iter().map(|p| (p.op.kind, p.op.len)).collect();
        let results = self.run_tcp_uncounted(peer, state, ops).await;
        for ((kind, len), r) in flows.into_iter().zip(&results) {
            let dir = match kind {
                OpKind::Read => DirectionLabel::Read,
                OpKind::Write => DirectionLabel::Write,
            };
            match r {
                Ok(()) => self.inner.metrics.op_done(TransportLabel::Tcp, dir, len),
                Err(_) => self.inner.metrics.op_failed(TransportLabel::Tcp),
            }
        }
        results
    }

    async fn run_tcp_uncounted(
        &self,
        peer: &str,
        state: &PeerState,
        ops: Vec<PreparedOp>,
    ) -> Vec<Result<(), TransferError>> {
        let n = ops.len();
        let slice = self.inner.config.slice_bytes as u64;
        let slices: u64 = ops.iter().map(|p| p.op.len.div_ceil(slice)).sum();
        let want = (slices as usize).clamp(1, self.inner.config.connections_per_peer);
        let conns = match state.tcp_checkout(&self.inner, peer, want).await {
            Ok(c) => c,
            Err(e) => return vec![Err(e); n],
        };
        let (results, healthy) = tcp_client::run_batch(&self.inner, peer, ops, conns).await;
        let one_broke = healthy.len() < want;
        state.tcp_put_back(healthy, one_broke);
        results
    }

    async fn run_shm(
        &self,
        peer: &str,
        state: &PeerState,
        ops: Vec<PreparedOp>,
    ) -> Vec<Result<(), TransferError>> {
        let n = ops.len();
        let mut link = match state.shm_checkout(&self.inner, peer) {
            Ok(l) => l,
            Err(e) => {
                state.shm_broken();
                return vec![Err(e); n];
            }
        };
        match link.run_batch(&self.inner, peer, ops).await {
            Ok(r) => {
                state.shm_put_back(&self.inner, link);
                r
            }
            Err(e) => {
                // Reconnect (and re-decide the transport) on the next batch.
                state.shm_broken();
                vec![Err(e); n]
            }
        }
    }

    /// Run ops over rdma; the ops it cannot carry (a segment without NIC
    /// registration) go over tcp.
    #[cfg(feature = "rdma")]
    async fn run_rdma(
        &self,
        peer: &str,
        state: &PeerState,
        ops: Vec<PreparedOp>,
    ) -> Vec<Result<(), TransferError>> {
        let n = ops.len();
        let slice = self.inner.config.slice_bytes.max(4096) as u64;
        let slices: u64 = ops.iter().map(|p| p.op.len.div_ceil(slice)).sum();
        let want = (slices as usize).clamp(1, self.inner.config.connections_per_peer);
        let links = match state.rdma.checkout(&self.inner, peer, want).await {
            Ok(l) => l,
            Err(e) => {
                state.rdma_finished(peer, false, true);
                return vec![Err(e); n];
            }
        };
        let leftover_ops = ops.clone();
        let out = crate::rdma_batch::run_batch(&self.inner, peer, ops, links).await;
        let any_ok = out.results.iter().any(|r| matches!(r, Some(Ok(()))));
        state.rdma_finished(peer, any_ok, out.broken);
        state
            .rdma
            .put_back(out.healthy, self.inner.config.connections_per_peer.max(1));
        let mut results = out.results;
        let (index, leftover): (Vec<usize>, Vec<PreparedOp>) = leftover_ops
            .into_iter()
            .enumerate()
            .filter(|(i, _)| results[*i].is_none())
            .unzip();
        if !leftover.is_empty() {
            let tcp = self.run_tcp(peer, state, leftover).await;
            for (i, r) in index.into_iter().zip(tcp) {
                results[i] = Some(r);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(TransferError::InvalidArgument("op not run".into()))))
            .collect()
    }

    #[cfg(not(feature = "rdma"))]
    async fn run_rdma(
        &self,
        _peer: &str,
        _state: &PeerState,
        ops: Vec<PreparedOp>,
    ) -> Vec<Result<(), TransferError>> {
        let e = TransferError::Unsupported("built without the rdma feature".into());
        vec![Err(e); ops.len()]
    }

    fn peer_state(&self, peer: &str) -> Arc<PeerState> {
        lock(&self.inner.peers)
            .entry(peer.to_string())
            .or_default()
            .clone()
    }
}

impl Drop for TransferEngine {
    fn drop(&mut self) {
        for s in &self.servers {
            s.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The kernel boot id: equal on two processes means the same host.
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
