//! The tcp links to one peer: a pool of idle connections that each batch
//! checks connections out of (opening what is missing) and returns the
//! healthy ones to, so concurrent batches to one peer run in parallel.
//!
//! The pool keeps at most `connections_per_peer` idle connections: a burst
//! of concurrent batches opens what it needs, and what it returns beyond
//! that is closed. Without the bound every peak of concurrency stayed open
//! for the life of the process (the soak saw an engine hold 12 idle
//! connections to each peer, and their 12 server ends on the peer, issue
//! #23).

use std::sync::{Arc, Mutex};

use super::client;
use super::conn::Link;
use crate::core::{connections_for, lock, Inner, OpResult, PreparedOp};
use crate::metrics::{DirectionLabel, TransportLabel};
use crate::transport::contract::BatchTransport;
use crate::TransferError;

/// The idle tcp connections to one peer.
#[derive(Default)]
pub(crate) struct TcpPeer {
    idle: Mutex<Vec<Link>>,
}

impl TcpPeer {
    /// Take `want` connections from the pool, opening what is missing.
    pub async fn checkout(
        &self,
        inner: &Inner,
        peer: &str,
        want: usize,
    ) -> Result<Vec<Link>, TransferError> {
        let mut conns: Vec<Link> = {
            let mut idle = lock(&self.idle);
            let keep = idle.len().saturating_sub(want);
            idle.drain(keep..).collect()
        };
        while conns.len() < want {
            let (c, _) = client::connect(inner, peer).await?;
            conns.push(c);
        }
        Ok(conns)
    }

    /// Return healthy connections, keeping at most `max_idle` idle (the
    /// rest are closed); when one of the batch broke, the idle ones are
    /// closed too (the peer may have restarted).
    pub fn put_back(&self, healthy: Vec<Link>, one_broke: bool, max_idle: usize) {
        let closed: Vec<Link> = {
            let mut idle = lock(&self.idle);
            let mut closed = if one_broke {
                std::mem::take(&mut *idle)
            } else {
                Vec::new()
            };
            idle.extend(healthy);
            let keep = idle.len().min(max_idle.max(1));
            closed.extend(idle.drain(keep..));
            closed
        };
        // Closed outside the lock.
        drop(closed);
    }

    /// Close the idle connections the peer has closed (a killed or
    /// restarted peer): without this they stayed open, in CLOSE_WAIT, until
    /// the next batch to that peer, which may never come (the soak saw both
    /// other engines hold 3-4 such sockets to a restarted one at the end,
    /// issue #23).
    pub fn prune_closed(&self) {
        let closed: Vec<Link> = {
            let mut idle = lock(&self.idle);
            let (closed, open) = std::mem::take(&mut *idle)
                .into_iter()
                .partition(|l| l.conn.peer_closed());
            *idle = open;
            closed
        };
        drop(closed);
    }

    /// Deliver a notification over one pooled connection.
    pub async fn notify(
        &self,
        inner: &Inner,
        peer: &str,
        note: &[u8],
    ) -> Result<(), TransferError> {
        let mut conns = self.checkout(inner, peer, 1).await?;
        let mut c = conns.pop().ok_or_else(|| TransferError::Connection {
            peer: peer.into(),
            reason: "no connection".into(),
        })?;
        client::notify(inner, peer, &mut c, note).await?;
        self.put_back(vec![c], false, inner.config.connections_per_peer);
        Ok(())
    }

    /// Run a batch over as many connections as it has slices (at most
    /// `connections_per_peer`).
    async fn run_uncounted(
        &self,
        inner: &Arc<Inner>,
        peer: &str,
        ops: Vec<PreparedOp>,
    ) -> Vec<OpResult> {
        let n = ops.len();
        let want = connections_for(
            &ops,
            inner.config.slice_bytes as u64,
            inner.config.connections_per_peer,
        );
        let conns = match self.checkout(inner, peer, want).await {
            Ok(c) => c,
            Err(e) => return vec![Err(e); n],
        };
        let (results, healthy) = client::run_batch(inner, peer, ops, conns).await;
        let one_broke = healthy.len() < want;
        self.put_back(healthy, one_broke, inner.config.connections_per_peer);
        results
    }
}

impl BatchTransport for TcpPeer {
    async fn run_batch(
        &self,
        inner: &Arc<Inner>,
        peer: &str,
        ops: Vec<PreparedOp>,
    ) -> Vec<Option<OpResult>> {
        let flows: Vec<_> = ops.iter().map(|p| (p.op.kind, p.op.len)).collect();
        let results = self.run_uncounted(inner, peer, ops).await;
        for ((kind, len), r) in flows.into_iter().zip(&results) {
            match r {
                Ok(()) => inner
                    .metrics
                    .op_done(TransportLabel::Tcp, DirectionLabel::of(kind), len),
                Err(_) => inner.metrics.op_failed(TransportLabel::Tcp),
            }
        }
        results.into_iter().map(Some).collect()
    }
}
