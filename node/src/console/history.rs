//! The node's history ring: one sample of every console series per interval
//! (default 5 s x 720 = one hour), kept in memory from the node's start so the
//! console's plots have data the moment the page opens, without Prometheus.
//! Bounded: the oldest sample is dropped when the ring is full.

use std::collections::VecDeque;

use kvfabric_proto::internal::v1::{History as HistoryPb, SeriesValues};

use super::series::{self, Snapshot, SERIES};

/// Samples of every [`SERIES`], oldest first.
pub struct History {
    interval_ms: u64,
    capacity: usize,
    unix_ms: VecDeque<u64>,
    /// One ring per series, each as long as `unix_ms`; NaN = no value.
    values: Vec<VecDeque<f64>>,
    /// The snapshot of the previous sample and when it was taken (Unix ms).
    prev: Option<(Snapshot, u64)>,
}

impl History {
    /// An empty ring of `capacity` samples taken every `interval_ms`.
    pub fn new(interval_ms: u64, capacity: usize) -> History {
        History {
            interval_ms,
            capacity: capacity.max(1),
            unix_ms: VecDeque::new(),
            values: SERIES.iter().map(|_| VecDeque::new()).collect(),
            prev: None,
        }
    }

    /// Add the sample of `now` (the exposition text parsed) taken at `unix_ms`.
    pub fn record(&mut self, now: Snapshot, unix_ms: u64) {
        let empty = Snapshot::default();
        let (prev, prev_ms) = match &self.prev {
            Some((s, t)) => (s, *t),
            None => (&empty, unix_ms),
        };
        let dt_s = unix_ms.saturating_sub(prev_ms) as f64 / 1000.0;
        let first = self.prev.is_none();
        for (ring, s) in self.values.iter_mut().zip(SERIES) {
            // The first sample has no interval: rates and ratios start at the second.
            let v = match s.source {
                series::Source::Gauge(_) => series::value(&s.source, prev, &now, dt_s),
                _ if first => None,
                _ => series::value(&s.source, prev, &now, dt_s),
            };
            ring.push_back(v.unwrap_or(f64::NAN));
            if ring.len() > self.capacity {
                ring.pop_front();
            }
        }
        self.unix_ms.push_back(unix_ms);
        if self.unix_ms.len() > self.capacity {
            self.unix_ms.pop_front();
        }
        self.prev = Some((now, unix_ms));
    }

    /// Number of samples held.
    pub fn len(&self) -> usize {
        self.unix_ms.len()
    }

    /// True before the first sample.
    pub fn is_empty(&self) -> bool {
        self.unix_ms.is_empty()
    }

    /// The ring as its wire message.
    pub fn to_pb(&self) -> HistoryPb {
        HistoryPb {
            interval_ms: self.interval_ms,
            unix_ms: self.unix_ms.iter().copied().collect(),
            series: SERIES
                .iter()
                .zip(&self.values)
                .map(|(s, v)| SeriesValues {
                    name: s.name.to_string(),
                    values: v.iter().copied().collect(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(hit: u64, miss: u64, ram: u64) -> Snapshot {
        Snapshot::parse(&format!(
            "kvfabric_store_lookup_hit_blocks_total {hit}\nkvfabric_store_lookup_miss_blocks_total {miss}\nkvfabric_store_used_bytes{{tier=\"Ram\"}} {ram}\n"
        ))
    }

    fn series<'a>(pb: &'a HistoryPb, name: &str) -> &'a [f64] {
        &pb.series.iter().find(|s| s.name == name).unwrap().values
    }

    #[test]
    fn ring_keeps_the_newest_capacity_samples() {
        let mut h = History::new(1000, 3);
        for i in 0..5u64 {
            h.record(text(i * 10, i * 10, i), 1000 * i);
        }
        let pb = h.to_pb();
        assert_eq!(pb.unix_ms, vec![2000, 3000, 4000]);
        assert_eq!(series(&pb, "ram_used_bytes"), &[2.0, 3.0, 4.0]);
        assert_eq!(series(&pb, "hit_ratio"), &[0.5, 0.5, 0.5]);
        assert!(pb.series.iter().all(|s| s.values.len() == 3));
    }

    #[test]
    fn first_sample_has_gauges_but_no_rates() {
        let mut h = History::new(1000, 10);
        h.record(text(5, 5, 7), 0);
        let pb = h.to_pb();
        assert_eq!(series(&pb, "ram_used_bytes"), &[7.0]);
        assert!(series(&pb, "hit_ratio")[0].is_nan());
        assert_eq!(h.len(), 1);
    }
}
