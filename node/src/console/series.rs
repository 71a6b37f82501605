//! The series the console plots, read **by metric name** from the node's own
//! Prometheus text exposition through one table, [`SERIES`].
//!
//! The console never reaches into metric handles: it encodes the node's
//! registry (exactly what `/metrics` serves) and picks values by name and
//! labels. A renamed metric is a one-line change here, and whatever the
//! registry holds (store, transfer, an engine's series when they are
//! registered with the node) can be plotted. Each sample is derived from two
//! consecutive snapshots: ratios and rates over the interval, gauges as read,
//! histogram quantiles of the observations made in the interval.

use std::collections::HashMap;

/// Which lines of the exposition a source sums: metric `name` (as exposed,
/// e.g. with `_total`) and, for each listed label, one of its values.
#[derive(Clone, Copy, Debug)]
pub struct Sel {
    pub name: &'static str,
    pub labels: &'static [(&'static str, &'static [&'static str])],
}

const fn sel(name: &'static str) -> Sel {
    Sel { name, labels: &[] }
}

/// How a series' value is derived from two snapshots.
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// Δhit / (Δhit + Δmiss) over the interval; no value when both are 0.
    Ratio { hit: Sel, miss: Sel },
    /// Δpart / Δwhole over the interval; no value when Δwhole is 0.
    Share { part: Sel, whole: Sel },
    /// Δ(sum of `sels`) per second, times `scale`.
    Rate { sels: &'static [Sel], scale: f64 },
    /// The current value.
    Gauge(Sel),
    /// Quantile `q` of the histogram `name`'s observations in the interval.
    Quantile { name: &'static str, q: f64 },
}

/// One plotted series.
#[derive(Clone, Copy, Debug)]
pub struct Series {
    /// Stable id (API field and proto series name).
    pub name: &'static str,
    /// What the page titles it.
    pub title: &'static str,
    /// Unit the page labels its axis with.
    pub unit: &'static str,
    pub source: Source,
}

const GB: f64 = 1e-9;
const IN: &[(&str, &[&str])] = &[("direction", &["Read", "ServedWrite"])];
const OUT: &[(&str, &[&str])] = &[("direction", &["Write", "ServedRead"])];
const GET: &[(&str, &[&str])] = &[("op", &["Get"])];
const RAM: &[(&str, &[&str])] = &[("tier", &["Ram"])];
const DISK: &[(&str, &[&str])] = &[("tier", &["Disk"])];

/// The lookup hit ratio: hits over hits + misses of this node's lookups, in blocks
/// (the counters a cluster lookup keeps; the ratio `ctl status` shows).
pub const HIT_RATIO: Source = Source::Ratio {
    hit: sel("kvfabric_store_lookup_hit_blocks_total"),
    miss: sel("kvfabric_store_lookup_miss_blocks_total"),
};

/// Every series of the history ring, in the order the page draws them.
pub const SERIES: &[Series] = &[
    Series {
        name: "hit_ratio",
        title: "Lookup hit ratio",
        unit: "ratio",
        source: HIT_RATIO,
    },
    Series {
        // A cluster lookup keeps no per-request counter: blocks looked up
        // (found + not found) is what every node counts.
        name: "lookup_blocks_per_s",
        title: "Blocks looked up per second",
        unit: "1/s",
        source: Source::Rate {
            sels: &[
                sel("kvfabric_store_lookup_hit_blocks_total"),
                sel("kvfabric_store_lookup_miss_blocks_total"),
            ],
            scale: 1.0,
        },
    },
    Series {
        name: "loads_per_s",
        title: "Loads (gets) per second",
        unit: "1/s",
        source: Source::Rate {
            sels: &[Sel {
                name: "kvfabric_store_op_seconds_count",
                labels: GET,
            }],
            scale: 1.0,
        },
    },
    Series {
        name: "transfer_in_gbps",
        title: "Transfer in",
        unit: "GB/s",
        source: Source::Rate {
            sels: &[Sel {
                name: "kvfabric_transfer_bytes_total",
                labels: IN,
            }],
            scale: GB,
        },
    },
    Series {
        name: "transfer_out_gbps",
        title: "Transfer out",
        unit: "GB/s",
        source: Source::Rate {
            sels: &[Sel {
                name: "kvfabric_transfer_bytes_total",
                labels: OUT,
            }],
            scale: GB,
        },
    },
    Series {
        name: "evictions_per_s",
        title: "Evictions per second",
        unit: "1/s",
        source: Source::Rate {
            sels: &[sel("kvfabric_store_evictions_total")],
            scale: 1.0,
        },
    },
    Series {
        name: "promotions_per_s",
        title: "Promotions per second",
        unit: "1/s",
        source: Source::Rate {
            sels: &[sel("kvfabric_store_promotions_total")],
            scale: 1.0,
        },
    },
    Series {
        name: "demotions_per_s",
        title: "Demotions per second",
        unit: "1/s",
        source: Source::Rate {
            sels: &[sel("kvfabric_store_demotions_total")],
            scale: 1.0,
        },
    },
    Series {
        name: "checksum_failures_per_s",
        title: "Checksum failures per second",
        unit: "1/s",
        source: Source::Rate {
            sels: &[sel("kvfabric_store_checksum_failures_total")],
            scale: 1.0,
        },
    },
    Series {
        name: "ram_used_bytes",
        title: "RAM tier used",
        unit: "bytes",
        source: Source::Gauge(Sel {
            name: "kvfabric_store_used_bytes",
            labels: RAM,
        }),
    },
    Series {
        name: "disk_used_bytes",
        title: "Disk tier used",
        unit: "bytes",
        source: Source::Gauge(Sel {
            name: "kvfabric_store_used_bytes",
            labels: DISK,
        }),
    },
    Series {
        name: "ram_blocks",
        title: "RAM tier blocks",
        unit: "blocks",
        source: Source::Gauge(Sel {
            name: "kvfabric_store_blocks",
            labels: RAM,
        }),
    },
    Series {
        name: "disk_blocks",
        title: "Disk tier blocks",
        unit: "blocks",
        source: Source::Gauge(Sel {
            name: "kvfabric_store_blocks",
            labels: DISK,
        }),
    },
    Series {
        name: "ttft_p50_s",
        title: "Engine TTFT p50",
        unit: "s",
        source: Source::Quantile {
            name: "kvfabric_engine_time_to_first_token_seconds",
            q: 0.5,
        },
    },
    Series {
        name: "ttft_p90_s",
        title: "Engine TTFT p90",
        unit: "s",
        source: Source::Quantile {
            name: "kvfabric_engine_time_to_first_token_seconds",
            q: 0.9,
        },
    },
    Series {
        name: "prompt_cached_share",
        title: "Engine prompt tokens from cache",
        unit: "ratio",
        source: Source::Share {
            part: sel("kvfabric_engine_prefix_cache_hit_tokens_total"),
            whole: sel("kvfabric_engine_prompt_tokens_total"),
        },
    },
];

/// One parsed exposition line.
#[derive(Clone, Debug, PartialEq)]
struct Line {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// The exposition text of one moment, parsed.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    lines: Vec<Line>,
}

impl Snapshot {
    /// Parse Prometheus/OpenMetrics text; comments and malformed lines are skipped.
    pub fn parse(text: &str) -> Snapshot {
        let lines = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(parse_line)
            .collect();
        Snapshot { lines }
    }

    /// Sum of the lines `s` selects; None when none exists.
    pub fn sum(&self, s: &Sel) -> Option<f64> {
        let mut found = None;
        for l in self.lines.iter().filter(|l| l.name == s.name) {
            let matches = s.labels.iter().all(|(k, vs)| {
                l.labels
                    .iter()
                    .any(|(lk, lv)| lk == k && vs.contains(&lv.as_str()))
            });
            if matches {
                *found.get_or_insert(0.0) += l.value;
            }
        }
        found
    }

    /// Cumulative bucket counts of histogram `name` by upper bound (all other labels summed).
    fn buckets(&self, name: &str) -> Vec<(f64, f64)> {
        let bucket = format!("{name}_bucket");
        let mut by_le: HashMap<u64, (f64, f64)> = HashMap::new();
        for l in self.lines.iter().filter(|l| l.name == bucket) {
            let Some((_, le)) = l.labels.iter().find(|(k, _)| k == "le") else {
                continue;
            };
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                match le.parse::<f64>() {
                    Ok(v) => v,
                    Err(_) => continue,
                }
            };
            by_le.entry(le.to_bits()).or_insert((le, 0.0)).1 += l.value;
        }
        let mut v: Vec<(f64, f64)> = by_le.into_values().collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    }
}

fn parse_line(line: &str) -> Option<Line> {
    let (head, rest) = match line.find('{') {
        Some(i) => {
            let close = line[i..].find('}')? + i;
            (&line[..i], Some((&line[i + 1..close], &line[close + 1..])))
        }
        None => (line.split_whitespace().next()?, None),
    };
    let (labels, value_part) = match rest {
        Some((labels, after)) => (parse_labels(labels), after),
        None => (Vec::new(), &line[head.len()..]),
    };
    let value = value_part.split_whitespace().next()?.parse::<f64>().ok()?;
    Some(Line {
        name: head.to_string(),
        labels,
        value,
    })
}

fn parse_labels(s: &str) -> Vec<(String, String)> {
    s.split("\",")
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((
                k.trim().to_string(),
                v.trim_matches(|c| c == '"').to_string(),
            ))
        })
        .collect()
}

/// The value of `source` between snapshots `prev` and `now`, `dt_s` apart.
/// None where there is nothing to show (no lookups in the interval, no such metric).
pub fn value(source: &Source, prev: &Snapshot, now: &Snapshot, dt_s: f64) -> Option<f64> {
    let delta = |s: &Sel| -> Option<f64> {
        let n = now.sum(s)?;
        Some((n - prev.sum(s).unwrap_or(0.0)).max(0.0))
    };
    match source {
        Source::Ratio { hit, miss } => {
            let (h, m) = (delta(hit)?, delta(miss).unwrap_or(0.0));
            (h + m > 0.0).then(|| h / (h + m))
        }
        Source::Share { part, whole } => {
            let (p, w) = (delta(part).unwrap_or(0.0), delta(whole)?);
            (w > 0.0).then(|| (p / w).min(1.0))
        }
        Source::Rate { sels, scale } => {
            let d = sels.iter().filter_map(&delta).reduce(|a, b| a + b)?;
            (dt_s > 0.0).then(|| d / dt_s * scale)
        }
        Source::Gauge(s) => now.sum(s),
        Source::Quantile { name, q } => {
            let before = prev.buckets(name);
            let after = now.buckets(name);
            let diff: Vec<(f64, f64)> = after
                .iter()
                .map(|(le, c)| {
                    let old = before
                        .iter()
                        .find(|(l, _)| l == le)
                        .map_or(0.0, |(_, c)| *c);
                    (*le, (c - old).max(0.0))
                })
                .collect();
            quantile(&diff, *q)
        }
    }
}

/// Prometheus' `histogram_quantile`: linear within the bucket holding rank q·n.
fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let span = count - lower.1;
            let frac = if span > 0.0 {
                (rank - lower.1) / span
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * frac);
        }
        lower = (le, count);
    }
    Some(lower.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP kvfabric_store_lookup_hit_blocks Blocks found.
# TYPE kvfabric_store_lookup_hit_blocks counter
kvfabric_store_lookup_hit_blocks_total 30
kvfabric_store_lookup_miss_blocks_total 10
kvfabric_store_used_bytes{tier="Ram"} 4096
kvfabric_store_used_bytes{tier="Disk"} 8192
kvfabric_transfer_bytes_total{transport="Tcp",direction="Read"} 2000000000
kvfabric_transfer_bytes_total{transport="Shm",direction="ServedWrite"} 1000000000
kvfabric_transfer_bytes_total{transport="Tcp",direction="ServedRead"} 5
kvfabric_engine_time_to_first_token_seconds_bucket{le="0.1"} 5
kvfabric_engine_time_to_first_token_seconds_bucket{le="0.2"} 10
kvfabric_engine_time_to_first_token_seconds_bucket{le="+Inf"} 10
# EOF
"#;

    #[test]
    fn selects_by_name_and_label_values() {
        let s = Snapshot::parse(TEXT);
        let ram = Sel {
            name: "kvfabric_store_used_bytes",
            labels: RAM,
        };
        assert_eq!(s.sum(&ram), Some(4096.0));
        let inbound = Sel {
            name: "kvfabric_transfer_bytes_total",
            labels: IN,
        };
        assert_eq!(s.sum(&inbound), Some(3e9));
        assert_eq!(s.sum(&sel("kvfabric_nothing")), None);
    }

    #[test]
    fn ratios_and_rates_are_over_the_interval() {
        let prev = Snapshot::parse(
            "kvfabric_store_lookup_hit_blocks_total 10\nkvfabric_store_lookup_miss_blocks_total 10\n",
        );
        let now = Snapshot::parse(TEXT);
        // Δhit 20, Δmiss 0: the interval's ratio is 1, not the cumulative 0.75.
        assert_eq!(value(&HIT_RATIO, &prev, &now, 1.0), Some(1.0));
        assert_eq!(
            value(&HIT_RATIO, &now, &now, 1.0),
            None,
            "no lookups: no value"
        );
        let rate = SERIES
            .iter()
            .find(|s| s.name == "transfer_in_gbps")
            .unwrap();
        assert_eq!(
            value(&rate.source, &Snapshot::default(), &now, 2.0),
            Some(1.5)
        );
    }

    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        let now = Snapshot::parse(TEXT);
        let p50 = SERIES.iter().find(|s| s.name == "ttft_p50_s").unwrap();
        let p90 = SERIES.iter().find(|s| s.name == "ttft_p90_s").unwrap();
        let zero = Snapshot::default();
        let v50 = value(&p50.source, &zero, &now, 1.0).unwrap();
        let v90 = value(&p90.source, &zero, &now, 1.0).unwrap();
        assert!((v50 - 0.1).abs() < 1e-9, "{v50}");
        assert!((v90 - 0.18).abs() < 1e-9, "{v90}");
        assert_eq!(value(&p50.source, &now, &now, 1.0), None);
    }

    #[test]
    fn every_series_name_is_unique() {
        let mut names: Vec<&str> = SERIES.iter().map(|s| s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), SERIES.len());
    }
}
