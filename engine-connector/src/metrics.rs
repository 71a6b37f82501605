//! Connector counters: Prometheus series in the engine's registry, and the
//! same numbers as a plain struct for tests and benches. The series are the
//! implementation's (feature `fabric`); the snapshot is part of the interface.

#[cfg(feature = "fabric")]
use prometheus_client::metrics::{counter::Counter, gauge::Gauge, histogram::Histogram};
#[cfg(feature = "fabric")]
use prometheus_client::registry::Registry;

/// A snapshot of the connector's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectorStats {
    pub lookups: u64,
    /// Blocks lookups found in the fabric.
    pub lookup_hit_blocks: u64,
    /// Blocks loaded into the engine with a matching checksum.
    pub loaded_blocks: u64,
    /// Blocks a load could not deliver (miss, error, timeout, checksum): recomputed.
    pub load_failed_blocks: u64,
    /// Loads that streamed layer by layer (the engine computed while they arrived).
    pub streamed_loads: u64,
    /// Blocks copied from other nodes into this node ahead of admission.
    pub prefetched_blocks: u64,
    /// Blocks this connector stored in the fabric.
    pub saved_blocks: u64,
    /// Blocks not stored because the fabric already had them.
    pub save_skipped_blocks: u64,
    /// Blocks not saved because the save queue was full.
    pub save_dropped_blocks: u64,
    /// Blocks whose save failed.
    pub save_failed_blocks: u64,
    /// Saves queued or in progress now.
    pub pending_saves: u64,
    /// Loads finished (every block delivered or failed).
    pub loads: u64,
    /// Time those loads took, start to end, summed (microseconds): the
    /// measured load cost benches report (`load_ms`).
    pub load_micros: u64,
}

impl std::ops::Add for ConnectorStats {
    type Output = ConnectorStats;

    fn add(self, b: ConnectorStats) -> ConnectorStats {
        ConnectorStats {
            lookups: self.lookups + b.lookups,
            lookup_hit_blocks: self.lookup_hit_blocks + b.lookup_hit_blocks,
            loaded_blocks: self.loaded_blocks + b.loaded_blocks,
            load_failed_blocks: self.load_failed_blocks + b.load_failed_blocks,
            streamed_loads: self.streamed_loads + b.streamed_loads,
            prefetched_blocks: self.prefetched_blocks + b.prefetched_blocks,
            saved_blocks: self.saved_blocks + b.saved_blocks,
            save_skipped_blocks: self.save_skipped_blocks + b.save_skipped_blocks,
            save_dropped_blocks: self.save_dropped_blocks + b.save_dropped_blocks,
            save_failed_blocks: self.save_failed_blocks + b.save_failed_blocks,
            pending_saves: self.pending_saves + b.pending_saves,
            loads: self.loads + b.loads,
            load_micros: self.load_micros + b.load_micros,
        }
    }
}

impl std::iter::Sum for ConnectorStats {
    fn sum<I: Iterator<Item = ConnectorStats>>(iter: I) -> ConnectorStats {
        iter.fold(ConnectorStats::default(), |a, b| a + b)
    }
}

/// The connector's Prometheus series.
#[cfg(feature = "fabric")]
#[derive(Clone, Debug)]
pub(crate) struct ConnectorMetrics {
    pub lookups: Counter,
    pub lookup_hit_blocks: Counter,
    pub loaded_blocks: Counter,
    pub load_failed_blocks: Counter,
    pub streamed_loads: Counter,
    pub prefetched_blocks: Counter,
    pub saved_blocks: Counter,
    pub save_skipped_blocks: Counter,
    pub save_dropped_blocks: Counter,
    pub save_failed_blocks: Counter,
    pub pending_saves: Gauge,
    pub load_seconds: Histogram,
    /// `load_seconds`' count and sum for [`ConnectorStats`] (the histogram
    /// does not hand them back).
    pub loads: Counter,
    pub load_micros: Counter,
}

#[cfg(feature = "fabric")]
impl ConnectorMetrics {
    pub fn new() -> ConnectorMetrics {
        ConnectorMetrics {
            lookups: Counter::default(),
            lookup_hit_blocks: Counter::default(),
            loaded_blocks: Counter::default(),
            load_failed_blocks: Counter::default(),
            streamed_loads: Counter::default(),
            prefetched_blocks: Counter::default(),
            saved_blocks: Counter::default(),
            save_skipped_blocks: Counter::default(),
            save_dropped_blocks: Counter::default(),
            save_failed_blocks: Counter::default(),
            pending_saves: Gauge::default(),
            load_seconds: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.0005, 2.0, 14),
            ),
            loads: Counter::default(),
            load_micros: Counter::default(),
        }
    }

    /// Count one finished load that took `elapsed`.
    pub fn load_done(&self, elapsed: std::time::Duration) {
        self.load_seconds.observe(elapsed.as_secs_f64());
        self.loads.inc();
        self.load_micros.inc_by(elapsed.as_micros() as u64);
    }

    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("kvfabric_connector");
        r.register(
            "lookups",
            "Fabric lookups by the scheduler",
            self.lookups.clone(),
        );
        r.register(
            "lookup_hit_blocks",
            "Blocks lookups found in the fabric",
            self.lookup_hit_blocks.clone(),
        );
        r.register(
            "loaded_blocks",
            "Blocks loaded into the KV pool with a matching checksum",
            self.loaded_blocks.clone(),
        );
        r.register(
            "load_failed_blocks",
            "Blocks a load could not deliver (recomputed)",
            self.load_failed_blocks.clone(),
        );
        r.register(
            "streamed_loads",
            "Loads streamed layer by layer into the KV pool",
            self.streamed_loads.clone(),
        );
        r.register(
            "prefetched_blocks",
            "Blocks copied from other nodes into this node ahead of admission",
            self.prefetched_blocks.clone(),
        );
        r.register(
            "saved_blocks",
            "Blocks stored in the fabric",
            self.saved_blocks.clone(),
        );
        r.register(
            "save_skipped_blocks",
            "Blocks not stored because the fabric had them",
            self.save_skipped_blocks.clone(),
        );
        r.register(
            "save_dropped_blocks",
            "Blocks not saved because the save queue was full",
            self.save_dropped_blocks.clone(),
        );
        r.register(
            "save_failed_blocks",
            "Blocks whose save failed",
            self.save_failed_blocks.clone(),
        );
        r.register(
            "pending_saves",
            "Saves queued or in progress",
            self.pending_saves.clone(),
        );
        r.register(
            "load_seconds",
            "Time from start to end of one load",
            self.load_seconds.clone(),
        );
    }

    pub fn snapshot(&self) -> ConnectorStats {
        ConnectorStats {
            lookups: self.lookups.get(),
            lookup_hit_blocks: self.lookup_hit_blocks.get(),
            loaded_blocks: self.loaded_blocks.get(),
            load_failed_blocks: self.load_failed_blocks.get(),
            streamed_loads: self.streamed_loads.get(),
            prefetched_blocks: self.prefetched_blocks.get(),
            saved_blocks: self.saved_blocks.get(),
            save_skipped_blocks: self.save_skipped_blocks.get(),
            save_dropped_blocks: self.save_dropped_blocks.get(),
            save_failed_blocks: self.save_failed_blocks.get(),
            pending_saves: self.pending_saves.get().max(0) as u64,
            loads: self.loads.get(),
            load_micros: self.load_micros.get(),
        }
    }
}
