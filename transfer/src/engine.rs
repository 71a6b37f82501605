//! The transfer engine: owns the segment table, the tcp and shm servers, the
//! per-peer connection state, and turns a batch of ops into per-op results
//! over the transport chosen for the peer.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::config::{TransferConfig, TransportChoice};
use crate::metrics::{DirectionLabel, TransferMetrics, TransportLabel};
use crate::op::{BatchReport, Notification, OpKind, TransferOp};
use crate::protocol::{Hello, MAX_NOTIFY_BYTES};
use crate::segment::{check_range, SegmentId, SegmentMeta, SegmentTable, TransportKeys};
use crate::shm::{self, ShmLink};
use crate::{tcp_client, tcp_server, SharedRegion, TransferError};

/// The transport that carries a peer's batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Shm,
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
    rdma: Option<crate::rdma::RdmaNic>,
}

impl Inner {
    /// Consume one armed payload corruption (test hook), if any.
    pub fn take_corruption(&self) -> bool {
        self.corrupt
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// What this engine knows about one peer.
#[derive(Default)]
struct PeerState {
    idle: Mutex<Vec<TcpStream>>,
    chosen: Mutex<Option<Transport>>,
    shm: tokio::sync::Mutex<Option<ShmLink>>,
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
        let hello = Hello {
            pid,
            boot_id: boot_id(),
            shm_socket: socket,
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
            rdma: crate::rdma::RdmaNic::discover(),
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
        peers.get(peer).and_then(|p| *lock(&p.chosen))
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
        match self.choose(peer, &state).await? {
            Transport::Shm => {
                let mut link = state.shm.lock().await;
                let r = match link.as_mut() {
                    Some(l) => l.notify(&self.inner, peer, note).await,
                    None => Err(TransferError::Connection {
                        peer: peer.into(),
                        reason: "no shm link".into(),
                    }),
                };
                if r.is_err() {
                    *link = None;
                }
                r
            }
            Transport::Tcp => {
                let mut conns = self.checkout(peer, &state, 1).await?;
                let mut c = conns.pop().ok_or_else(|| TransferError::Connection {
                    peer: peer.into(),
                    reason: "no connection".into(),
                })?;
                tcp_client::notify(&self.inner, peer, &mut c, note).await?;
                lock(&state.idle).push(c);
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
            let kinds: Vec<OpKind> = prepared.iter().map(|p| p.op.kind).collect();
            let lens: Vec<u64> = prepared.iter().map(|p| p.op.len).collect();
            let outcome = match self.choose(peer, &state).await {
                Ok(Transport::Shm) => self.run_shm(peer, &state, prepared).await,
                Ok(Transport::Tcp) => {
                    let out = self.run_tcp(peer, &state, prepared).await;
                    for (i, r) in out.iter().enumerate() {
                        let dir = match kinds[i] {
                            OpKind::Read => DirectionLabel::Read,
                            OpKind::Write => DirectionLabel::Write,
                        };
                        match r {
                            Ok(()) => self
                                .inner
                                .metrics
                                .op_done(TransportLabel::Tcp, dir, lens[i]),
                            Err(_) => self.inner.metrics.op_failed(TransportLabel::Tcp),
                        }
                    }
                    out
                }
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

    async fn run_tcp(
        &self,
        peer: &str,
        state: &PeerState,
        ops: Vec<PreparedOp>,
    ) -> Vec<Result<(), TransferError>> {
        let n = ops.len();
        let slice = self.inner.config.slice_bytes as u64;
        let slices: u64 = ops.iter().map(|p| p.op.len.div_ceil(slice)).sum();
        let want = (slices as usize).clamp(1, self.inner.config.connections_per_peer);
        let conns = match self.checkout(peer, state, want).await {
            Ok(c) => c,
            Err(e) => return vec![Err(e); n],
        };
        let (results, healthy) = tcp_client::run_batch(&self.inner, peer, ops, conns).await;
        let mut idle = lock(&state.idle);
        if healthy.len() < want {
            // A connection broke: the peer may have restarted; reconnect next batch.
            idle.clear();
        }
        idle.extend(healthy);
        results
    }

    async fn run_shm(
        &self,
        peer: &str,
        state: &PeerState,
        ops: Vec<PreparedOp>,
    ) -> Vec<Result<(), TransferError>> {
        let n = ops.len();
        let mut link = state.shm.lock().await;
        let Some(l) = link.as_mut() else {
            return vec![
                Err(TransferError::Connection {
                    peer: peer.into(),
                    reason: "no shm link".into()
                });
                n
            ];
        };
        match l.run_batch(&self.inner, peer, ops).await {
            Ok(r) => r,
            Err(e) => {
                // Reconnect (and re-decide the transport) on the next batch.
                *link = None;
                *lock(&state.chosen) = None;
                vec![Err(e); n]
            }
        }
    }

    fn peer_state(&self, peer: &str) -> Arc<PeerState> {
        lock(&self.inner.peers)
            .entry(peer.to_string())
            .or_default()
            .clone()
    }

    /// Take `want` connections to `peer` from its pool, opening what is missing.
    async fn checkout(
        &self,
        peer: &str,
        state: &PeerState,
        want: usize,
    ) -> Result<Vec<TcpStream>, TransferError> {
        let mut conns: Vec<TcpStream> = {
            let mut idle = lock(&state.idle);
            let keep = idle.len().saturating_sub(want);
            idle.drain(keep..).collect()
        };
        while conns.len() < want {
            let (c, _) = tcp_client::connect(&self.inner, peer).await?;
            conns.push(c);
        }
        Ok(conns)
    }

    /// Decide (once per peer link) which transport carries its batches.
    async fn choose(&self, peer: &str, state: &PeerState) -> Result<Transport, TransferError> {
        let chosen = *lock(&state.chosen);
        if let Some(t) = chosen {
            if t == Transport::Tcp || state.shm.lock().await.is_some() {
                return Ok(t);
            }
        }
        let choice = self.inner.config.transport;
        let t = if choice == TransportChoice::Tcp {
            Transport::Tcp
        } else {
            let (conn, hello) = tcp_client::connect(&self.inner, peer).await?;
            lock(&state.idle).push(conn);
            let same_host = hello.boot_id == self.inner.hello.boot_id && !hello.boot_id.is_empty();
            let link = if same_host {
                Some(ShmLink::connect(&hello.shm_socket))
            } else {
                None
            };
            match (link, choice) {
                (Some(Ok(l)), _) => {
                    *state.shm.lock().await = Some(l);
                    Transport::Shm
                }
                (Some(Err(e)), TransportChoice::Shm) => return Err(e),
                (None, TransportChoice::Shm) => {
                    return Err(TransferError::Unsupported(format!(
                        "shm to {peer}: peer is on another host"
                    )))
                }
                (Some(Err(e)), _) => {
                    tracing::warn!(%peer, error = %e, "shm link failed, using tcp");
                    Transport::Tcp
                }
                (None, _) => Transport::Tcp,
            }
        };
        *lock(&state.chosen) = Some(t);
        Ok(t)
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
