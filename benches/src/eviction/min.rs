//! Belady's MIN under the prefix rule: the hit ratio no eviction policy can
//! beat on a trace, the reference `bench eviction` reports policies against.
//!
//! The definition computed: a tier of `capacity` blocks, offline. At each
//! request the hit is the longest stored prefix of its looked-up blocks;
//! then each computed block, in prefix order, is kept or not. A block's
//! *next use* is the next request that looks it up. When the tier is full,
//! the block with the farthest next use goes (a newcomer whose next use is
//! the farthest is not kept at all: MIN may decline to store, which no store
//! policy can; a block never looked up again is never kept). Ties go to the
//! deeper block. A child is looked up only with its parent, so its next use
//! is never earlier than its parent's: with the tie rule a parent never goes
//! while a child stays, a block whose parent is not kept is not kept either,
//! and the stored set is always prefix-closed. Then every stored block a
//! request looks up is a prefix hit, so prefix hits = block hits; Belady's
//! rule maximizes block hits for unit-size blocks with optional admission,
//! and no policy's prefix hits exceed its block hits, so no policy (store
//! or offline) beats this figure on the same trace and capacity. It is an
//! upper bound in that sense: the store admits every put and evicts between
//! watermarks, which MIN need not.

use std::collections::{BTreeSet, HashMap};

use super::traces::Request;

/// Tokens hit / looked-up prompt tokens, over all requests and over the agents'.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Hits {
    pub hit: usize,
    pub total: usize,
    pub agent_hit: usize,
    pub agent_total: usize,
}

impl Hits {
    pub fn add(&mut self, r: &Request, found_blocks: usize, block_tokens: usize) {
        let hit = found_blocks * block_tokens;
        self.hit += hit;
        self.total += r.prompt_tokens;
        if r.agent {
            self.agent_hit += hit;
            self.agent_total += r.prompt_tokens;
        }
    }

    pub fn ratio(&self) -> f64 {
        self.hit as f64 / self.total.max(1) as f64
    }

    pub fn agent_ratio(&self) -> f64 {
        self.agent_hit as f64 / self.agent_total.max(1) as f64
    }
}

const NEVER: usize = usize::MAX;

/// Per request and computed block: the index of the next request that looks
/// the block up (NEVER if none); and every block as a dense id.
fn next_uses(reqs: &[Request]) -> (Vec<Vec<usize>>, Vec<Vec<u32>>) {
    let mut ids = HashMap::new();
    let id_of: Vec<Vec<u32>> = reqs
        .iter()
        .map(|r| {
            r.keys
                .iter()
                .map(|k| {
                    let n = ids.len() as u32;
                    *ids.entry(*k).or_insert(n)
                })
                .collect()
        })
        .collect();
    let mut last = vec![NEVER; ids.len()];
    let mut next = vec![Vec::new(); reqs.len()];
    for i in (0..reqs.len()).rev() {
        next[i] = id_of[i].iter().map(|&b| last[b as usize]).collect();
        for &b in &id_of[i][..reqs[i].usable] {
            last[b as usize] = i;
        }
    }
    (next, id_of)
}

/// MIN's hits on `reqs` with a tier of `capacity` blocks.
pub fn min_hits(reqs: &[Request], capacity: usize, block_tokens: usize) -> Hits {
    let (next, ids) = next_uses(reqs);
    // Stored blocks: id -> (next use, depth); ordered by (next use, depth, id).
    let mut stored: HashMap<u32, (usize, usize)> = HashMap::new();
    let mut order: BTreeSet<(usize, usize, u32)> = BTreeSet::new();
    let mut hits = Hits::default();
    for (i, r) in reqs.iter().enumerate() {
        let found = ids[i][..r.usable]
            .iter()
            .take_while(|b| stored.contains_key(b))
            .count();
        hits.add(r, found, block_tokens);
        for (d, &b) in ids[i].iter().enumerate() {
            let n = next[i][d];
            if let Some(old) = stored.remove(&b) {
                order.remove(&(old.0, old.1, b));
            } else if d > 0 && !stored.contains_key(&ids[i][d - 1]) {
                continue; // its parent is not stored: worthless
            }
            if n == NEVER {
                continue;
            }
            if stored.len() >= capacity {
                match order.last().copied() {
                    Some(far) if (n, d) < (far.0, far.1) => {
                        order.remove(&far);
                        stored.remove(&far.2);
                    }
                    _ => continue, // the newcomer is the farthest: not kept
                }
            }
            stored.insert(b, (n, d));
            order.insert((n, d, b));
        }
    }
    hits
}

#[cfg(test)]
mod tests {
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

    /// A loop of 3 one-block requests in a 2-block tier (LRU's worst case:
    /// no hit at all): MIN keeps two of them for good, 2 hits a round after
    /// the first.
    #[test]
    fn min_on_a_loop_keeps_what_it_can() {
        let trace: Vec<Request> = (0..4)
            .flat_map(|_| [req(&[1]), req(&[2]), req(&[3])])
            .collect();
        let h = min_hits(&trace, 2, 1);
        // Rounds 2-4: 3 accesses each; with 2 slots MIN hits 2 per round.
        assert_eq!(h.hit, 6);
    }

    /// A parent is never dropped before its child: with room for 2 blocks
    /// and a chain a->b->c reused, MIN keeps a and b (a prefix), never b and c.
    #[test]
    fn the_stored_set_stays_prefix_closed() {
        let trace = vec![req(&[1, 2, 3]), req(&[1, 2, 3]), req(&[1, 2, 3])];
        let h = min_hits(&trace, 2, 1);
        assert_eq!(h.hit, 4);
        // A deeper-but-sooner block cannot pull its parent out.
        let trace = vec![req(&[1, 2]), req(&[4]), req(&[1, 2]), req(&[4])];
        assert_eq!(min_hits(&trace, 2, 1).hit, 2);
    }
}
