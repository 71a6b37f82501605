//! The node's edge: store-owned types (`Tier`, `StoreStats`,
//! `CapacityReport`) to the generated `kvfabric.v1` messages and back.
//! The store links no protocol crate; every conversion lives here.

use kvfabric_proto::v1 as pb;
use kvfabric_store::{CapacityReport, CurvePoint, StoreStats, Tier, TierCurve, TierStats};

/// The wire's tier of a store tier.
pub fn tier_to_proto(t: Tier) -> pb::Tier {
    match t {
        Tier::Absent => pb::Tier::Unspecified,
        Tier::Vram => pb::Tier::Vram,
        Tier::Ram => pb::Tier::Ram,
        Tier::Disk => pb::Tier::Disk,
    }
}

/// The store tier of a wire tier (`Unspecified` is in no tier).
pub fn tier_from_proto(t: pb::Tier) -> Tier {
    match t {
        pb::Tier::Unspecified => Tier::Absent,
        pb::Tier::Vram => Tier::Vram,
        pb::Tier::Ram => Tier::Ram,
        pb::Tier::Disk => Tier::Disk,
    }
}

/// A Stats answer of the store's gauges and counters.
pub fn stats_to_proto(s: StoreStats) -> pb::StatsResponse {
    pb::StatsResponse {
        node_id: s.node_id,
        tiers: s.tiers.into_iter().map(tier_stats_to_proto).collect(),
        hit_blocks: s.hit_blocks,
        miss_blocks: s.miss_blocks,
        hit_tokens: s.hit_tokens,
        miss_tokens: s.miss_tokens,
        ..Default::default()
    }
}

/// One tier's gauges and counters as the wire carries them.
pub fn tier_stats_to_proto(t: TierStats) -> pb::TierStats {
    pb::TierStats {
        tier: tier_to_proto(t.tier) as i32,
        capacity_bytes: t.capacity_bytes,
        used_bytes: t.used_bytes,
        blocks: t.blocks,
        hits: t.hits,
        misses: t.misses,
        evictions: t.evictions,
        promotions: t.promotions,
        demotions: t.demotions,
        checksum_failures: t.checksum_failures,
    }
}

/// A Capacity answer of the planner's report.
pub fn capacity_to_proto(r: CapacityReport) -> pb::CapacityResponse {
    pb::CapacityResponse {
        tiers: r
            .tiers
            .into_iter()
            .map(|t| pb::CapacityTier {
                tier: t.tier,
                policy: t.policy,
                capacity_bytes: t.capacity_bytes,
                points: t
                    .points
                    .into_iter()
                    .map(|p| pb::CapacityPoint {
                        scale: p.scale,
                        capacity_bytes: p.capacity_bytes,
                        token_hit_ratio: p.token_hit_ratio,
                    })
                    .collect(),
            })
            .collect(),
        sample_rate: r.sample_rate,
        lookups: r.lookups,
        sampled_lookups: r.sampled_lookups,
        min_samples: r.min_samples,
        dropped_samples: r.dropped_samples,
    }
}

/// The planner's report of a Capacity answer (what `ctl capacity` prints).
pub fn capacity_from_proto(r: pb::CapacityResponse) -> CapacityReport {
    CapacityReport {
        tiers: r
            .tiers
            .into_iter()
            .map(|t| TierCurve {
                tier: t.tier,
                policy: t.policy,
                capacity_bytes: t.capacity_bytes,
                points: t
                    .points
                    .into_iter()
                    .map(|p| CurvePoint {
                        scale: p.scale,
                        capacity_bytes: p.capacity_bytes,
                        token_hit_ratio: p.token_hit_ratio,
                    })
                    .collect(),
            })
            .collect(),
        sample_rate: r.sample_rate,
        lookups: r.lookups,
        sampled_lookups: r.sampled_lookups,
        min_samples: r.min_samples,
        dropped_samples: r.dropped_samples,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_round_trip() {
        for t in [Tier::Absent, Tier::Vram, Tier::Ram, Tier::Disk] {
            assert_eq!(tier_from_proto(tier_to_proto(t)), t);
        }
    }
}
