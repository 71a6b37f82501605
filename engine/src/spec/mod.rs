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
//! * [`SpecState`]: per request, which draft to verify and how much of it:
//!   the length maximising expected tokens per pass cost, from how much of
//!   its earlier drafts of the same match class was accepted
//!   ([`length::DraftLength`]) and this machine's cost of a verified row
//!   ([`calibrate`]); a class whose drafts keep failing stops drafting.
//!
//! Rolling back what a rejected draft wrote (its KV rows, the blocks
//! allocated for them) is the scheduler's.

pub mod calibrate;
pub mod length;
pub mod ngram;
pub mod shared;

use serde::{Deserialize, Serialize};

use length::{DraftLength, MatchClass, PassCost};
use ngram::ContextIndex;
use shared::SharedContinuations;

/// `[engine.spec]`: speculative decoding settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SpecConfig {
    /// Draft and verify tokens (outputs are identical either way). Default: true.
    pub enabled: bool,
    /// Most tokens drafted for one request in one step. Default: 15 (on the
    /// reference model a pass of 1 + 15 rows costs about 3.4 single-token
    /// steps; below this the length adapts per request, see [`length`]).
    pub max_draft: usize,
    /// Speculate only in steps where at most this many sequences decode:
    /// larger batches are compute-bound and extra rows would cost
    /// throughput. Default: 4.
    pub max_batch: usize,
    /// Tokens of finished requests' outputs kept to draft from (0: off). Default: 65536.
    pub shared_tokens: usize,
    /// The cost model of a pass of 1 + k rows, `1 + verify_base_cost +
    /// verify_row_cost * k` single-row passes, given instead of measured
    /// (both or neither). Default: none, measured when the engine starts
    /// ([`calibrate`]).
    pub verify_base_cost: Option<f32>,
    /// See `verify_base_cost`.
    pub verify_row_cost: Option<f32>,
}

impl SpecConfig {
    /// The configured cost model, if one is given (else it is measured).
    pub fn given_cost(&self) -> Option<PassCost> {
        Some(PassCost::linear(
            self.verify_base_cost?,
            self.verify_row_cost?,
        ))
    }
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            enabled: true,
            max_draft: 15,
            max_batch: 4,
            shared_tokens: 65536,
            verify_base_cost: None,
            verify_row_cost: None,
        }
    }
}

/// One request's drafting state (a forked sample starts from a copy of
/// its prompt's).
#[derive(Clone, Debug)]
pub struct SpecState {
    index: ContextIndex,
    /// Namespace seed of the shared store's hashes.
    ns: u64,
    /// Acceptance evidence, and so the draft length, per match class.
    length: DraftLength,
    /// The class of the draft being verified.
    pending: Option<MatchClass>,
    /// Scratch for the own-context draft.
    own: Vec<u32>,
}

impl SpecState {
    /// A fresh state for a request in namespace `namespace`.
    pub fn new(namespace: &[u8]) -> SpecState {
        SpecState {
            index: ContextIndex::new(),
            ns: ngram::ngram_hash(0x6b76_6661_6272_6963, &bytes_as_tokens(namespace)),
            length: DraftLength::default(),
            pending: None,
            own: Vec::new(),
        }
    }

    /// The namespace seed (for [`SharedContinuations::record`]).
    pub fn ns(&self) -> u64 {
        self.ns
    }

    /// Draft up to `max` tokens after `tokens` into `out` (cleared first):
    /// from the shared store when it knows this context, else from the
    /// request's own context; as many of them as pay for their rows at `cost`.
    pub fn draft(
        &mut self,
        tokens: &[u32],
        shared: &SharedContinuations,
        max: usize,
        cost: &PassCost,
        out: &mut Vec<u32>,
    ) {
        out.clear();
        self.pending = None;
        // The index follows every token, drafted or not.
        self.own.clear();
        let matched = self.index.draft(tokens, max, &mut self.own);
        if max == 0 {
            return;
        }
        let class = if shared.draft(self.ns, tokens, max, out) {
            MatchClass::Long
        } else if matched > 0 {
            std::mem::swap(out, &mut self.own);
            MatchClass::of(matched)
        } else {
            return;
        };
        out.truncate(self.length.choose(class, out.len(), cost));
        if !out.is_empty() {
            self.pending = Some(class);
        }
    }

    /// `drafted` tokens of the last draft were verified and `accepted` of
    /// them kept: the evidence for the next draft's length.
    pub fn verified(&mut self, drafted: usize, accepted: usize) {
        if let Some(class) = self.pending.take() {
            if drafted > 0 {
                self.length.record(class, drafted, accepted);
            }
        }
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
    fn a_request_whose_drafts_fail_stops_drafting_and_one_that_copies_drafts_long() {
        // "1 2 ... 20" then its opening again: an 8-token match drafts long.
        let mut ctx: Vec<u32> = (1..=20).collect();
        ctx.extend(1..=8);
        let shared = SharedContinuations::new(0);
        let c = PassCost::default();
        let mut out = Vec::new();
        let mut s = SpecState::new(b"ns");
        s.draft(&ctx, &shared, 15, &c, &mut out);
        let first = out.len();
        assert!(first >= 6, "a long match drafts long: {out:?}");
        assert_eq!(out[..], (9..9 + first as u32).collect::<Vec<_>>()[..]);
        s.verified(first, first);
        // A 2-token match whose drafts are always rejected: drafting stops.
        let mut other = SpecState::new(b"ns");
        let short = [5, 6, 7, 1, 2, 9, 9, 1, 2];
        let mut drafted = 0;
        for _ in 0..40 {
            other.draft(&short, &shared, 15, &c, &mut out);
            drafted += out.len();
            other.verified(out.len(), 0);
        }
        other.draft(&short, &shared, 15, &c, &mut out);
        assert!(
            out.is_empty() && drafted > 0,
            "drafted {drafted}, then {out:?}"
        );
        // Verifying with no pending draft changes nothing.
        other.verified(3, 3);
        other.draft(&short, &shared, 15, &c, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn the_shared_store_wins_over_the_own_context_when_it_knows_the_context() {
        let mut s = SpecState::new(b"ns");
        let c = PassCost::default();
        let mut shared = SharedContinuations::new(1000);
        let mut earlier: Vec<u32> = (100..130).collect();
        earlier.extend([7, 8, 9]);
        shared.record(s.ns(), &earlier, 30);
        let mut ctx: Vec<u32> = (100..130).collect();
        let mut out = Vec::new();
        s.draft(&ctx, &shared, 8, &c, &mut out);
        assert_eq!(out, [7, 8, 9]);
        // A context the store has not seen drafts from itself.
        ctx.extend([1, 2, 3, 1, 2]);
        s.draft(&ctx, &shared, 8, &c, &mut out);
        assert!(!out.is_empty() && [3, 1, 2].starts_with(&out), "{out:?}");
    }
}
