//! Drafting from a request's own context: the longest recent n-gram match.
//!
//! Agents' outputs copy their inputs (tool-call arguments quote the context,
//! a code edit echoes the file), so the tokens that followed the last
//! occurrence of the current suffix are a good guess for what comes next
//! (prompt lookup decoding). [`ContextIndex`] maps every n-gram of the
//! context (n in `MIN_N..=MAX_N`) to the position right after its latest
//! occurrence. It is built incrementally: each new token adds `MAX_N`
//! entries, so a draft costs `O(MAX_N)` lookups, never a rescan of the
//! context.
//!
//! A match less than a draft's length back is a repeat (a list of similar
//! items, a model looping on a line): the draft runs on past the context's
//! end by copying itself, as an overlapping LZ77 copy does, so it keeps the
//! period instead of stopping after one of them (on `bench spec`'s tool
//! calls the oracle's tokens per pass cost rose 3% with it).

use std::collections::HashMap;

/// Shortest suffix matched: single tokens match too often in free text to
/// be worth a verification row.
pub const MIN_N: usize = 2;
/// Longest suffix matched (longer matches are tried first).
pub const MAX_N: usize = 8;

/// One step of the n-gram hash (tokens are fed newest first).
fn mix(h: u64, tok: u32) -> u64 {
    (h ^ u64::from(tok))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .rotate_left(29)
}

/// The hash of `tokens` under `seed` (the same for [`ContextIndex`] and the
/// shared store, which seeds it with the request's namespace).
pub fn ngram_hash(seed: u64, tokens: &[u32]) -> u64 {
    tokens.iter().rev().fold(seed, |h, &t| mix(h, t))
}

/// Latest occurrence of every n-gram of one context.
#[derive(Clone, Debug, Default)]
pub struct ContextIndex {
    /// `maps[n - MIN_N]`: hash of `tokens[p - n..p]` to `p` (latest `p`).
    maps: Vec<HashMap<u64, u32>>,
    /// Positions `p < indexed` are in the maps.
    indexed: usize,
}

impl ContextIndex {
    /// An empty index.
    pub fn new() -> ContextIndex {
        ContextIndex {
            maps: (MIN_N..=MAX_N).map(|_| HashMap::new()).collect(),
            indexed: 0,
        }
    }

    /// Index the tokens appended since the last call (`tokens` only grows).
    /// Position `p` is indexed once `tokens[p]` exists, so the current
    /// suffix never matches itself.
    fn update(&mut self, tokens: &[u32]) {
        for p in self.indexed.max(MIN_N)..tokens.len() {
            let mut h = 0;
            for n in 1..=MAX_N.min(p) {
                h = mix(h, tokens[p - n]);
                if n >= MIN_N {
                    self.maps[n - MIN_N].insert(h, p as u32);
                }
            }
        }
        self.indexed = self.indexed.max(tokens.len());
    }

    /// Up to `max` tokens that followed the latest earlier occurrence of
    /// the longest matching suffix of `tokens` (past the context's end, the
    /// draft's own tokens: module doc), into `out`; returns the match length
    /// (0: no draft).
    pub fn draft(&mut self, tokens: &[u32], max: usize, out: &mut Vec<u32>) -> usize {
        self.update(tokens);
        let len = tokens.len();
        if max == 0 {
            return 0;
        }
        let mut hashes = [0u64; MAX_N + 1];
        let mut h = 0;
        for n in 1..=MAX_N.min(len) {
            h = mix(h, tokens[len - n]);
            hashes[n] = h;
        }
        for n in (MIN_N..=MAX_N.min(len)).rev() {
            let Some(&p) = self.maps[n - MIN_N].get(&hashes[n]) else {
                continue;
            };
            let p = p as usize;
            // A hash collision is no match.
            if p < len && tokens[p - n..p] == tokens[len - n..] {
                let start = out.len();
                out.extend_from_slice(&tokens[p..(p + max).min(len)]);
                // p < len, so each copied token is one already drafted.
                for i in out.len() - start..max {
                    let t = out[start + p + i - len];
                    out.push(t);
                }
                return n;
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_what_followed_the_latest_longest_match() {
        let mut ix = ContextIndex::new();
        let mut out = Vec::new();
        // "1 2 3 4 5 | 9 2 3 7 | 1 2 3": the 3-gram "1 2 3" wins over "2 3".
        let ctx = [1, 2, 3, 4, 5, 9, 2, 3, 7, 1, 2, 3];
        assert_eq!(ix.draft(&ctx, 3, &mut out), 3);
        assert_eq!(out, [4, 5, 9]);
        // Only "2 3" matches: its latest occurrence is followed by 7.
        out.clear();
        assert_eq!(
            ix.draft(&[1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 2, 3], 8, &mut out),
            2
        );
        assert_eq!(
            out,
            [7, 8, 2, 3, 7, 8, 2, 3],
            "past the context's end the draft repeats its period"
        );
        // A one-token period (a loop on one token) fills the draft.
        out.clear();
        assert_eq!(ix_draft(&[4, 5, 6, 6, 6], 5, &mut out), 2);
        assert_eq!(out, [6; 5]);
    }

    fn ix_draft(ctx: &[u32], max: usize, out: &mut Vec<u32>) -> usize {
        ContextIndex::new().draft(ctx, max, out)
    }

    #[test]
    fn incremental_updates_match_a_fresh_index_and_never_match_the_suffix_itself() {
        let toks: Vec<u32> = (0..400).map(|i| (i * 7 % 13) as u32).collect();
        let mut grown = ContextIndex::new();
        for end in 1..=toks.len() {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let na = grown.draft(&toks[..end], 5, &mut a);
            let nb = ContextIndex::new().draft(&toks[..end], 5, &mut b);
            assert_eq!((na, &a), (nb, &b), "at {end}");
        }
        let mut out = Vec::new();
        assert_eq!(ContextIndex::new().draft(&[5, 6, 7, 8], 4, &mut out), 0);
        assert!(out.is_empty());
    }
}
