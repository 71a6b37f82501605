//! The shm links to one peer: the pool of the peer process whose socket its
//! hello named (None until shm was chosen, and after a link broke), and the
//! batch contract over it.

use std::sync::{Arc, Mutex};

use super::link::{ShmLink, ShmPool};
use crate::core::{lock, Inner, OpResult, PreparedOp};
use crate::error::ConnectionFault;
use crate::metrics::TransportLabel;
use crate::transport::contract::BatchTransport;
use crate::transport::idle::IdleLimits;
use crate::TransferError;

/// The shm state this engine keeps for one peer.
#[derive(Default)]
pub(crate) struct ShmPeer {
    pool: Mutex<Option<ShmPool>>,
}

impl ShmPeer {
    /// Whether shm links to the peer work (one was opened and none broke since).
    pub fn ready(&self) -> bool {
        lock(&self.pool).is_some()
    }

    /// Open a pool to the peer serving shm at `socket`, with one link (so a
    /// socket that cannot be reached is found out now).
    pub fn open(&self, inner: &Inner, socket: String) -> Result<(), TransferError> {
        let pool = ShmPool::open(socket)?;
        inner.metrics.link_opened(TransportLabel::Shm);
        *lock(&self.pool) = Some(pool);
        Ok(())
    }

    /// An idle link to the peer, or a new one to the socket its hello named.
    fn checkout(&self, inner: &Inner, peer: &str) -> Result<ShmLink, TransferError> {
        let connect = {
            let mut pool = lock(&self.pool);
            let Some(pool) = pool.as_mut() else {
                return Err(TransferError::connection(
                    peer,
                    ConnectionFault::NoLink { transport: "shm" },
                ));
            };
            if let Some(link) = pool.take_idle(IdleLimits::of(&inner.config)) {
                return Ok(link);
            }
            pool.connector()
        };
        let link = connect()?;
        inner.metrics.link_opened(TransportLabel::Shm);
        Ok(link)
    }

    /// Return a healthy link.
    fn put_back(&self, inner: &Inner, link: ShmLink) {
        if let Some(pool) = lock(&self.pool).as_mut() {
            pool.put_back(link, IdleLimits::of(&inner.config));
        }
    }

    /// A link broke: forget the pool (the transport is decided again).
    fn broken(&self) {
        *lock(&self.pool) = None;
    }

    /// Deliver a notification.
    pub async fn notify(
        &self,
        inner: &Inner,
        peer: &str,
        note: &[u8],
    ) -> Result<(), TransferError> {
        let mut link = match self.checkout(inner, peer) {
            Ok(l) => l,
            Err(e) => {
                self.broken();
                return Err(e);
            }
        };
        let r = link.notify(inner, peer, note).await;
        match r {
            Ok(()) => self.put_back(inner, link),
            Err(_) => self.broken(),
        }
        r
    }
}

impl BatchTransport for ShmPeer {
    async fn run_batch(
        &self,
        inner: &Arc<Inner>,
        peer: &str,
        ops: Vec<PreparedOp>,
    ) -> Vec<Option<OpResult>> {
        let n = ops.len();
        let mut link = match self.checkout(inner, peer) {
            Ok(l) => l,
            Err(e) => {
                self.broken();
                return vec![Some(Err(e)); n];
            }
        };
        match link.run_batch(inner, peer, ops).await {
            Ok(r) => {
                self.put_back(inner, link);
                r.into_iter().map(Some).collect()
            }
            Err(e) => {
                // Reconnect (and re-decide the transport) on the next batch.
                self.broken();
                vec![Some(Err(e)); n]
            }
        }
    }
}
