//! `door`: LRU behind a doorkeeper. A block put for the first time (its key
//! not seen by the doorkeeper) enters a probation FIFO, evicted before any
//! block of the main LRU; a block put again (it was here before and left),
//! or read while on probation, is in main. The newest `WINDOW` of the
//! residents on probation are spared, so a prefix computed a moment ago
//! survives until its next turn.
//!
//! Why: on the Mooncake FAST'25 traces (docs/BENCHMARKS.md, session 32)
//! most blocks are put once and never looked up again (58% of the synthetic
//! trace's blocks, 76% of the conversation trace's), and on the synthetic
//! trace a block's chance of being looked up within the next tier's worth
//! of block lookups is 0.06-0.08 after its first lookup against 0.1-0.6
//! after a later one, whatever its age. LRU
//! spends the tier on the first kind; `door` spends it on the second.
//! Frequency beyond "seen before" did not help there (LFU, LRFU, MQ, ARC,
//! TinyLFU admission were measured in the session's prototype).
//!
//! The doorkeeper is two generations of a blocked Bloom filter (four bits
//! in one word per key) over the keys put or read
//! (TinyLFU's doorkeeper, Einziger et al. 2017): a generation takes
//! `HISTORY` times the most blocks the tier has held, then the older is
//! dropped and cleared for reuse, so the keeper remembers the last
//! `HISTORY`-`2 * HISTORY` tiers' worth of puts and reads in `BITS_PER_KEY`
//! bits each (a block read ever since its put is remembered when it leaves). A false positive sends a new block to main: a ranking choice, never
//! a correctness one. Keys are hashed with `keys::spot`, so the order is
//! deterministic: the same operations make the same choices.
//!
//! Cost: insert reads a word of each generation and writes one, touch writes
//! one (and clears a generation's words
//! every `HISTORY` tiers' worth of puts and reads: amortized under a word
//! per op), touch and remove are one list operation, a victim costs the candidates
//! it looks at. Pinned and leased blocks are the caller's `eligible`
//! predicate: skipped, never chosen.

use super::list::{Queues, Slot};
use crate::keys::{spot, BlockKey};
use crate::rec::Rec;

const PROBATION: usize = 0;
const MAIN: usize = 1;

/// Share of the residents on probation that is spared (the newest).
pub(super) const WINDOW: f64 = 0.05;
/// Tiers' worth of puts a doorkeeper generation remembers.
const HISTORY: usize = 4;
/// Bloom bits per remembered key (four set in one word: under 1% false
/// positives over both generations; 8 bits with three set gave ~4%, and each
/// point of false positives cost about 0.003 of hit ratio at 10% of the
/// Mooncake synthetic trace, as a new block sent to main displaces a block
/// seen before).
const BITS_PER_KEY: usize = 16;

/// Keys put lately: two generations of a Bloom filter.
#[derive(Debug, Default)]
pub(super) struct Doorkeeper {
    cur: Vec<u64>,
    prev: Vec<u64>,
    /// Keys added to `cur`.
    adds: usize,
}

/// The word of hash `h` in a filter of `words` words (a power of two), and
/// its four bits in that word: a blocked Bloom filter, so a test or an add
/// reads one word (one cache line) per generation.
fn slot(h: u64, words: usize) -> (usize, u64) {
    let word = (h as usize) & (words - 1);
    let bits = (1u64 << ((h >> 40) & 63))
        | (1 << ((h >> 46) & 63))
        | (1 << ((h >> 52) & 63))
        | (1 << ((h >> 58) & 63));
    (word, bits)
}

fn test(filter: &[u64], h: u64) -> bool {
    if filter.is_empty() {
        return false;
    }
    let (w, bits) = slot(h, filter.len());
    filter[w] & bits == bits
}

impl Doorkeeper {
    /// Whether `key` was added within the keeper's memory.
    pub(super) fn seen(&self, key: &BlockKey) -> bool {
        let h = spot(key);
        test(&self.cur, h) || test(&self.prev, h)
    }

    /// Remember `key`; a generation holds `HISTORY * most` keys, or fewer
    /// while the tier fills: a generation sized when the tier was small
    /// ends once it holds the keys it was sized for (its words at
    /// `BITS_PER_KEY` each), not when the grown tier's generation is done.
    /// (It ran on to the grown size, one 64-word filter took every key
    /// of the first `HISTORY` tiers and saw every key for two generations
    /// after: `door` was LRU for the first 8 tiers' worth of puts and reads,
    /// all of the synthetic trace's at 25%.) Each early end at least doubles
    /// the words, so the allocations stay amortized O(1) per add.
    pub(super) fn add(&mut self, key: &BlockKey, most: usize) {
        let generation = HISTORY * most.max(64);
        let room = self.cur.len() * 64 / BITS_PER_KEY;
        if self.cur.is_empty() || self.adds >= generation.min(room) {
            let words = (generation * BITS_PER_KEY).next_power_of_two() / 64;
            let mut old = std::mem::take(&mut self.prev);
            if old.len() == words {
                old.fill(0);
            } else {
                old = vec![0; words];
            }
            self.prev = std::mem::replace(&mut self.cur, old);
            self.adds = 0;
        }
        let (w, bits) = slot(spot(key), self.cur.len());
        self.cur[w] |= bits;
        self.adds += 1;
    }
}

/// LRU behind a doorkeeper: first-time blocks on probation, evicted first.
#[derive(Debug, Default)]
pub struct Door {
    queues: Queues<2>,
    keeper: Doorkeeper,
    /// The most blocks queued at once (the keeper's unit).
    most: usize,
}

impl Door {
    pub(super) fn insert(&mut self, key: BlockKey, rec: Rec) -> Slot {
        self.most = self.most.max(self.queues.total() + 1);
        let q = if self.keeper.seen(&key) {
            MAIN
        } else {
            PROBATION
        };
        self.keeper.add(&key, self.most);
        self.queues.push_back(q, key, rec)
    }

    /// Blocks on probation (tests).
    #[cfg(test)]
    pub(super) fn on_probation(&self) -> usize {
        self.queues.len(PROBATION)
    }

    pub(super) fn prefetch(&self, s: Slot) {
        self.queues.prefetch(s);
    }

    /// The queue a victim is taken from first: probation while it holds
    /// more than the spared window, else main (probation if main is empty).
    fn first_queue(&self) -> usize {
        let window = (self.queues.total() as f64 * WINDOW) as usize;
        if self.queues.len(PROBATION) > window || self.queues.len(MAIN) == 0 {
            PROBATION
        } else {
            MAIN
        }
    }

    /// The block `victim` looks at first.
    pub(super) fn peek(&self) -> Option<(BlockKey, Rec)> {
        self.queues
            .front(self.first_queue())
            .map(|s| (self.queues.key(s), self.queues.rec(s)))
    }

    /// Start loading the node after the first candidate (evicting it
    /// unlinks it, which writes that node).
    pub(super) fn prefetch_eviction(&self) {
        let q = self.first_queue();
        if let Some(next) = self.queues.front(q).and_then(|s| self.queues.next(s)) {
            self.queues.prefetch(next);
        }
    }

    pub(super) fn touch(&mut self, s: Slot, key: &BlockKey) {
        debug_assert!(self.queues.holds(s, key), "stale slot {s} for {key:?}");
        self.queues.move_to_back(s, MAIN);
        // A block read for long stays remembered when it leaves.
        self.keeper.add(key, self.most);
    }

    pub(super) fn remove(&mut self, s: Slot, key: &BlockKey) {
        debug_assert!(self.queues.holds(s, key), "stale slot {s} for {key:?}");
        self.queues.remove(s);
    }

    pub(super) fn victim(
        &mut self,
        mut eligible: impl FnMut(&BlockKey, Rec) -> bool,
    ) -> Option<BlockKey> {
        let first = self.first_queue();
        for q in [first, 1 - first] {
            let mut at = self.queues.front(q);
            while let Some(s) = at {
                let key = self.queues.key(s);
                if eligible(&key, self.queues.rec(s)) {
                    return Some(key);
                }
                at = self.queues.next(s);
            }
        }
        None
    }
}
