//! Prometheus metrics of the transfer engine: bytes and ops per transport and
//! direction, errors, ops in flight, links opened. Registered into the registry the node
//! passes in (no global singletons).

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::op::OpKind;

/// Transport label.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum TransportLabel {
    Tcp,
    Shm,
    Rdma,
}

/// Direction label: ops this node initiated (read/write) or served for a peer.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum DirectionLabel {
    Read,
    Write,
    ServedRead,
    ServedWrite,
}

impl DirectionLabel {
    /// The direction of an op this node initiated.
    pub fn of(kind: OpKind) -> Self {
        match kind {
            OpKind::Read => DirectionLabel::Read,
            OpKind::Write => DirectionLabel::Write,
        }
    }
}

/// Labels of the per-transport counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FlowLabels {
    pub transport: TransportLabel,
    pub direction: DirectionLabel,
}

/// Labels of the per-transport counters without a direction (errors, links).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransportLabels {
    pub transport: TransportLabel,
}

/// Labels of the wire-compression counters: `Read` (replies this node
/// received) or `ServedRead` (replies it sent).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WireLabels {
    pub direction: DirectionLabel,
}

/// Encoded READ slices one way ([`TransferMetrics::wire_totals`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireFlow {
    /// Their bytes on the wire.
    pub wire_bytes: u64,
    /// The bytes they stand for.
    pub raw_bytes: u64,
    pub slices: u64,
}

/// Encoded READ slices this node received (`read`) and sent (`served`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireTotals {
    pub read: WireFlow,
    pub served: WireFlow,
}

/// Labels of a per-peer series (the peer's transfer address).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabels {
    pub peer: String,
}

/// The engine's metric handles (cheap to clone: all are shared atomics).
#[derive(Debug, Clone, Default)]
pub struct TransferMetrics {
    pub bytes: Family<FlowLabels, Counter>,
    pub ops: Family<FlowLabels, Counter>,
    pub errors: Family<TransportLabels, Counter>,
    /// Links this engine opened to peers: tcp connections, shm sockets, rdma
    /// queue pairs. A pool that works keeps this flat under steady load.
    pub links_opened: Family<TransportLabels, Counter>,
    pub in_flight_ops: Gauge,
    /// Incoming connections refused before any op (no, a wrong or an
    /// unverifiable certificate; a bad hello).
    pub handshakes_refused: Counter,
    /// READ slices carried encoded with the block codec (tcp): their bytes
    /// on the wire, the bytes they stand for, and how many.
    pub wire_encoded_bytes: Family<WireLabels, Counter>,
    pub wire_raw_bytes: Family<WireLabels, Counter>,
    pub wire_encoded_slices: Family<WireLabels, Counter>,
    /// Per peer: 1 while its READs are asked for encoded (`auto` chose it,
    /// or `always`), 0 while raw.
    pub wire_compressing: Family<PeerLabels, Gauge>,
}

impl TransferMetrics {
    /// Create the metrics and register them under `kvfabric_transfer_*`.
    /// Every transport x direction series exists from the start, at 0: a
    /// family with no series is left out of `/metrics`, and dashboards and
    /// alerts (`rate(kvfabric_transfer_bytes_total[5m])`) need the series to
    /// exist before the first transfer.
    pub fn register(registry: &mut Registry) -> Self {
        let m = TransferMetrics::default();
        for transport in [
            TransportLabel::Tcp,
            TransportLabel::Shm,
            TransportLabel::Rdma,
        ] {
            for direction in [
                DirectionLabel::Read,
                DirectionLabel::Write,
                DirectionLabel::ServedRead,
                DirectionLabel::ServedWrite,
            ] {
                let l = FlowLabels {
                    transport,
                    direction,
                };
                let _ = m.bytes.get_or_create(&l);
                let _ = m.ops.get_or_create(&l);
            }
            let _ = m.errors.get_or_create(&TransportLabels { transport });
            let _ = m.links_opened.get_or_create(&TransportLabels { transport });
        }
        for direction in [DirectionLabel::Read, DirectionLabel::ServedRead] {
            let l = WireLabels { direction };
            let _ = m.wire_encoded_bytes.get_or_create(&l);
            let _ = m.wire_raw_bytes.get_or_create(&l);
            let _ = m.wire_encoded_slices.get_or_create(&l);
        }
        let sub = registry.sub_registry_with_prefix("kvfabric_transfer");
        sub.register(
            "bytes",
            "Bytes moved, per transport and direction",
            m.bytes.clone(),
        );
        sub.register(
            "ops",
            "Ops completed successfully, per transport and direction",
            m.ops.clone(),
        );
        sub.register("errors", "Ops failed, per transport", m.errors.clone());
        sub.register(
            "links_opened",
            "Links opened to peers (tcp connections, shm sockets, rdma queue pairs), per transport",
            m.links_opened.clone(),
        );
        sub.register(
            "in_flight_ops",
            "Ops submitted and not yet completed",
            m.in_flight_ops.clone(),
        );
        sub.register(
            "handshakes_refused",
            "Incoming transfer connections refused at the handshake (certificate, hello)",
            m.handshakes_refused.clone(),
        );
        sub.register(
            "wire_encoded_bytes",
            "Bytes of READ slices sent encoded with the block codec (tcp), as they were on the wire",
            m.wire_encoded_bytes.clone(),
        );
        sub.register(
            "wire_raw_bytes",
            "Bytes the READ slices sent encoded (tcp) stand for, decoded",
            m.wire_raw_bytes.clone(),
        );
        sub.register(
            "wire_encoded_slices",
            "READ slices sent encoded with the block codec (tcp)",
            m.wire_encoded_slices.clone(),
        );
        sub.register(
            "wire_compressing",
            "Per peer: 1 while this node asks for its READ replies encoded, 0 while raw",
            m.wire_compressing.clone(),
        );
        m
    }

    /// Count one READ slice carried encoded: `wire` bytes standing for `raw`.
    pub fn wire_encoded(&self, direction: DirectionLabel, wire: u64, raw: u64) {
        let l = WireLabels { direction };
        self.wire_encoded_bytes.get_or_create(&l).inc_by(wire);
        self.wire_raw_bytes.get_or_create(&l).inc_by(raw);
        self.wire_encoded_slices.get_or_create(&l).inc();
    }

    /// The READ slices carried encoded so far, received and served.
    pub fn wire_totals(&self) -> WireTotals {
        let of = |direction| {
            let l = WireLabels { direction };
            let get = |f: &Family<WireLabels, Counter>| f.get(&l).map_or(0, |c| c.get());
            WireFlow {
                wire_bytes: get(&self.wire_encoded_bytes),
                raw_bytes: get(&self.wire_raw_bytes),
                slices: get(&self.wire_encoded_slices),
            }
        };
        WireTotals {
            read: of(DirectionLabel::Read),
            served: of(DirectionLabel::ServedRead),
        }
    }

    /// (bytes in, bytes out) over every transport so far: in = reads this
    /// node made plus writes peers made into it; out = the reverse.
    pub fn bytes_in_out(&self) -> (u64, u64) {
        let (mut bytes_in, mut bytes_out) = (0, 0);
        for transport in [
            TransportLabel::Tcp,
            TransportLabel::Shm,
            TransportLabel::Rdma,
        ] {
            for direction in [
                DirectionLabel::Read,
                DirectionLabel::Write,
                DirectionLabel::ServedRead,
                DirectionLabel::ServedWrite,
            ] {
                let l = FlowLabels {
                    transport,
                    direction,
                };
                // Peek without creating empty series.
                let Some(c) = self.bytes.get(&l) else {
                    continue;
                };
                let n = c.get();
                match direction {
                    DirectionLabel::Read | DirectionLabel::ServedWrite => bytes_in += n,
                    DirectionLabel::Write | DirectionLabel::ServedRead => bytes_out += n,
                }
            }
        }
        (bytes_in, bytes_out)
    }

    /// Count one incoming connection refused at its handshake.
    pub fn handshake_refused(&self) {
        self.handshakes_refused.inc();
    }

    /// Count one successful op of `bytes`.
    pub fn op_done(&self, transport: TransportLabel, direction: DirectionLabel, bytes: u64) {
        let l = FlowLabels {
            transport,
            direction,
        };
        self.bytes.get_or_create(&l).inc_by(bytes);
        self.ops.get_or_create(&l).inc();
    }

    /// Count one link opened to a peer.
    pub fn link_opened(&self, transport: TransportLabel) {
        self.links_opened
            .get_or_create(&TransportLabels { transport })
            .inc();
    }

    /// Count one failed op.
    pub fn op_failed(&self, transport: TransportLabel) {
        self.errors
            .get_or_create(&TransportLabels { transport })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_in_and_out_sum_the_directions_over_transports() {
        let m = TransferMetrics::register(&mut Registry::default());
        assert_eq!(m.bytes_in_out(), (0, 0));
        m.op_done(TransportLabel::Tcp, DirectionLabel::Read, 100);
        m.op_done(TransportLabel::Shm, DirectionLabel::ServedWrite, 10);
        m.op_done(TransportLabel::Tcp, DirectionLabel::ServedRead, 7);
        m.op_done(TransportLabel::Rdma, DirectionLabel::Write, 1);
        assert_eq!(m.bytes_in_out(), (110, 8));
    }
}
