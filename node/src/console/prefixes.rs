//! The prefixes this node's lookups found most often: per (tenant, deepest
//! block found), how many lookups hit it, how deep it was, who held it and
//! how big it was. The console merges every member's list into the cluster's
//! "top prefixes" table.
//!
//! Bounded: at `capacity` entries the table keeps its more-hit half (the
//! amortized cost per lookup stays O(log n); a prefix hit often survives).

use std::collections::HashMap;

use kvfabric_proto::internal::v1::PrefixStat;
use parking_lot::Mutex;

use crate::cluster::HolderEntry;
use kvfabric_store::keys::BlockKey;

#[derive(Clone, Debug)]
struct Entry {
    depth_blocks: u32,
    hits: u64,
    holders: Vec<String>,
    size_bytes: u64,
}

/// Hit counts of found prefixes, keyed by (namespace, tip key).
pub struct PrefixTracker {
    capacity: usize,
    entries: Mutex<HashMap<(String, BlockKey), Entry>>,
}

impl PrefixTracker {
    /// A tracker of at most `capacity` prefixes.
    pub fn new(capacity: usize) -> PrefixTracker {
        PrefixTracker {
            capacity: capacity.max(2),
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// One lookup by tenant `namespace` of `keys` that found `found` (its
    /// leading blocks' holders). Lookups that found nothing are not prefixes.
    pub fn record(&self, namespace: &str, keys: &[BlockKey], found: &[HolderEntry]) {
        let Some(tip) = found.len().checked_sub(1).and_then(|i| keys.get(i)) else {
            return;
        };
        let mut holders: Vec<String> = found.iter().map(|h| h.node_id.clone()).collect();
        holders.sort();
        holders.dedup();
        let size_bytes = found.iter().map(|h| h.size).sum();
        let mut g = self.entries.lock();
        if g.len() >= self.capacity && !g.contains_key(&(namespace.to_string(), *tip)) {
            let mut hits: Vec<u64> = g.values().map(|e| e.hits).collect();
            hits.sort_unstable();
            let keep_above = hits[hits.len() / 2];
            g.retain(|_, e| e.hits > keep_above);
        }
        let e = g
            .entry((namespace.to_string(), *tip))
            .or_insert_with(|| Entry {
                depth_blocks: 0,
                hits: 0,
                holders: Vec::new(),
                size_bytes: 0,
            });
        e.hits += 1;
        e.depth_blocks = found.len() as u32;
        e.holders = holders;
        e.size_bytes = size_bytes;
    }

    /// The `n` most hit prefixes, most hits first; `tokens` gives a tip key's
    /// depth in tokens when this node knows it (0 otherwise).
    pub fn top(&self, n: usize, tokens: impl Fn(&BlockKey, u32) -> u64) -> Vec<PrefixStat> {
        let mut all: Vec<((String, BlockKey), Entry)> = self
            .entries
            .lock()
            .iter()
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect();
        all.sort_by(|a, b| b.1.hits.cmp(&a.1.hits).then(a.0 .1 .0.cmp(&b.0 .1 .0)));
        all.truncate(n);
        all.into_iter()
            .map(|((namespace, tip), e)| PrefixStat {
                namespace,
                tip_key: tip.to_hex(),
                depth_blocks: e.depth_blocks,
                depth_tokens: tokens(&tip, e.depth_blocks),
                hits: e.hits,
                holders: e.holders,
                size_bytes: e.size_bytes,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::HolderTier;

    fn key(i: u8) -> BlockKey {
        BlockKey([i; 32])
    }

    fn held(node: &str) -> HolderEntry {
        HolderEntry {
            node_id: node.into(),
            tier: HolderTier::Ram,
            size: 100,
            checksum: 0,
        }
    }

    #[test]
    fn counts_hits_per_tenant_and_tip() {
        let t = PrefixTracker::new(16);
        let keys = [key(1), key(2), key(3)];
        for _ in 0..3 {
            t.record("a", &keys, &[held("n1"), held("n2")]);
        }
        t.record("b", &keys, &[held("n1"), held("n2")]);
        t.record("a", &keys, &[held("n1")]);
        t.record("a", &keys, &[]);
        let top = t.top(10, |_, d| d as u64 * 16);
        assert_eq!(top.len(), 3);
        assert_eq!(top[0].namespace, "a");
        assert_eq!(top[0].hits, 3);
        assert_eq!(top[0].tip_key, key(2).to_hex());
        assert_eq!(top[0].depth_blocks, 2);
        assert_eq!(top[0].depth_tokens, 32);
        assert_eq!(top[0].holders, vec!["n1".to_string(), "n2".to_string()]);
        assert_eq!(top[0].size_bytes, 200);
        assert_eq!(top.iter().map(|p| p.hits).sum::<u64>(), 5);
    }

    #[test]
    fn full_table_keeps_the_often_hit_prefixes() {
        let t = PrefixTracker::new(4);
        let hot = [key(200)];
        for _ in 0..10 {
            t.record("a", &hot, &[held("n")]);
        }
        for i in 0..50u8 {
            t.record("a", &[key(i)], &[held("n")]);
        }
        let top = t.top(10, |_, _| 0);
        assert!(top.len() <= 4, "{}", top.len());
        assert_eq!(top[0].tip_key, key(200).to_hex());
        assert_eq!(top[0].hits, 10);
    }
}
