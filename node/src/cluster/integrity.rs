//! What the cluster refused because a holder could not vouch for a block's
//! bytes: announcements of other bytes than the key's recorded checksum
//! (the directory shard's side, `directory.rs`), and lease answers or reads
//! whose checksum is not the recorded one (the reader's side, `lease.rs`,
//! `read.rs`). Counted for operators; the block itself is then read from
//! another holder or recomputed.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// The node's integrity counters.
pub(crate) struct IntegrityCounters {
    /// Announcements this node's shard refused: another holder recorded
    /// other bytes for the key.
    pub conflicting_announces: Counter,
    /// Blocks a holder answered or served with other bytes than the
    /// directory recorded for the key.
    pub holder_mismatches: Counter,
}

impl IntegrityCounters {
    /// Zero, registered in `registry`.
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let c = IntegrityCounters {
            conflicting_announces: Counter::default(),
            holder_mismatches: Counter::default(),
        };
        registry.register(
            "kvfabric_directory_conflicting_announces",
            "Announcements refused because another holder recorded other bytes (checksum) for the key",
            c.conflicting_announces.clone(),
        );
        registry.register(
            "kvfabric_cluster_holder_mismatches",
            "Blocks a holder leased or served with other bytes than the key's recorded checksum",
            c.holder_mismatches.clone(),
        );
        c
    }
}
