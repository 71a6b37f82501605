//! rdma links (feature `rdma`): a tcp control connection to the peer plus one
//! RC queue pair set up over it ([`RequestKind::RdmaConnect`]: our endpoint
//! out, the peer's back); the peer keeps its end of the queue pair as long as
//! that connection lives, so dropping a link tears down both ends. And the
//! per-peer pool of links.
//!
//! rdma is chosen for a peer only when both ends have a device (the hello
//! says so) and the exchange works; a failed exchange is logged once per peer
//! and the peer gets tcp.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::error::{ConnectionFault, Missing};
use crate::transport::tcp::conn::Conn;
use tokio::io::AsyncReadExt;

use super::nic::Nic;
use super::verbs::RcQueuePair;
use crate::core::{lock, Inner};
use crate::hello::Hello;
use crate::metrics::TransportLabel;
use crate::transport::idle::{Idle, IdleLimits};
use crate::transport::io::{bounded, read_message, write_all_v};
use crate::transport::tcp::client;
use crate::transport::tcp::protocol::{
    RdmaEndpoint, Request, RequestKind, Response, Status, RDMA_ENDPOINT_BYTES, RESPONSE_BYTES,
};
use crate::TransferError;

/// A control connection and the queue pair set up over it.
pub(crate) struct RdmaLink {
    pub(crate) conn: Conn,
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
pub(crate) struct RdmaPeer {
    pub(super) nic: Arc<Nic>,
    pool: Mutex<Option<(Arc<()>, Idle<RdmaLink>)>>,
    warned: AtomicBool,
    /// An op to this peer has succeeded over rdma.
    proven: AtomicBool,
    /// rdma to this peer is off (it broke before any op succeeded).
    disabled: AtomicBool,
}

impl RdmaPeer {
    pub fn new(nic: Arc<Nic>) -> Self {
        RdmaPeer {
            nic,
            pool: Mutex::new(None),
            warned: AtomicBool::new(false),
            proven: AtomicBool::new(false),
            disabled: AtomicBool::new(false),
        }
    }

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
        self.nic.device("no local RDMA device")?;
        if !hello.rdma {
            return Err(TransferError::Unsupported(Missing::PeerRdma {
                peer: peer.to_string(),
            }));
        }
        if self.disabled.load(Ordering::Relaxed) {
            return Err(TransferError::Unsupported(Missing::RdmaDisabled {
                peer: peer.to_string(),
            }));
        }
        let token = Arc::new(());
        let link = match open_link(inner, &self.nic, peer, token.clone()).await {
            Ok(l) => l,
            Err(e) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(%peer, error = %e, "rdma queue-pair exchange failed; using tcp");
                }
                return Err(e);
            }
        };
        *lock(&self.pool) = Some((token, Idle::holding(link, Instant::now())));
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
                return Err(TransferError::connection(
                    peer,
                    ConnectionFault::NoLink { transport: "rdma" },
                ));
            };
            let limits = IdleLimits::of(&inner.config);
            let (links, expired) = idle.take(want, limits, Instant::now());
            drop(expired);
            (links, token.clone())
        };
        while links.len() < want {
            match open_link(inner, &self.nic, peer, token.clone()).await {
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

    /// Return healthy links (within `limits`; the rest are closed); links
    /// of an earlier pool are closed.
    pub fn put_back(&self, links: Vec<RdmaLink>, limits: IdleLimits) {
        let closed = {
            let mut pool = lock(&self.pool);
            match pool.as_mut() {
                Some((token, idle)) => {
                    let (current, stale): (Vec<_>, Vec<_>) =
                        links.into_iter().partition(|l| Arc::ptr_eq(&l.pool, token));
                    let mut closed = idle.put_back(current, limits, Instant::now());
                    closed.extend(stale);
                    closed
                }
                None => links,
            }
        };
        drop(closed);
    }
}

/// Initiating side of the exchange: a control connection, our queue pair,
/// the peer's endpoint in return, and our queue pair connected to it.
async fn open_link(
    inner: &Inner,
    nic: &Nic,
    peer: &str,
    pool: Arc<()>,
) -> Result<RdmaLink, TransferError> {
    let device = nic.device("no local RDMA device")?;
    let timeout = inner.config.op_timeout();
    let (link, _) = client::connect(inner, peer).await?;
    let mut conn = link.conn;
    let mut qp = RcQueuePair::create(device)?;
    let req = Request::control(RequestKind::RdmaConnect, RDMA_ENDPOINT_BYTES as u64);
    let ours = qp.endpoint().encode();
    bounded(
        peer,
        timeout,
        write_all_v(&mut conn, [&req.encode(), &ours]),
    )
    .await?;
    let mut head = [0u8; RESPONSE_BYTES];
    bounded(peer, timeout, conn.read_exact(&mut head)).await?;
    let resp = Response::decode(&head)?;
    if resp.status != Status::Ok {
        let reason = bounded(peer, timeout, read_message(&mut conn, resp.message_len)).await?;
        return Err(TransferError::Unsupported(Missing::PeerRefused {
            peer: peer.to_string(),
            reason,
        }));
    }
    if resp.payload_len != RDMA_ENDPOINT_BYTES as u64 {
        let len = resp.payload_len;
        return Err(TransferError::connection(
            peer,
            ConnectionFault::RdmaEndpointLen { len },
        ));
    }
    let mut theirs = [0u8; RDMA_ENDPOINT_BYTES];
    bounded(peer, timeout, conn.read_exact(&mut theirs)).await?;
    qp.connect(RdmaEndpoint::decode(&theirs)?)?;
    inner.metrics.link_opened(TransportLabel::Rdma);
    Ok(RdmaLink { conn, qp, pool })
}
