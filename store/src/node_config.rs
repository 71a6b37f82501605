//! `NodeConfig`: everything a single node's store is told at start.
//!
//! The `kvfabric` binary resolves it with figment (defaults < file `[node]` <
//! env < flags) and hands it to [`crate::NodeServer::open`] or [`crate::Store::open`].
//! Sizes accept human strings ("8GiB"); unknown keys are refused so a typo in
//! a config file is an error, not a silently ignored setting.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

use crate::{AdaptiveMode, BadConfig, StoreError};

/// When a block stored in RAM also goes to disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum WritePolicy {
    /// Written to disk only when evicted from RAM (demotion).
    #[default]
    WriteBack,
    /// Written to disk at put time as well as to RAM.
    WriteThrough,
}

/// Which blocks the disk tier accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DiskAdmission {
    /// Every block written to disk is accepted.
    #[default]
    All,
    /// Only blocks accessed at least twice (put + a read, or seen again after an eviction).
    SeenTwice,
}

/// Whether the disk tier stores blocks compressed (`kvfabric-codec`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DiskCompression {
    /// Compressed when that spares at least one 4 KiB disk unit, else raw.
    #[default]
    Auto,
    /// Always raw.
    Off,
}

/// Where the VRAM tier checks a block promoted from RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum VramVerify {
    /// The GPU hashes the bytes as they landed in VRAM (XXH3 kernels), so
    /// the CPU does not read the RAM copy beside the DMA; blocks of 240
    /// bytes or fewer, and hosts where NVRTC is missing, fall back to `host`.
    #[default]
    Device,
    /// The CPU hashes the RAM copy while its DMA runs.
    Host,
}

/// Order in which a tier picks the blocks it drops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum EvictionPolicy {
    /// LIRS: blocks reused within the protected blocks' reuse distance stay;
    /// the rest pass through a small queue (loop- and scan-resistant; see
    /// `policy::lirs`).
    Lirs,
    /// LIRS, LRU or door, whichever leads on the tier's recent lookups
    /// (three metadata-only shadow caches; see `policy::adaptive`).
    #[default]
    Adaptive,
    /// Least recently used first.
    Lru,
    /// S3-FIFO: small probationary FIFO, main FIFO with reinsertion, ghost queue.
    S3fifo,
    /// LRU behind a doorkeeper: blocks put for the first time are evicted
    /// first (see `policy::door`).
    Door,
}

/// Configuration of one node's store (`[node]` section).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Id of this node in stats and holders. Default: "node-0".
    pub node_id: String,
    /// gRPC CacheService listen address. Default: 127.0.0.1:50051.
    pub grpc_listen: SocketAddr,
    /// HTTP listen address for GET /metrics and GET /health. Default: 127.0.0.1:9464.
    pub http_listen: SocketAddr,
    /// Size of the RAM tier arena, allocated and backed by pages at start
    /// (resident from then on). Default: 1GiB.
    pub ram_capacity: ByteSize,
    /// Bytes of GPU memory of the VRAM tier (feature `cuda`; `vram::VramTier`),
    /// allocated at open; 0 = no VRAM tier. Default: 0.
    pub vram_capacity: ByteSize,
    /// CUDA device ordinal of the VRAM tier. Default: 0.
    pub vram_device: u32,
    /// Pinned host slices of the VRAM tier's staging pool. Default: 64.
    pub vram_staging_slots: u32,
    /// Bytes of one staging slice (a block moves in slices of this size,
    /// the next one's DMA overlapping this one's copy). Default: 512KiB.
    pub vram_staging_slice: ByteSize,
    /// Slices one copy uses at most (its pipeline depth). Default: 4.
    pub vram_staging_depth: u32,
    /// Where a promotion into VRAM is checked against the block's checksum.
    /// Default: device.
    pub vram_verify: VramVerify,
    /// Disk tier data file or raw block device; none = no disk tier. Default: none.
    pub disk_path: Option<PathBuf>,
    /// Directory of the disk tier's RocksDB index. Default: `<disk_path>.index`.
    pub disk_index_path: Option<PathBuf>,
    /// Bytes of the disk tier (the data file is preallocated to this). Default: 8GiB.
    pub disk_capacity: ByteSize,
    /// Write-back (default) or write-through from RAM to disk. Default: write-back.
    pub write_policy: WritePolicy,
    /// Disk admission policy: all or seen-twice. Default: all.
    pub disk_admission: DiskAdmission,
    /// Disk blocks compressed when it pays (auto) or never (off). Default: auto.
    pub disk_compression: DiskCompression,
    /// Eviction order of both tiers: adaptive, lirs, lru or s3fifo
    /// (adaptive runs LIRS on the disk tier). Default: adaptive.
    pub eviction: EvictionPolicy,
    /// lirs: percent of resident blocks kept as HIR (the probation queue). Default: 2.
    pub lirs_hir_percent: f64,
    /// lirs: evicted blocks remembered (ghosts), per resident block. Default: 24.
    pub lirs_history: u32,
    /// lirs: a protected block idle for this many times its last reuse
    /// interval is demoted (ended sessions, replaced prompts); 0 = never. Default: 1.2.
    pub lirs_idle_factor: f64,
    /// adaptive: tiers' worth of looked-up keys the LIRS-vs-LRU score remembers. Default: 2.
    pub adaptive_window: f64,
    /// adaptive: lead (in shadow hits, times the tier's blocks) the other
    /// order needs to take over. Default: 0.04.
    pub adaptive_margin: f64,
    /// adaptive: the other order also takes over once its lead passes this
    /// many standard deviations of the lead were the two orders even (a
    /// sign-flip test on the per-lookup hit differences); 0 = the margin
    /// alone. Default: 0.
    pub adaptive_confidence: f64,
    /// adaptive: the order the RAM tier evicts by until the shadows decide. Default: lru.
    pub adaptive_start: AdaptiveMode,
    /// adaptive on a cluster node: the shadows replay the cluster's lookups
    /// and puts of the keys this node's directory shard owns (true), or
    /// this node's own lookups and puts (false). Default: true.
    pub adaptive_cluster_feed: bool,
    /// adaptive: fraction of keys the shadow caches see (0, 1]. Default: 1.
    pub adaptive_sample_rate: f64,
    /// Capacity planner: fraction of block keys sampled (SHARDS) for the
    /// miss-ratio curves of GET /api/v1/capacity; 0 = off. Default: 0.01.
    pub planner_sample_rate: f64,
    /// Fraction of a tier's capacity above which eviction starts. Default: 0.95.
    pub high_watermark: f64,
    /// Fraction of a tier's capacity eviction brings usage down to. Default: 0.85.
    pub low_watermark: f64,
    /// Largest block accepted by put. Default: 64MiB.
    pub max_block_size: ByteSize,
    /// A reservation not committed within this many milliseconds is reclaimed. Default: 30000.
    pub reservation_timeout_ms: u64,
    /// Tenants file for the gRPC CacheService (API keys in `authorization`
    /// metadata, keys scoped per tenant; docs/SECURITY.md). None:
    /// single-tenant mode (logged at start). Default: none.
    pub tenants_file: Option<PathBuf>,
    /// How often the tenants file is re-read. Default: 1000 ms.
    pub tenants_reload_ms: u64,
    /// Interval of the console's history ring (the plots at `/`). Default: 5000 ms.
    pub console_interval_ms: u64,
    /// Samples the console's history ring keeps (720 x 5 s = one hour). Default: 720.
    pub console_history_samples: u32,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            node_id: "node-0".into(),
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            ram_capacity: ByteSize::gib(1),
            vram_capacity: ByteSize::b(0),
            vram_device: 0,
            vram_staging_slots: 64,
            vram_staging_slice: ByteSize::kib(512),
            vram_staging_depth: 4,
            vram_verify: VramVerify::Device,
            disk_path: None,
            disk_index_path: None,
            disk_capacity: ByteSize::gib(8),
            write_policy: WritePolicy::WriteBack,
            disk_admission: DiskAdmission::All,
            disk_compression: DiskCompression::Auto,
            eviction: EvictionPolicy::Adaptive,
            lirs_hir_percent: 2.0,
            lirs_history: 24,
            lirs_idle_factor: 1.2,
            adaptive_window: 2.0,
            adaptive_margin: 0.04,
            adaptive_confidence: 0.0,
            adaptive_start: AdaptiveMode::Lru,
            adaptive_cluster_feed: true,
            adaptive_sample_rate: 1.0,
            planner_sample_rate: 0.01,
            high_watermark: 0.95,
            low_watermark: 0.85,
            max_block_size: ByteSize::mib(64),
            reservation_timeout_ms: 30_000,
            tenants_file: None,
            tenants_reload_ms: 1000,
            console_interval_ms: 5000,
            console_history_samples: 720,
        }
    }
}

impl NodeConfig {
    /// The VRAM tier's keys: its staging must be able to move a block, and
    /// a capacity needs a build with the `cuda` feature.
    fn validate_vram(&self) -> Result<(), StoreError> {
        let bad = |b: BadConfig| Err(StoreError::Config(b));
        if self.vram_capacity.as_u64() == 0 {
            return Ok(());
        }
        if !cfg!(feature = "cuda") {
            return bad(BadConfig::NoCudaBuild);
        }
        if self.vram_staging_slots == 0 || self.vram_staging_depth == 0 {
            return bad(BadConfig::Zero {
                key: "vram_staging_slots / vram_staging_depth",
            });
        }
        if self.vram_staging_slice.as_u64() < 4096 {
            return bad(BadConfig::CapacityBelowPage {
                key: "vram_staging_slice",
                value: self.vram_staging_slice.to_string(),
            });
        }
        Ok(())
    }

    /// Refuse settings that cannot work.
    pub fn validate(&self) -> Result<(), StoreError> {
        let bad = |b: BadConfig| Err(StoreError::Config(b));
        if self.node_id.is_empty() {
            return bad(BadConfig::Empty { key: "node_id" });
        }
        if self.ram_capacity.as_u64() < 4096 {
            return bad(BadConfig::CapacityBelowPage {
                key: "ram_capacity",
                value: self.ram_capacity.to_string(),
            });
        }
        self.validate_vram()?;
        if !(self.low_watermark > 0.0
            && self.low_watermark <= self.high_watermark
            && self.high_watermark <= 1.0)
        {
            return bad(BadConfig::Watermarks {
                low: self.low_watermark,
                high: self.high_watermark,
            });
        }
        if !(self.lirs_hir_percent > 0.0 && self.lirs_hir_percent <= 50.0) {
            return bad(BadConfig::OutOfRange {
                key: "lirs_hir_percent",
                must: "in (0, 50]",
                got: self.lirs_hir_percent,
            });
        }
        if !(self.lirs_idle_factor >= 0.0 && self.lirs_idle_factor.is_finite()) {
            return bad(BadConfig::OutOfRange {
                key: "lirs_idle_factor",
                must: ">= 0",
                got: self.lirs_idle_factor,
            });
        }
        if !(self.adaptive_window > 0.0 && self.adaptive_window.is_finite()) {
            return bad(BadConfig::OutOfRange {
                key: "adaptive_window",
                must: "> 0",
                got: self.adaptive_window,
            });
        }
        if !(self.adaptive_margin >= 0.0 && self.adaptive_margin.is_finite()) {
            return bad(BadConfig::OutOfRange {
                key: "adaptive_margin",
                must: ">= 0",
                got: self.adaptive_margin,
            });
        }
        if !(self.adaptive_confidence >= 0.0 && self.adaptive_confidence.is_finite()) {
            return bad(BadConfig::OutOfRange {
                key: "adaptive_confidence",
                must: ">= 0",
                got: self.adaptive_confidence,
            });
        }
        if !(self.adaptive_sample_rate > 0.0 && self.adaptive_sample_rate <= 1.0) {
            return bad(BadConfig::OutOfRange {
                key: "adaptive_sample_rate",
                must: "in (0, 1]",
                got: self.adaptive_sample_rate,
            });
        }
        if !(0.0..=1.0).contains(&self.planner_sample_rate) {
            return bad(BadConfig::OutOfRange {
                key: "planner_sample_rate",
                must: "in [0, 1]",
                got: self.planner_sample_rate,
            });
        }
        if self.max_block_size.as_u64() == 0 {
            return bad(BadConfig::Zero {
                key: "max_block_size",
            });
        }
        if self.disk_path.is_some() && self.disk_capacity.as_u64() < self.max_block_size.as_u64() {
            return bad(BadConfig::DiskBelowBlock {
                disk_capacity: self.disk_capacity.to_string(),
                max_block_size: self.max_block_size.to_string(),
            });
        }
        if self.reservation_timeout_ms == 0 {
            return bad(BadConfig::Zero {
                key: "reservation_timeout_ms",
            });
        }
        Ok(())
    }

    /// The reservation timeout as a duration.
    pub fn reservation_timeout(&self) -> Duration {
        Duration::from_millis(self.reservation_timeout_ms)
    }

    /// Where the disk index lives, when there is a disk tier.
    pub fn index_path(&self) -> Option<PathBuf> {
        self.disk_index_path.clone().or_else(|| {
            self.disk_path.as_ref().map(|p| {
                let mut s = p.clone().into_os_string();
                s.push(".index");
                PathBuf::from(s)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_roundtrip_and_human_sizes() {
        let d = NodeConfig::default();
        d.validate().unwrap();
        let json = serde_json::to_string(&d).unwrap();
        let back: NodeConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, d);
        let c: NodeConfig = serde_json::from_str(
            r#"{"ram_capacity":"8GiB","eviction":"s3fifo","write_policy":"write-through",
                "disk_admission":"seen-twice","disk_path":"/tmp/x"}"#,
        )
        .unwrap();
        assert_eq!(c.ram_capacity, ByteSize::gib(8));
        assert_eq!(c.eviction, EvictionPolicy::S3fifo);
        assert_eq!(c.write_policy, WritePolicy::WriteThrough);
        assert_eq!(c.disk_admission, DiskAdmission::SeenTwice);
        assert_eq!(c.index_path().unwrap(), PathBuf::from("/tmp/x.index"));
    }

    #[test]
    fn unknown_fields_and_bad_watermarks_are_refused() {
        assert!(serde_json::from_str::<NodeConfig>(r#"{"ram_capcity":"1GiB"}"#).is_err());
        let c = NodeConfig {
            low_watermark: 0.9,
            high_watermark: 0.5,
            ..Default::default()
        };
        assert!(c.validate().is_err());
        for bad in [0.0, 60.0, f64::NAN] {
            let c = NodeConfig {
                lirs_hir_percent: bad,
                ..Default::default()
            };
            assert!(c.validate().is_err(), "{bad}");
            let c = NodeConfig {
                lirs_idle_factor: bad - 61.0,
                ..Default::default()
            };
            assert!(c.validate().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_vram_tier_needs_the_cuda_build_and_staging_that_can_move_a_block() {
        let c: NodeConfig = serde_json::from_str(
            r#"{"vram_capacity":"64MiB","vram_device":1,"vram_staging_slice":"1MiB"}"#,
        )
        .unwrap();
        assert_eq!(c.vram_capacity, ByteSize::mib(64));
        assert_eq!(c.vram_device, 1);
        let out = c.validate();
        if cfg!(feature = "cuda") {
            out.unwrap();
        } else {
            assert!(
                matches!(out, Err(StoreError::Config(BadConfig::NoCudaBuild))),
                "{out:?}"
            );
        }
        let bad = [
            NodeConfig {
                vram_staging_slice: ByteSize::kib(1),
                ..c.clone()
            },
            NodeConfig {
                vram_staging_slots: 0,
                ..c.clone()
            },
            NodeConfig {
                vram_staging_depth: 0,
                ..c.clone()
            },
        ];
        for b in bad {
            assert!(b.validate().is_err(), "{b:?}");
        }
    }
}
