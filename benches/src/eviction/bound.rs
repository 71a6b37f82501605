//! The offline bound `bench eviction` reports beside MIN: Belady's MIN on
//! block hits, without the prefix rule.
//!
//! Definition: a tier of `capacity` blocks, offline, replays every request;
//! a looked-up block is a *block hit* if the tier holds it, wherever the
//! prefix broke. After the lookup each of the request's blocks may be kept
//! (the tier may decline a block); when full, the block whose next lookup
//! is farthest goes, a newcomer whose next lookup is the farthest is not
//! kept. For unit-size blocks with optional admission this maximizes block
//! hits (Belady's rule), and any policy's prefix hits are at most its block
//! hits, so no store policy (and no offline one) gets more prefix hits than
//! this on the same trace and capacity, whatever the trace.
//!
//! `min` (the prefix-rule MIN) is that same bound when the trace is
//! prefix-consistent: every block has one parent (the block before it in
//! every request that holds it), so a child is never looked up without its
//! parent (`prefix_consistent`; min.rs gives the argument). When a block
//! follows different parents (block ids reused across chains, e.g. a trace
//! keyed by content rather than by prefix) `min`'s figure is not proven to
//! be a bound and this one is the bound to read.

use std::collections::{BTreeSet, HashMap};

use super::min::Hits;
use super::traces::Request;

const NEVER: usize = usize::MAX;

/// Dense ids of every request's blocks.
fn dense(reqs: &[Request]) -> Vec<Vec<u32>> {
    let mut ids = HashMap::new();
    reqs.iter()
        .map(|r| {
            r.keys
                .iter()
                .map(|k| {
                    let n = ids.len() as u32;
                    *ids.entry(*k).or_insert(n)
                })
                .collect()
        })
        .collect()
}

/// Whether every block has the same parent in every request that holds it.
pub fn prefix_consistent(reqs: &[Request]) -> bool {
    let ids = dense(reqs);
    let mut parent: HashMap<u32, Option<u32>> = HashMap::new();
    for r in &ids {
        for (d, &b) in r.iter().enumerate() {
            let p = (d > 0).then(|| r[d - 1]);
            if *parent.entry(b).or_insert(p) != p {
                return false;
            }
        }
    }
    true
}

/// Belady's MIN's block hits on `reqs` with a tier of `capacity` blocks
/// (as [`Hits`]: looked-up tokens held, whatever the prefix).
pub fn block_min_hits(reqs: &[Request], capacity: usize, block_tokens: usize) -> Hits {
    let ids = dense(reqs);
    // Per request and block: the next request that looks the block up.
    let mut last = HashMap::new();
    let mut next = vec![Vec::new(); reqs.len()];
    for i in (0..reqs.len()).rev() {
        next[i] = ids[i]
            .iter()
            .map(|b| *last.get(b).unwrap_or(&NEVER))
            .collect();
        for &b in &ids[i][..reqs[i].usable] {
            last.insert(b, i);
        }
    }
    let mut stored: HashMap<u32, usize> = HashMap::new();
    let mut order: BTreeSet<(usize, u32)> = BTreeSet::new();
    let mut hits = Hits::default();
    for (i, r) in reqs.iter().enumerate() {
        let held = ids[i][..r.usable]
            .iter()
            .filter(|b| stored.contains_key(b))
            .count();
        hits.add(r, held, block_tokens);
        for (d, &b) in ids[i].iter().enumerate() {
            let n = next[i][d];
            if let Some(old) = stored.remove(&b) {
                order.remove(&(old, b));
            }
            if n == NEVER {
                continue;
            }
            if stored.len() >= capacity {
                match order.last().copied() {
                    Some(far) if n < far.0 => {
                        order.remove(&far);
                        stored.remove(&far.1);
                    }
                    _ => continue,
                }
            }
            stored.insert(b, n);
            order.insert((n, b));
        }
    }
    hits
}

#[cfg(test)]
mod tests {
    use super::super::min::min_hits;
    use super::*;
    use kvfabric_store::BlockKey;

    fn req(keys: &[u8]) -> Request {
        Request {
            keys: keys.iter().map(|&k| BlockKey([k; 32])).collect(),
            usable: keys.len(),
            prompt_tokens: keys.len(),
            agent: true,
        }
    }

    /// On a prefix-consistent trace the bound is the prefix-rule MIN.
    #[test]
    fn the_bound_is_min_on_prefix_consistent_traces() {
        let trace: Vec<Request> = (0..6)
            .flat_map(|i| [req(&[1, 2, 3]), req(&[1, 4]), req(&[5, 6 + i])])
            .collect();
        assert!(prefix_consistent(&trace));
        for cap in 1..8 {
            assert_eq!(
                block_min_hits(&trace, cap, 1).hit,
                min_hits(&trace, cap, 1).hit,
                "capacity {cap}"
            );
        }
    }

    /// A block under two parents: its hits count though the prefix broke,
    /// and the bound stays at or above MIN's figure.
    #[test]
    fn blocks_under_two_parents_are_counted_and_bound_min() {
        let trace = vec![req(&[1, 9]), req(&[2, 9]), req(&[1, 9]), req(&[2, 9])];
        assert!(!prefix_consistent(&trace));
        for cap in 1..4 {
            let b = block_min_hits(&trace, cap, 1).hit;
            assert!(b >= min_hits(&trace, cap, 1).hit, "capacity {cap}");
        }
        // Room for 9 alone: it hits in requests 2-4 though 1 and 2 miss.
        assert_eq!(block_min_hits(&trace, 1, 1).hit, 3);
    }
}
