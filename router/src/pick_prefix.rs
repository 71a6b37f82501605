//! The `prefix` policy's inputs and cost: which engines hold which blocks
//! ([`PrefixIndex`], from the nodes' KV events), which leading blocks of a
//! prompt other prompts share ([`PrefixBranches`], from the prompts routed),
//! and the cost [`prefix_cost`] that [`crate::pick::choose`] minimises.
//!
//! Why two weights: Dynamo's cost (`overlap_weight * tokens to prefill +
//! load`) weighs every missing block alike. On an agent trace (a ~650-token
//! system prompt shared by all sessions, then each session's own history)
//! that either moved a session's history off its engine whenever another
//! session's turn was in flight there (weight 1: 0.73x random's bytes), or
//! piled every new session onto the one engine holding the system prompt
//! (weight 4). Moving the shared prefix to an idle engine is paid once per
//! engine; moving a session's own history is paid again every time it
//! moves. So the blocks a prompt shares with other prompts (up to its
//! deepest branch point in the prefix tree of routed prompts, as a radix
//! cache sees it) weigh `prefix_overlap_weight`, the blocks past it (the
//! session's own) `prefix_session_weight`.

use std::collections::HashMap;

use crate::pick_params::PickParams;

/// What one engine holds of a prompt, in blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Leading blocks of the prompt it holds.
    pub leading: usize,
    /// Blocks past the shared prefix it holds, counted one by one (None:
    /// those of `leading`). An engine that read the shared prefix from
    /// another node holds the session's own blocks on its node all the
    /// same, so a leading count alone would say it holds nothing.
    pub own: Option<usize>,
}

/// The cost of sending a `prompt_blocks`-block prompt, of which the first
/// `shared_blocks` are shared with other prompts, to an engine holding
/// `held` of it with `load` tokens in flight (lowest wins):
/// `(overlap_weight * shared blocks missing + session_weight * own blocks
/// missing) * block_tokens + load`.
pub fn prefix_cost(
    load: u64,
    prompt_blocks: usize,
    shared_blocks: usize,
    held: Held,
    block_tokens: usize,
    p: &PickParams,
) -> f64 {
    let shared = shared_blocks.min(prompt_blocks);
    let cached = held.leading.min(prompt_blocks);
    let shared_missing = shared - cached.min(shared);
    let own_held = held.own.unwrap_or(cached.saturating_sub(shared));
    let own_missing = (prompt_blocks - shared).saturating_sub(own_held);
    let weighted = p.prefix_overlap_weight * shared_missing as f64
        + p.prefix_session_weight * own_missing as f64;
    weighted * block_tokens as f64 + load as f64
}

/// Which engines hold which block (by 32-byte block key), from the nodes'
/// KV events; at most 64 engines.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    holders: HashMap<[u8; 32], u64>,
}

/// Engines a [`PrefixIndex`] can track.
pub const PREFIX_INDEX_MAX_ENGINES: usize = 64;

impl PrefixIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Engine `engine` (< 64) now holds `key` (`stored`) or no longer does.
    pub fn apply(&mut self, engine: usize, key: [u8; 32], stored: bool) {
        if engine >= PREFIX_INDEX_MAX_ENGINES {
            return;
        }
        let bit = 1u64 << engine;
        if stored {
            *self.holders.entry(key).or_insert(0) |= bit;
        } else if let Some(m) = self.holders.get_mut(&key) {
            *m &= !bit;
            if *m == 0 {
                self.holders.remove(&key);
            }
        }
    }

    /// Forget everything `engine` held (its event stream lagged or restarted:
    /// a resync follows).
    pub fn clear_engine(&mut self, engine: usize) {
        if engine >= PREFIX_INDEX_MAX_ENGINES {
            return;
        }
        let bit = 1u64 << engine;
        self.holders.retain(|_, m| {
            *m &= !bit;
            *m != 0
        });
    }

    /// For each of `engines` engines: how many leading blocks of `keys` it holds.
    pub fn cached_blocks(&self, keys: &[[u8; 32]], engines: usize) -> Vec<usize> {
        let mut out = vec![0; engines];
        let mut alive = if engines >= 64 {
            u64::MAX
        } else {
            (1u64 << engines) - 1
        };
        for (depth, k) in keys.iter().enumerate() {
            alive &= self.holders.get(k).copied().unwrap_or(0);
            if alive == 0 {
                break;
            }
            for (e, o) in out.iter_mut().enumerate().take(PREFIX_INDEX_MAX_ENGINES) {
                if alive & (1 << e) != 0 {
                    *o = depth + 1;
                }
            }
        }
        out
    }

    /// For each of `engines` engines: how many of `keys` it holds, in any order.
    pub fn held_blocks(&self, keys: &[[u8; 32]], engines: usize) -> Vec<usize> {
        let mut out = vec![0; engines];
        for k in keys {
            let m = self.holders.get(k).copied().unwrap_or(0);
            for (e, o) in out.iter_mut().enumerate().take(PREFIX_INDEX_MAX_ENGINES) {
                *o += usize::from(m & (1 << e) != 0);
            }
        }
        out
    }

    /// Blocks indexed (any engine).
    pub fn len(&self) -> usize {
        self.holders.len()
    }

    /// True when nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.holders.is_empty()
    }
}

/// What follows a block in the prompts routed so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// One block only (so far every prompt through it went on alike).
    One([u8; 32]),
    /// Two or more: prompts branch here.
    Many,
}

/// The prefix tree of the prompts routed, reduced to what the `prefix`
/// cost needs: for each block key, whether prompts branch after it. A
/// prompt's shared blocks are those up to its deepest branch point (the
/// system prompt once a second session arrives); the rest are its own (a
/// session's history, which its later turns extend without branching).
///
/// Block keys are chained (a key names its whole prefix), so one successor
/// per key is the tree. At most `capacity` keys are kept; past that the map
/// starts over (forgetting only makes blocks count as a session's own for
/// a while).
#[derive(Debug)]
pub struct PrefixBranches {
    capacity: usize,
    next: HashMap<[u8; 32], Next>,
}

impl PrefixBranches {
    /// An empty tree of at most `capacity` (>= 1) keys.
    pub fn new(capacity: usize) -> Self {
        PrefixBranches {
            capacity: capacity.max(1),
            next: HashMap::new(),
        }
    }

    /// Record a prompt's full-block keys and return how many of its
    /// leading blocks are shared with a prompt that went on differently.
    pub fn observe(&mut self, keys: &[[u8; 32]]) -> usize {
        if self.next.len().saturating_add(keys.len()) > self.capacity {
            self.next.clear();
        }
        let mut shared = 0;
        for (i, pair) in keys.windows(2).enumerate() {
            let e = self.next.entry(pair[0]).or_insert(Next::One(pair[1]));
            if *e != Next::One(pair[1]) {
                *e = Next::Many;
            }
            if *e == Next::Many {
                shared = i + 1;
            }
        }
        shared
    }

    /// Keys remembered.
    pub fn len(&self) -> usize {
        self.next.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.next.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_index_counts_leading_blocks_per_engine() {
        let k = |i: u8| [i; 32];
        let mut ix = PrefixIndex::new();
        for i in 0..4 {
            ix.apply(0, k(i), true);
        }
        ix.apply(1, k(0), true);
        ix.apply(1, k(2), true); // not a prefix: block 1 missing
        assert_eq!(
            ix.cached_blocks(&[k(0), k(1), k(2), k(3)], 3),
            vec![4, 1, 0]
        );
        assert_eq!(ix.held_blocks(&[k(0), k(1), k(2), k(3)], 3), vec![4, 2, 0]);
        ix.apply(0, k(1), false);
        assert_eq!(ix.cached_blocks(&[k(0), k(1), k(2)], 3), vec![1, 1, 0]);
        ix.clear_engine(0);
        assert_eq!(ix.cached_blocks(&[k(0)], 2), vec![0, 1]);
        ix.clear_engine(1);
        assert!(ix.is_empty());
    }

    #[test]
    fn branches_mark_the_prefix_prompts_share() {
        let k = |i: u8| [i; 32];
        let mut b = PrefixBranches::new(100);
        // Session A: system blocks 0..3, then its own 10, 11.
        assert_eq!(b.observe(&[k(0), k(1), k(2), k(10), k(11)]), 0);
        // A's next turn extends its prompt: no branch.
        assert_eq!(b.observe(&[k(0), k(1), k(2), k(10), k(11), k(12)]), 0);
        // Session B branches after the system prompt.
        assert_eq!(b.observe(&[k(0), k(1), k(2), k(20)]), 3);
        // From now on A's turns share 3 blocks and own the rest.
        assert_eq!(
            b.observe(&[k(0), k(1), k(2), k(10), k(11), k(12), k(13)]),
            3
        );
        assert_eq!(b.observe(&[k(0)]), 0);
        assert_eq!(b.len(), 6);
        // Past the capacity the tree starts over.
        let mut small = PrefixBranches::new(4);
        small.observe(&[k(0), k(1), k(2)]);
        assert_eq!(small.observe(&[k(0), k(5)]), 1);
        assert_eq!(small.observe(&[k(7), k(8), k(9)]), 0);
        assert_eq!(small.len(), 2);
    }
}
