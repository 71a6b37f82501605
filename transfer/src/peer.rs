//! What the engine keeps per peer: the transport chosen for it, one pool of
//! links per transport (tcp connections, shm links, rdma links), and the
//! decision of which transport carries its batches.
//!
//! Each batch checks out its own links and returns the healthy ones, so
//! concurrent batches to one peer run in parallel; no lock here is held across
//! an await. A broken shm or rdma link drops that transport's pool and the
//! decision, which is made again (after a fresh hello) on the next batch.

use std::sync::Mutex;

use tokio::net::TcpStream;

use crate::config::TransportChoice;
use crate::engine::{Inner, Transport};
use crate::metrics::TransportLabel;
use crate::protocol::Hello;
use crate::shm::{ShmLink, ShmPool};
use crate::{tcp_client, TransferError};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What this engine knows about one peer.
#[derive(Default)]
pub(crate) struct PeerState {
    idle: Mutex<Vec<TcpStream>>,
    chosen: Mutex<Option<Transport>>,
    /// The peer's shm socket (from its hello) and idle shm links; None until
    /// shm was chosen, and after a link broke.
    shm: Mutex<Option<ShmPool>>,
    #[cfg(feature = "rdma")]
    pub rdma: crate::rdma_link::RdmaPeer,
}

impl PeerState {
    /// The transport decided for this peer, if any.
    pub fn chosen(&self) -> Option<Transport> {
        *lock(&self.chosen)
    }

    /// Take `want` tcp connections from the pool, opening what is missing.
    pub async fn tcp_checkout(
        &self,
        inner: &Inner,
        peer: &str,
        want: usize,
    ) -> Result<Vec<TcpStream>, TransferError> {
        let mut conns: Vec<TcpStream> = {
            let mut idle = lock(&self.idle);
            let keep = idle.len().saturating_sub(want);
            idle.drain(keep..).collect()
        };
        while conns.len() < want {
            let (c, _) = tcp_client::connect(inner, peer).await?;
            conns.push(c);
        }
        Ok(conns)
    }

    /// Return healthy tcp connections; when one of the batch broke, the idle
    /// ones are closed too (the peer may have restarted).
    pub fn tcp_put_back(&self, healthy: Vec<TcpStream>, one_broke: bool) {
        let mut idle = lock(&self.idle);
        if one_broke {
            idle.clear();
        }
        idle.extend(healthy);
    }

    /// An idle shm link to the peer, or a new one to the socket its hello named.
    pub fn shm_checkout(&self, inner: &Inner, peer: &str) -> Result<ShmLink, TransferError> {
        let connect = {
            let mut pool = lock(&self.shm);
            let Some(pool) = pool.as_mut() else {
                return Err(TransferError::Connection {
                    peer: peer.into(),
                    reason: "no shm link".into(),
                });
            };
            if let Some(link) = pool.take_idle() {
                return Ok(link);
            }
            pool.connector()
        };
        let link = connect()?;
        inner.metrics.link_opened(TransportLabel::Shm);
        Ok(link)
    }

    /// Return a healthy shm link.
    pub fn shm_put_back(&self, inner: &Inner, link: ShmLink) {
        if let Some(pool) = lock(&self.shm).as_mut() {
            pool.put_back(link, inner.config.connections_per_peer.max(1));
        }
    }

    /// A shm link broke: forget the pool and re-decide on the next batch.
    pub fn shm_broken(&self) {
        *lock(&self.shm) = None;
        *lock(&self.chosen) = None;
    }

    /// A batch over rdma finished (see [`crate::rdma_link::RdmaPeer::finished`]);
    /// when a link broke, re-decide on the next batch.
    #[cfg(feature = "rdma")]
    pub fn rdma_finished(&self, peer: &str, any_ok: bool, broken: bool) {
        self.rdma.finished(peer, any_ok, broken);
        if broken {
            *lock(&self.chosen) = None;
        }
    }

    /// The transport for the next batch: the one decided, while its links work.
    pub async fn choose(&self, inner: &Inner, peer: &str) -> Result<Transport, TransferError> {
        if let Some(t) = self.chosen() {
            let ready = match t {
                Transport::Tcp => true,
                Transport::Shm => lock(&self.shm).is_some(),
                #[cfg(feature = "rdma")]
                Transport::Rdma => self.rdma.ready(),
                #[cfg(not(feature = "rdma"))]
                Transport::Rdma => false,
            };
            if ready {
                return Ok(t);
            }
        }
        let choice = inner.config.transport;
        let t = if choice == TransportChoice::Tcp {
            Transport::Tcp
        } else {
            self.decide(inner, peer, choice).await?
        };
        *lock(&self.chosen) = Some(t);
        Ok(t)
    }

    /// Say hello to the peer and pick: shm on the same host, then rdma where
    /// both ends have a device, else tcp (an explicit `shm` or `rdma` choice
    /// that cannot be met is an error instead).
    async fn decide(
        &self,
        inner: &Inner,
        peer: &str,
        choice: TransportChoice,
    ) -> Result<Transport, TransferError> {
        let (conn, hello) = tcp_client::connect(inner, peer).await?;
        lock(&self.idle).push(conn);
        let same_host = hello.boot_id == inner.hello.boot_id && !hello.boot_id.is_empty();
        if matches!(choice, TransportChoice::Auto | TransportChoice::Shm) && same_host {
            match ShmPool::open(hello.shm_socket.clone()) {
                Ok(pool) => {
                    inner.metrics.link_opened(TransportLabel::Shm);
                    *lock(&self.shm) = Some(pool);
                    return Ok(Transport::Shm);
                }
                Err(e) if choice == TransportChoice::Shm => return Err(e),
                Err(e) => tracing::warn!(%peer, error = %e, "shm link failed, not using shm"),
            }
        }
        if choice == TransportChoice::Shm {
            return Err(TransferError::Unsupported(format!(
                "shm to {peer}: peer is on another host"
            )));
        }
        match self.open_rdma(inner, peer, &hello).await {
            Ok(()) => Ok(Transport::Rdma),
            Err(e) if choice == TransportChoice::Rdma => Err(e),
            Err(_) => Ok(Transport::Tcp),
        }
    }

    #[cfg(feature = "rdma")]
    async fn open_rdma(
        &self,
        inner: &Inner,
        peer: &str,
        hello: &Hello,
    ) -> Result<(), TransferError> {
        self.rdma.open(inner, peer, hello).await
    }

    #[cfg(not(feature = "rdma"))]
    async fn open_rdma(
        &self,
        _inner: &Inner,
        _peer: &str,
        _hello: &Hello,
    ) -> Result<(), TransferError> {
        Err(TransferError::Unsupported(
            "built without the rdma feature".into(),
        ))
    }
}
