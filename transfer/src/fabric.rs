//! The transfer engine's handle ([`TransferEngine`]): registers segments,
//! hands out their metadata, and turns a batch of ops into per-op results —
//! the local side of every op is checked here (`crate::core`), then the ops
//! go to the transport selected for the peer (`crate::transport`).
//!
//! (Named `fabric` so as not to be confused with the LLM engine crate.)

use std::net::SocketAddr;
#[cfg(feature = "fault-injection")]
use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::sync::broadcast;

use crate::config::TransferConfig;
use crate::core::{Inner, OpResult};
use crate::error::BadInput;
use crate::hello::{boot_id, Hello};
use crate::metrics::TransferMetrics;
use crate::op::{BatchReport, Notification, TransferOp, MAX_NOTIFY_BYTES};
use crate::security::{Capability, CapabilityKey, GrantId, SecurityMode};
use crate::segment::{SegmentId, SegmentMeta, TransportKeys};
use crate::transport::{Listeners, Transport, Transports};
use crate::{SharedRegion, TransferError};

/// A running transfer engine. Dropping it stops its servers.
pub struct TransferEngine {
    inner: Arc<Inner>,
    local_addr: SocketAddr,
    transports: Transports,
}

impl TransferEngine {
    /// Bind the tcp listener and the shm socket, register metrics, and serve.
    pub async fn start(
        config: TransferConfig,
        registry: &mut Registry,
    ) -> Result<Self, TransferError> {
        if config.connections_per_peer == 0
            || config.idle_connections_per_peer == 0
            || config.slice_bytes == 0
        {
            return Err(TransferError::InvalidArgument(BadInput::NotPositive {
                keys: "connections_per_peer, idle_connections_per_peer and slice_bytes",
            }));
        }
        let listeners = Listeners::bind(&config.listen).await?;
        let local_addr = listeners.local_addr;
        let hello = Hello {
            pid: std::process::id(),
            boot_id: boot_id(),
            shm_socket: listeners.shm_socket.clone(),
            rdma: listeners.nic.present(),
            wire_codec: true,
        };
        let node = config
            .node_name
            .clone()
            .unwrap_or_else(|| local_addr.to_string());
        let metrics = TransferMetrics::register(registry);
        let caps = CapabilityKey::random()?;
        let inner = Arc::new(Inner::new(config, metrics, hello, node, caps));
        let transports = Transports::serve(inner.clone(), listeners);
        tracing::info!(addr = %local_addr, "transfer engine listening");
        Ok(TransferEngine {
            inner,
            local_addr,
            transports,
        })
    }

    /// The engine's metric handles (bytes and ops per transport and direction).
    pub fn metrics(&self) -> &TransferMetrics {
        &self.inner.metrics
    }

    /// The address peers reach this engine at.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Register a region; peers may then read and write inside it.
    pub fn register(&self, region: Arc<SharedRegion>) -> SegmentId {
        let id = self.inner.segments.register(region.clone());
        self.transports.nic().register(id, region);
        id
    }

    /// Unregister a segment: every later op naming it is refused.
    pub fn unregister(&self, id: SegmentId) -> Result<(), TransferError> {
        self.transports.nic().unregister(id);
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
        let hello = &self.inner.hello;
        Ok(SegmentMeta {
            node: self.inner.node.clone(),
            id,
            len: region.len() as u64,
            keys: TransportKeys {
                boot_id: hello.boot_id.clone(),
                pid: hello.pid,
                shm_socket: hello.shm_socket.clone(),
                rdma: self.transports.nic().key(id),
            },
        })
    }

    /// The security mode of this engine's connections.
    pub fn security_mode(&self) -> SecurityMode {
        self.inner
            .config
            .identity
            .as_ref()
            .map_or(SecurityMode::None, |i| i.mode)
    }

    /// A capability letting the peer `reader` (its node id) READ
    /// `segment[offset..offset+len]` of this engine for `ttl` or until
    /// [`Self::revoke_capability`]`(id)`; a holder hands it out with a lease.
    pub fn issue_capability(
        &self,
        id: u64,
        segment: SegmentId,
        offset: u64,
        len: u64,
        ttl: std::time::Duration,
        reader: &str,
    ) -> Capability {
        crate::core::lock(&self.inner.live_caps).insert(id);
        self.inner
            .caps
            .issue(id, segment.0, offset, len, ttl, reader)
    }

    /// End capability `id` before its expiry (its lease was released):
    /// every later READ showing it is refused.
    pub fn revoke_capability(&self, id: u64) {
        crate::core::lock(&self.inner.live_caps).remove(&id);
    }

    /// Let the peer `writer` (its node id) WRITE `segment[offset..offset+len]`
    /// for `ttl` (secured modes refuse every other remote WRITE).
    pub fn grant_write(
        &self,
        segment: SegmentId,
        offset: u64,
        len: u64,
        writer: &str,
        ttl: std::time::Duration,
    ) -> GrantId {
        self.inner.grants.grant(segment.0, offset, len, writer, ttl)
    }

    /// End a write grant early.
    pub fn revoke_write(&self, grant: GrantId) {
        self.inner.grants.revoke(grant);
    }

    /// Notifications delivered by peers (see [`Self::batch_then_notify`]).
    pub fn notifications(&self) -> broadcast::Receiver<Notification> {
        self.inner.notify_tx.subscribe()
    }

    /// The transport chosen for `peer`, once a batch has reached it.
    pub fn transport_for(&self, peer: &str) -> Option<Transport> {
        self.transports.chosen(peer)
    }

    /// Arm the next `count` checksummed payloads this engine sends (or copies,
    /// for shm) to be corrupted in flight. Fault injection for tests: only
    /// with the `fault-injection` feature, which the test kit enables.
    #[cfg(feature = "fault-injection")]
    pub fn inject_payload_corruption(&self, count: u32) {
        self.inner.corrupt.store(count, Ordering::Relaxed);
    }

    /// From now on, connections to `addr` must reach node `node_id`:
    /// secured, the peer's certificate must be that node's (its own DNS
    /// name verified in the handshake, its id compared), else every op to
    /// `addr` fails with `ConnectionFault::WrongNode`. Without a call, any
    /// node of the cluster may answer at `addr`.
    pub fn expect_node(&self, addr: &str, node_id: &str) {
        self.inner.expect_node(addr, node_id);
    }

    /// Run `ops` against the peer at `peer` (its transfer address). One result
    /// per op, in order; an op succeeds only if all of its bytes arrived (and
    /// matched their checksum when asked).
    pub async fn batch(&self, peer: &str, ops: Vec<TransferOp>) -> Vec<OpResult> {
        let n = ops.len() as i64;
        self.inner.metrics.in_flight_ops.inc_by(n);
        let (mut results, index, prepared) = self.inner.prepare_batch(ops);
        if !prepared.is_empty() {
            results.merge(index, self.transports.run(peer, prepared).await);
        }
        self.inner.metrics.in_flight_ops.dec_by(n);
        results.finish()
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
                BadInput::NotificationWithheld,
            ))
        };
        BatchReport { ops, notified }
    }

    /// Send a notification to a peer.
    pub async fn notify(&self, peer: &str, note: &[u8]) -> Result<(), TransferError> {
        if note.len() as u64 > MAX_NOTIFY_BYTES {
            return Err(TransferError::InvalidArgument(
                BadInput::NotificationTooLarge {
                    len: note.len() as u64,
                    max: MAX_NOTIFY_BYTES,
                },
            ));
        }
        self.transports.notify(peer, note).await
    }

    /// Stop serving; in-flight served requests are cut off.
    pub fn shutdown(self) {}
}
