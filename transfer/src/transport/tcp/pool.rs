//! The tcp links to one peer: a pool of idle connections that each batch
//! checks connections out of (opening what is missing) and returns the
//! healthy ones to, so concurrent batches to one peer run in parallel.
//!
//! Idle connections are kept within [`IdleLimits`] (a cap and an idle
//! timeout, `transport/idle.rs` says why both). The peer's wire-compression
//! state lives here too: each batch is planned from it and measured into it.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::choice::{PeerWire, Sample};
use super::client;
use super::conn::{revoked, Link};
use super::wire::CodecSpeeds;
use crate::core::{connections_for, lock, Inner, OpResult, PreparedOp};
use crate::error::ConnectionFault;
use crate::metrics::{DirectionLabel, TransportLabel};
use crate::transport::contract::BatchTransport;
use crate::transport::idle::{Idle, IdleLimits};
use crate::TransferError;

/// The idle tcp connections to one peer, and whether its READs go encoded.
pub(crate) struct TcpPeer {
    idle: Mutex<Idle<Link>>,
    wire: PeerWire,
    /// The engine's codec speeds (shared by every peer).
    speeds: Arc<CodecSpeeds>,
}

impl TcpPeer {
    /// No connections yet; the codec's speeds are the engine's.
    pub fn new(speeds: Arc<CodecSpeeds>) -> Self {
        TcpPeer {
            idle: Mutex::default(),
            wire: PeerWire::default(),
            speeds,
        }
    }

    /// Take `want` connections from the pool, opening what is missing.
    pub async fn checkout(
        &self,
        inner: &Inner,
        peer: &str,
        want: usize,
    ) -> Result<Vec<Link>, TransferError> {
        let limits = IdleLimits::of(&inner.config);
        let (mut conns, expired) = lock(&self.idle).take(want, limits, Instant::now());
        drop(expired); // closed outside the lock
                       // Links that reached another node than the one meant now are closed.
        conns.retain(|c| inner.reaches_expected(peer, c.peer_id.as_deref()));
        // Links whose peer's certificate was revoked since are closed.
        conns.retain(|c| !c.peer_cert.as_deref().is_some_and(|d| revoked(inner, d)));
        while conns.len() < want {
            let (c, _) = client::connect(inner, peer).await?;
            conns.push(c);
        }
        Ok(conns)
    }

    /// Return healthy connections (within `limits`; the rest are closed);
    /// when one of the batch broke, the idle ones are closed too (the peer
    /// may have restarted).
    pub fn put_back(&self, healthy: Vec<Link>, one_broke: bool, limits: IdleLimits) {
        let closed: Vec<Link> = {
            let mut idle = lock(&self.idle);
            let mut closed = if one_broke { idle.clear() } else { Vec::new() };
            closed.extend(idle.put_back(healthy, limits, Instant::now()));
            closed
        };
        // Closed outside the lock.
        drop(closed);
    }

    /// Close the idle connections the peer has closed (a killed or
    /// restarted peer) and those idle past `limits`: without this they
    /// stay open, in CLOSE_WAIT, until the next batch to that peer, which
    /// may never come (in the soak both other engines would hold 3-4 such
    /// sockets to a restarted one at the end).
    pub fn sweep(&self, limits: IdleLimits, now: Instant) {
        let closed = lock(&self.idle).sweep(limits, now, |l| l.conn.peer_closed());
        // Closed outside the lock.
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
        let mut c = conns.pop().ok_or_else(|| {
            TransferError::connection(peer, ConnectionFault::NoLink { transport: "tcp" })
        })?;
        client::notify(inner, peer, &mut c, note).await?;
        self.put_back(vec![c], false, IdleLimits::of(&inner.config));
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
        let cfg = &inner.config;
        let plan = self.wire.plan(
            cfg.wire_compression,
            &self.speeds,
            &ops,
            cfg.slice_bytes.max(4096) as u64,
            peer,
            &inner.metrics,
        );
        let conns = match self.checkout(inner, peer, want).await {
            Ok(c) => c,
            Err(e) => return vec![Err(e); n],
        };
        let started = Instant::now();
        let (results, healthy, wire) = client::run_batch(inner, peer, ops, conns, plan).await;
        let elapsed = started.elapsed();
        let one_broke = healthy.len() < want;
        self.put_back(healthy, one_broke, IdleLimits::of(&inner.config));
        if !one_broke {
            self.wire.observe(Sample {
                wire: wire.wire,
                raw: wire.raw,
                encoded: wire.encoded_slices > 0,
                elapsed,
            });
            let (raw, sent) = (wire.asked_raw, wire.asked_wire);
            let decode = wire.decode_time;
            self.speeds
                .observe(plan.width, raw, sent, wire.decoded, decode);
        }
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
