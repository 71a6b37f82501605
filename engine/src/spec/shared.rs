//! Drafting from what other requests generated after the same context.
//!
//! Agents resend the same history (a retried tool call, several samples of
//! one prompt, a conversation replayed by another worker), so the tokens an
//! earlier request generated after a context are often the tokens the next
//! one will generate. [`SharedContinuations`] keeps finished requests'
//! outputs (with the `N` context tokens before them) as segments, oldest
//! first, and indexes every `N`-gram in them. Memory is bounded: past
//! `capacity` tokens the oldest segments and their index entries go.
//! Hashes are seeded with the request's namespace, so one namespace never
//! drafts from another's outputs (drafts never change tokens, but their
//! speed would tell).

use std::collections::{HashMap, VecDeque};

use super::ngram::ngram_hash;

/// Context tokens a shared continuation must match.
pub const N: usize = 8;

/// Finished requests' continuations, bounded in tokens.
#[derive(Debug)]
pub struct SharedContinuations {
    capacity: usize,
    /// (segment id, namespace seed, tokens), oldest first; ids are consecutive.
    segments: VecDeque<(u64, u64, Vec<u32>)>,
    tokens: usize,
    /// N-gram hash to (segment id, position after the N-gram).
    index: HashMap<u64, (u64, u32)>,
    next_id: u64,
}

impl SharedContinuations {
    /// A store of at most `capacity` tokens (0: never stores).
    pub fn new(capacity: usize) -> SharedContinuations {
        SharedContinuations {
            capacity,
            segments: VecDeque::new(),
            tokens: 0,
            index: HashMap::new(),
            next_id: 0,
        }
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.tokens
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }

    /// Keep the output of a finished request: `tokens` is its prompt and
    /// generated tokens, `prompt_len` where the generated ones start.
    pub fn record(&mut self, ns: u64, tokens: &[u32], prompt_len: usize) {
        let seg = &tokens[prompt_len.saturating_sub(N).min(tokens.len())..];
        if seg.len() <= N || seg.len() > self.capacity {
            return;
        }
        while self.tokens + seg.len() > self.capacity {
            self.evict_oldest();
        }
        let id = self.next_id;
        self.next_id += 1;
        for p in N..seg.len() {
            self.index
                .insert(ngram_hash(ns, &seg[p - N..p]), (id, p as u32));
        }
        self.tokens += seg.len();
        self.segments.push_back((id, ns, seg.to_vec()));
    }

    fn evict_oldest(&mut self) {
        let Some((id, ns, seg)) = self.segments.pop_front() else {
            return;
        };
        self.tokens -= seg.len();
        for p in N..seg.len() {
            let h = ngram_hash(ns, &seg[p - N..p]);
            if self.index.get(&h).is_some_and(|e| e.0 == id) {
                self.index.remove(&h);
            }
        }
    }

    /// Up to `max` tokens another request generated after the last `N`
    /// tokens of `tokens` (same namespace), into `out`; false when none.
    pub fn draft(&self, ns: u64, tokens: &[u32], max: usize, out: &mut Vec<u32>) -> bool {
        if tokens.len() < N || max == 0 {
            return false;
        }
        let tail = &tokens[tokens.len() - N..];
        let Some(&(id, p)) = self.index.get(&ngram_hash(ns, tail)) else {
            return false;
        };
        let Some(&(first, ..)) = self.segments.front() else {
            return false;
        };
        let Some((_, seg_ns, seg)) = self.segments.get((id - first) as usize) else {
            return false;
        };
        let p = p as usize;
        if *seg_ns != ns || seg[p - N..p] != *tail || p >= seg.len() {
            return false;
        }
        out.extend_from_slice(&seg[p..(p + max).min(seg.len())]);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(seed: u32, len: usize) -> Vec<u32> {
        (0..len as u32).map(|i| i * 31 + seed * 1000).collect()
    }

    #[test]
    fn another_requests_continuation_is_drafted_in_its_namespace_only() {
        let mut s = SharedContinuations::new(1000);
        let mut first = ctx(1, 40);
        first.extend([7, 8, 9, 10]);
        s.record(5, &first, 40);
        let mut out = Vec::new();
        assert!(s.draft(5, &first[..40], 3, &mut out));
        assert_eq!(out, [7, 8, 9]);
        out.clear();
        assert!(s.draft(5, &first[..42], 8, &mut out));
        assert_eq!(out, [9, 10]);
        assert!(
            !s.draft(6, &first[..40], 3, &mut Vec::new()),
            "other namespace"
        );
        assert!(
            !s.draft(5, &ctx(2, 40), 3, &mut Vec::new()),
            "other context"
        );
    }

    #[test]
    fn memory_stays_bounded_and_evicted_segments_draft_nothing() {
        let mut s = SharedContinuations::new(64);
        for seed in 0..20u32 {
            let mut t = ctx(seed, 30);
            t.extend(ctx(seed + 100, 20));
            s.record(1, &t, 30);
            assert!(s.len() <= 64);
            assert!(s.index.len() <= s.len());
        }
        // Segments are 28 tokens: the last two are held, the rest evicted.
        let old = {
            let mut t = ctx(0, 30);
            t.extend(ctx(100, 20));
            t
        };
        assert!(!s.draft(1, &old[..30], 4, &mut Vec::new()));
        let new = {
            let mut t = ctx(19, 30);
            t.extend(ctx(119, 20));
            t
        };
        let mut out = Vec::new();
        assert!(s.draft(1, &new[..30], 4, &mut out));
        assert_eq!(out, new[30..34]);
        assert_eq!(SharedContinuations::new(0).len(), 0);
    }
}
