//! `Store::stats`: the per-tier gauges and counters behind the Stats RPC and
//! the Prometheus tier gauges, kept apart from the data path in `store.rs`.

use crate::tier::Tier;

use crate::metrics::{TierLabel, TierName};
use crate::store::Store;

/// A node's store at one moment: per-tier use and counters, and lookup
/// hits and misses since start ([`Store::stats`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoreStats {
    /// The node's id (`node_id` of its config).
    pub node_id: String,
    /// RAM first, then disk when the node has one.
    pub tiers: Vec<TierStats>,
    /// Looked-up blocks found / not found.
    pub hit_blocks: u64,
    pub miss_blocks: u64,
    /// The same in tokens.
    pub hit_tokens: u64,
    pub miss_tokens: u64,
}

/// One tier's gauges and counters in [`StoreStats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    pub tier: Tier,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub blocks: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub promotions: u64,
    pub demotions: u64,
    pub checksum_failures: u64,
}

impl Store {
    /// Per-tier gauges and counters (also refreshes the Prometheus gauges).
    pub fn stats(&self) -> StoreStats {
        let s = &self.shared;
        let (ram_used, ram_blocks, disk_used, disk_blocks) = {
            let g = s.inner.lock();
            let ram_blocks = g.blocks.values().filter(|b| b.ram.is_some()).count() as u64;
            let disk_blocks = g.blocks.values().filter(|b| b.disk.is_some()).count() as u64;
            (g.ram.used(), ram_blocks, g.disk.used(), disk_blocks)
        };
        self.tenant_usage(); // refreshes the per-tenant gauges
        let mut tiers = vec![self.tier_stats(
            Tier::Ram,
            TierName::Ram,
            s.region.len() as u64,
            ram_used,
            ram_blocks,
        )];
        if let Some(d) = &s.disk {
            tiers.push(self.tier_stats(
                Tier::Disk,
                TierName::Disk,
                d.capacity(),
                disk_used,
                disk_blocks,
            ));
        }
        let m = &s.metrics;
        StoreStats {
            node_id: s.cfg.node_id.clone(),
            tiers,
            hit_blocks: m.lookup_hit_blocks.get(),
            miss_blocks: m.lookup_miss_blocks.get(),
            hit_tokens: m.lookup_hit_tokens.get(),
            miss_tokens: m.lookup_miss_tokens.get(),
        }
    }

    fn tier_stats(
        &self,
        tier: Tier,
        name: TierName,
        cap: u64,
        used: u64,
        blocks: u64,
    ) -> TierStats {
        let m = &self.shared.metrics;
        let label = TierLabel { tier: name };
        m.capacity_bytes.get_or_create(&label).set(cap as i64);
        m.used_bytes.get_or_create(&label).set(used as i64);
        m.blocks.get_or_create(&label).set(blocks as i64);
        let c = |f: &prometheus_client::metrics::family::Family<
            TierLabel,
            prometheus_client::metrics::counter::Counter,
        >| { f.get_or_create(&label).get() };
        TierStats {
            tier,
            capacity_bytes: cap,
            used_bytes: used,
            blocks,
            hits: c(&m.hits),
            misses: c(&m.misses),
            evictions: c(&m.evictions),
            promotions: c(&m.promotions),
            demotions: c(&m.demotions),
            checksum_failures: c(&m.checksum_failures),
        }
    }
}
