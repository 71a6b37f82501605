//! `StoreMetrics`: the store's Prometheus metrics, registered into a registry
//! handle the caller owns (no global singletons).
//!
//! Counters are the source of truth for the Stats RPC too, so `/metrics` and
//! Stats never disagree. Per-tier gauges (capacity, used, blocks) are set from
//! the store's state right before each scrape and each Stats call.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// A tier, as a metric label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum TierName {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the VRAM tier's
    Vram,
    Ram,
    Disk,
}

/// Label set `{tier=...}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabel {
    pub tier: TierName,
}

/// Label set `{tenant=...,tier=...}` (the tenant is a tiers' share owner:
/// a tenant's name, `shared:<name>`, or `default` for blocks of nobody).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantTierLabel {
    pub tenant: String,
    pub tier: TierName,
}

/// A counter per tier (hits, misses, evictions, ...).
pub type TierCounter = Family<TierLabel, Counter>;

/// An operation, as a metric label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum OpName {
    Put,
    Get,
    Lookup,
    Exists,
    Remove,
    DiskRead,
    DiskWrite,
}

/// Label set `{op=...}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: OpName,
}

fn latency_histogram() -> Histogram {
    // 10 µs .. ~20 s.
    Histogram::new(exponential_buckets(1e-5, 2.0, 22))
}

/// Every metric of one node's store.
#[derive(Clone)]
pub struct StoreMetrics {
    pub capacity_bytes: Family<TierLabel, Gauge>,
    pub used_bytes: Family<TierLabel, Gauge>,
    pub blocks: Family<TierLabel, Gauge>,
    pub hits: Family<TierLabel, Counter>,
    pub misses: Family<TierLabel, Counter>,
    pub evictions: Family<TierLabel, Counter>,
    pub promotions: Family<TierLabel, Counter>,
    pub demotions: Family<TierLabel, Counter>,
    pub checksum_failures: Family<TierLabel, Counter>,
    pub lookup_hit_blocks: Counter,
    pub lookup_miss_blocks: Counter,
    pub lookup_hit_tokens: Counter,
    pub lookup_miss_tokens: Counter,
    pub reservations_reclaimed: Counter,
    pub op_seconds: Family<OpLabel, Histogram, fn() -> Histogram>,
    /// `kvfabric_tenant_tier_bytes`: bytes each owner's blocks hold per tier.
    pub tenant_tier_bytes: Family<TenantTierLabel, Gauge>,
    /// `kvfabric_tenant_tier_share_bytes`: each owner's guaranteed bytes.
    pub tenant_tier_share_bytes: Family<TenantTierLabel, Gauge>,
}

impl StoreMetrics {
    /// Create the metrics and register them under `kvfabric_store_*`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::new();
        let r = registry.sub_registry_with_prefix("kvfabric_store");
        m.register_tier_families(r);
        m.register_lookups_and_ops(r);
        registry.register(
            "kvfabric_tenant_tier_bytes",
            "Bytes of the tier held by a tenant's blocks (tiers' share owner)",
            m.tenant_tier_bytes.clone(),
        );
        registry.register(
            "kvfabric_tenant_tier_share_bytes",
            "Bytes of the tier guaranteed to a tenant (tenants file ram_share/disk_share)",
            m.tenant_tier_share_bytes.clone(),
        );
        m
    }

    /// Every metric at zero, and every op's latency series created.
    fn new() -> Self {
        let m = StoreMetrics {
            capacity_bytes: Family::default(),
            used_bytes: Family::default(),
            blocks: Family::default(),
            hits: Family::default(),
            misses: Family::default(),
            evictions: Family::default(),
            promotions: Family::default(),
            demotions: Family::default(),
            checksum_failures: Family::default(),
            lookup_hit_blocks: Counter::default(),
            lookup_miss_blocks: Counter::default(),
            lookup_hit_tokens: Counter::default(),
            lookup_miss_tokens: Counter::default(),
            reservations_reclaimed: Counter::default(),
            op_seconds: Family::new_with_constructor(latency_histogram),
            tenant_tier_bytes: Family::default(),
            tenant_tier_share_bytes: Family::default(),
        };
        // Every op's histogram exists from the start (a family with no
        // series is left out of `/metrics`; dashboards need it before the
        // first op).
        for op in [
            OpName::Put,
            OpName::Get,
            OpName::Lookup,
            OpName::Exists,
            OpName::Remove,
            OpName::DiskRead,
            OpName::DiskWrite,
        ] {
            let _ = m.op_seconds.get_or_create(&OpLabel { op });
        }
        m
    }

    /// The per-tier families (`tier` label): capacity, use, hits, moves.
    fn register_tier_families(&self, r: &mut Registry) {
        let m = self;
        r.register(
            "capacity_bytes",
            "Configured tier capacity",
            m.capacity_bytes.clone(),
        );
        r.register(
            "used_bytes",
            "Bytes held by stored blocks",
            m.used_bytes.clone(),
        );
        r.register("blocks", "Stored blocks", m.blocks.clone());
        r.register("hits", "Reads served from the tier", m.hits.clone());
        r.register(
            "misses",
            "Reads that found nothing in the tier",
            m.misses.clone(),
        );
        r.register(
            "evictions",
            "Blocks dropped from the tier for room",
            m.evictions.clone(),
        );
        r.register(
            "promotions",
            "Blocks copied up into the tier on read",
            m.promotions.clone(),
        );
        r.register(
            "demotions",
            "Blocks written down from the tier",
            m.demotions.clone(),
        );
        r.register(
            "checksum_failures",
            "Reads that failed their checksum (miss, slot dropped)",
            m.checksum_failures.clone(),
        );
    }

    /// Prefix-lookup counters, reclaimed reservations, op latency.
    fn register_lookups_and_ops(&self, r: &mut Registry) {
        let m = self;
        r.register(
            "lookup_hit_blocks",
            "Blocks found by prefix lookups",
            m.lookup_hit_blocks.clone(),
        );
        r.register(
            "lookup_miss_blocks",
            "Blocks not found by prefix lookups",
            m.lookup_miss_blocks.clone(),
        );
        r.register(
            "lookup_hit_tokens",
            "Tokens found by prefix lookups",
            m.lookup_hit_tokens.clone(),
        );
        r.register(
            "lookup_miss_tokens",
            "Tokens not found by prefix lookups",
            m.lookup_miss_tokens.clone(),
        );
        r.register(
            "reservations_reclaimed",
            "Put reservations reclaimed after their timeout",
            m.reservations_reclaimed.clone(),
        );
        r.register(
            "op_seconds",
            "Store operation latency",
            m.op_seconds.clone(),
        );
    }

    /// The counter of `family` for `tier`.
    pub fn tier(family: &TierCounter, tier: TierName) -> Counter {
        family.get_or_create(&TierLabel { tier }).clone()
    }

    /// Record one operation's latency.
    pub fn observe(&self, op: OpName, started: std::time::Instant) {
        self.op_seconds
            .get_or_create(&OpLabel { op })
            .observe(started.elapsed().as_secs_f64());
    }
}
