//! The rdma transport on the engine side (feature `rdma`): the engine's NIC
//! (the device opened at start and the NIC registration of every segment),
//! the per-peer pools of rdma links, and both ends of the queue-pair exchange.
//! Running a batch over rdma links is `rdma_batch.rs`.
//!
//! A link is a tcp control connection to the peer plus one RC queue pair set
//! up over it ([`RequestKind::RdmaConnect`]: our endpoint out, the peer's
//! back); the peer keeps its end of the queue pair as long as that connection
//! lives, so dropping a link tears down both ends. rdma is chosen for a peer
//! only when both ends have a device (the hello says so) and the exchange
//! works; a failed exchange is logged once per peer and the peer gets tcp.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::engine::Inner;
use crate::io_util::{bounded, read_message, write_all_2};
use crate::metrics::TransportLabel;
use crate::protocol::{
    Hello, RdmaEndpoint, Request, RequestKind, Response, Status, RDMA_ENDPOINT_BYTES,
    RESPONSE_BYTES,
};
use crate::rdma::{self, RcQueuePair, RdmaDevice, RdmaMemory};
use crate::segment::RdmaKey;
use crate::{tcp_client, SegmentId, SharedRegion, TransferError};

/// Queue pairs one control connection may hold on the serving side.
pub(crate) const MAX_SERVED_QPS: usize = 16;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The engine's NIC: the device opened at start and the NIC registration of
/// every segment, whose rkeys go into segment metadata.
pub(crate) struct RdmaNic {
    device: Arc<RdmaDevice>,
    memory: Mutex<HashMap<SegmentId, Arc<RdmaMemory>>>,
}

impl RdmaNic {
    /// Discover devices (logging once) and open the first; None without one.
    pub fn discover() -> Option<Self> {
        rdma::log_devices_once();
        if rdma::device_names().is_empty() {
            return None;
        }
        match RdmaDevice::open(None) {
            Ok(device) => Some(RdmaNic {
                device,
                memory: Default::default(),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "RDMA device present but unusable; using tcp");
                None
            }
        }
    }

    /// Register a segment with the NIC; failure is logged and leaves the
    /// segment reachable over tcp/shm only.
    pub fn register(&self, id: SegmentId, region: Arc<SharedRegion>) {
        match self.device.register(region) {
            Ok(mem) => {
                lock(&self.memory).insert(id, Arc::new(mem));
            }
            Err(e) => tracing::warn!(segment = %id, error = %e, "RDMA registration failed"),
        }
    }

    /// Drop a segment's NIC registration (its rkey stops working once no
    /// in-flight batch holds it).
    pub fn unregister(&self, id: SegmentId) {
        lock(&self.memory).remove(&id);
    }

    /// The segment's RDMA key, when registered with the NIC.
    pub fn key(&self, id: SegmentId) -> Option<RdmaKey> {
        lock(&self.memory).get(&id).map(|m| m.key())
    }

    pub(crate) fn memory(&self, id: SegmentId) -> Option<Arc<RdmaMemory>> {
        lock(&self.memory).get(&id).cloned()
    }
}

/// Serving side of the exchange: a queue pair connected to `remote`.
pub(crate) fn accept_qp(inner: &Inner, remote: RdmaEndpoint) -> Result<RcQueuePair, TransferError> {
    let nic = inner
        .rdma
        .as_ref()
        .ok_or_else(|| TransferError::Unsupported("no RDMA device".into()))?;
    let mut qp = RcQueuePair::create(&nic.device)?;
    qp.connect(remote)?;
    Ok(qp)
}

/// A control connection and the queue pair set up over it.
pub(crate) struct RdmaLink {
    pub(crate) conn: TcpStream,
    pub(crate) qp: RcQueuePair,
    /// The pool this link was opened for (see [`RdmaPeer::put_back`]).
    pool: Arc<()>,
}

/// What the engine keeps per peer for rdma: the idle links of the current
/// pool (None until rdma was chosen, and after a link broke).
///
/// Queue pairs connect even when the two NICs cannot reach each other (the
/// failure shows on the first work request), so rdma that breaks before any
/// op ever succeeded over it is turned off for the peer, which then gets tcp.
#[derive(Default)]
pub(crate) struct RdmaPeer {
    pool: Mutex<Option<(Arc<()>, Vec<RdmaLink>)>>,
    warned: AtomicBool,
    /// An op to this peer has succeeded over rdma.
    proven: AtomicBool,
    /// rdma to this peer is off (it broke before any op succeeded).
    disabled: AtomicBool,
}

impl RdmaPeer {
    /// Whether rdma links to this peer work (one was set up and none broke since).
    pub fn ready(&self) -> bool {
        lock(&self.pool).is_some()
    }

    /// Try rdma to a peer that said `hello`: both ends need a NIC and the
    /// queue-pair exchange must succeed. On success the first link is pooled.
    pub async fn open(
        &self,
        inner: &Inner,
        peer: &str,
        hello: &Hello,
    ) -> Result<(), TransferError> {
        if inner.rdma.is_none() {
            return Err(TransferError::Unsupported("no local RDMA device".into()));
        }
        if !hello.rdma {
            return Err(TransferError::Unsupported(format!(
                "{peer} has no RDMA device"
            )));
        }
        if self.disabled.load(Ordering::Relaxed) {
            return Err(TransferError::Unsupported(format!(
                "rdma to {peer} is off: it failed before any op succeeded"
            )));
        }
        let token = Arc::new(());
        let link = match open_link(inner, peer, token.clone()).await {
            Ok(l) => l,
            Err(e) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(%peer, error = %e, "rdma queue-pair exchange failed; using tcp");
                }
                return Err(e);
            }
        };
        *lock(&self.pool) = Some((token, vec![link]));
        Ok(())
    }

    /// A batch finished over rdma: `any_ok` if an op succeeded over it,
    /// `broken` if a link broke, in which case every link is forgotten (the
    /// peer may have restarted) and, if rdma never worked, it is turned off.
    pub fn finished(&self, peer: &str, any_ok: bool, broken: bool) {
        if any_ok {
            self.proven.store(true, Ordering::Relaxed);
        }
        if broken {
            *lock(&self.pool) = None;
            if !self.proven.load(Ordering::Relaxed) && !self.disabled.swap(true, Ordering::Relaxed)
            {
                tracing::warn!(%peer, "rdma failed before any op succeeded; using tcp for this peer");
            }
        }
    }

    /// Take up to `want` links, opening what is missing (at least one).
    pub async fn checkout(
        &self,
        inner: &Inner,
        peer: &str,
        want: usize,
    ) -> Result<Vec<RdmaLink>, TransferError> {
        let (mut links, token) = {
            let mut pool = lock(&self.pool);
            let Some((token, idle)) = pool.as_mut() else {
                return Err(TransferError::Connection {
                    peer: peer.into(),
                    reason: "no rdma link".into(),
                });
            };
            let keep = idle.len().saturating_sub(want);
            (idle.drain(keep..).collect::<Vec<_>>(), token.clone())
        };
        while links.len() < want {
            match open_link(inner, peer, token.clone()).await {
                Ok(l) => links.push(l),
                Err(e) if links.is_empty() => return Err(e),
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "extra rdma link failed; using fewer");
                    break;
                }
            }
        }
        Ok(links)
    }

    /// Return healthy links (at most `cap` stay idle); links of an earlier
    /// pool are closed.
    pub fn put_back(&self, links: Vec<RdmaLink>, cap: usize) {
        let mut pool = lock(&self.pool);
        if let Some((token, idle)) = pool.as_mut() {
            for l in links {
                if Arc::ptr_eq(&l.pool, token) && idle.len() < cap {
                    idle.push(l);
                }
            }
        }
    }
}

/// Initiating side of the exchange: a control connection, our queue pair,
/// the peer's endpoint in return, and our queue pair connected to it.
async fn open_link(inner: &Inner, peer: &str, pool: Arc<()>) -> Result<RdmaLink, TransferError> {
    let nic = inner
        .rdma
        .as_ref()
        .ok_or_else(|| TransferError::Unsupported("no local RDMA device".into()))?;
    let timeout = inner.config.op_timeout();
    let (mut conn, _) = tcp_client::connect(inner, peer).await?;
    let mut qp = RcQueuePair::create(&nic.device)?;
    let req = Request {
        kind: RequestKind::RdmaConnect,
        flags: 0,
        segment: 0,
        op_offset: 0,
        op_len: RDMA_ENDPOINT_BYTES as u64,
        slice_offset: 0,
        slice_len: RDMA_ENDPOINT_BYTES as u64,
        checksum: 0,
    };
    let ours = qp.endpoint().encode();
    bounded(peer, timeout, write_all_2(&mut conn, &req.encode(), &ours)).await?;
    let mut head = [0u8; RESPONSE_BYTES];
    bounded(peer, timeout, conn.read_exact(&mut head)).await?;
    let resp = Response::decode(&head)?;
    if resp.status != Status::Ok {
        let reason = bounded(peer, timeout, read_message(&mut conn, resp.message_len)).await?;
        return Err(TransferError::Unsupported(format!("{peer}: {reason}")));
    }
    if resp.payload_len != RDMA_ENDPOINT_BYTES as u64 {
        return Err(TransferError::Connection {
            peer: peer.into(),
            reason: format!("rdma endpoint of {} bytes", resp.payload_len),
        });
    }
    let mut theirs = [0u8; RDMA_ENDPOINT_BYTES];
    bounded(peer, timeout, conn.read_exact(&mut theirs)).await?;
    qp.connect(RdmaEndpoint::decode(&theirs)?)?;
    inner.metrics.link_opened(TransportLabel::Rdma);
    Ok(RdmaLink { conn, qp, pool })
}
