//! Speculative decoding: drafting, and how long a request's drafts are.
//!
//! The engine's kernels are batch-invariant, so a drafted token verified as
//! an extra row of the running batch gets bitwise the logits one-at-a-time
//! decoding would give it (`engine/tests/spec_rows.rs`). The scheduler samples
//! each verified row in order with the request's own sampler and keeps a
//! draft token only while it equals the sampled one, so the output and the
//! request's RNG stream are exactly those of decoding without speculation,
//! greedy or sampled. This module owns what is drafted:
//!
//! * [`ngram::ContextIndex`]: prompt lookup over the request's own context
//!   (prompt and generated tokens), indexed incrementally.
//! * [`shared::SharedContinuations`]: outputs of earlier requests after
//!   the same context, bounded in memory.
//! * [`SpecState`]: per request, the draft length, adapted to how much of
//!   its drafts is accepted; a request whose drafts keep failing stops
//!   drafting for a growing number of steps.
//!
//! Rolling back what a rejected draft wrote (its KV rows, the blocks
//! allocated for them) is the scheduler's.

pub mod ngram;
pub mod shared;

use serde::{Deserialize, Serialize};

use ngram::ContextIndex;
use shared::SharedContinuations;

/// `[engine.spec]`: speculative decoding settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SpecConfig {
    /// Draft and verify tokens (outputs are identical either way). Default: true.
    pub enabled: bool,
    /// Most tokens drafted for one request in one step. Default: 8 (on the
    /// reference model a pass of 1 + 8 rows costs about 2.2 single-token
    /// steps, 1 + 16 rows 4.5: longer drafts pay only when nearly all of
    /// them is accepted).
    pub max_draft: usize,
    /// Speculate only in steps where at most this many sequences decode:
    /// larger batches are compute-bound and extra rows would cost
    /// throughput. Default: 4.
    pub max_batch: usize,
    /// Tokens of finished requests' outputs kept to draft from (0: off). Default: 65536.
    pub shared_tokens: usize,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            enabled: true,
            max_draft: 8,
            max_batch: 4,
            shared_tokens: 65536,
        }
    }
}

/// Draft length a request starts with.
const START_DRAFT: usize = 4;
/// Most steps a request whose drafts keep failing waits before drafting again.
const MAX_PAUSE: u32 = 32;

/// One request's drafting state (a forked sample starts from a copy of
/// its prompt's).
#[derive(Clone, Debug)]
pub struct SpecState {
    index: ContextIndex,
    /// Namespace seed of the shared store's hashes.
    ns: u64,
    /// Tokens to draft next time.
    len: usize,
    /// Drafts in a row with nothing accepted.
    misses: u32,
    /// Steps left before drafting again.
    pause: u32,
}

impl SpecState {
    /// A fresh state for a request in namespace `namespace`.
    pub fn new(namespace: &[u8]) -> SpecState {
        SpecState {
            index: ContextIndex::new(),
            ns: ngram::ngram_hash(0x6b76_6661_6272_6963, &bytes_as_tokens(namespace)),
            len: START_DRAFT,
            misses: 0,
            pause: 0,
        }
    }

    /// The namespace seed (for [`SharedContinuations::record`]).
    pub fn ns(&self) -> u64 {
        self.ns
    }

    /// Draft up to `max` tokens after `tokens` into `out` (cleared first):
    /// from the shared store when it knows this context, else from the
    /// request's own context.
    pub fn draft(
        &mut self,
        tokens: &[u32],
        shared: &SharedContinuations,
        max: usize,
        out: &mut Vec<u32>,
    ) {
        out.clear();
        // The index follows every token, drafted or not.
        let mut own = Vec::new();
        let n = self.len.min(max);
        let matched = self.index.draft(tokens, n, &mut own);
        if self.pause > 0 {
            self.pause -= 1;
            return;
        }
        if n == 0 {
            return;
        }
        if !shared.draft(self.ns, tokens, n, out) && matched > 0 {
            *out = own;
        }
    }

    /// `drafted` tokens were verified and `accepted` of them kept: adapt
    /// the next draft's length.
    pub fn verified(&mut self, drafted: usize, accepted: usize, max_draft: usize) {
        if drafted == 0 {
            return;
        }
        if accepted == 0 {
            self.misses += 1;
            self.pause = (1u32 << self.misses.min(5)).min(MAX_PAUSE);
            self.len = 1;
            return;
        }
        self.misses = 0;
        self.len = if accepted == drafted {
            (self.len * 2).max(accepted + 1)
        } else {
            accepted + 1
        }
        .clamp(1, max_draft.max(1));
    }
}

/// Namespace bytes as tokens for [`ngram::ngram_hash`] (4 bytes each).
fn bytes_as_tokens(b: &[u8]) -> Vec<u32> {
    b.chunks(4)
        .map(|c| c.iter().fold(0u32, |a, &x| (a << 8) | u32::from(x)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_length_follows_acceptance_and_failing_drafts_pause() {
        let mut s = SpecState::new(b"ns");
        assert_eq!(s.len, START_DRAFT);
        s.verified(4, 4, 16);
        assert_eq!(s.len, 8, "all accepted: longer");
        s.verified(8, 8, 10);
        assert_eq!(s.len, 10, "capped at max_draft");
        s.verified(10, 3, 16);
        assert_eq!(s.len, 4, "partly accepted: what was accepted, plus one");
        s.verified(4, 0, 16);
        s.verified(1, 0, 16);
        assert_eq!((s.len, s.pause), (1, 4), "misses pause drafting, doubling");
        // Paused: a perfect own-context match drafts nothing for 4 steps.
        let ctx: Vec<u32> = [1, 2, 3, 4, 5, 1, 2, 3].to_vec();
        let shared = SharedContinuations::new(0);
        let mut out = Vec::new();
        for _ in 0..4 {
            s.draft(&ctx, &shared, 8, &mut out);
            assert!(out.is_empty());
        }
        s.draft(&ctx, &shared, 8, &mut out);
        assert_eq!(out, [4]);
        s.verified(1, 1, 16);
        assert_eq!((s.len, s.misses), (2, 0));
    }

    #[test]
    fn the_shared_store_wins_over_the_own_context_when_it_knows_the_context() {
        let mut s = SpecState::new(b"ns");
        let mut shared = SharedContinuations::new(1000);
        let mut earlier: Vec<u32> = (100..130).collect();
        earlier.extend([7, 8, 9]);
        shared.record(s.ns(), &earlier, 30);
        let mut ctx: Vec<u32> = (100..130).collect();
        let mut out = Vec::new();
        s.draft(&ctx, &shared, 8, &mut out);
        assert_eq!(out, [7, 8, 9]);
        // A context the store has not seen drafts from itself.
        ctx.extend([1, 2, 3, 1, 2]);
        s.draft(&ctx, &shared, 8, &mut out);
        assert_eq!(out, [3, 1, 2]);
    }
}
