//! The scheduler's side of speculative decoding (drafting is `crate::spec`).
//!
//! * Plan: a decoding sequence (one token to compute) in a step where at
//!   most `spec.max_batch` sequences decode gets a draft appended to its
//!   tokens, and its chunk grows from 1 row to 1 + draft rows. Draft rows
//!   take blocks only from what is free or cached, never by preempting, and
//!   count against the step's token budget.
//! * Verify (`advance`): the rows are sampled in order with the request's
//!   sampler, the same draws as decoding one token per step; a draft token
//!   stays only while it equals the token sampled before it.
//! * Roll back ([`Scheduler::verified`]): the rejected tokens were taken
//!   off `tokens` before sampling, `computed` counts accepted rows only, so
//!   no block holding a rejected row is ever registered in the prefix cache
//!   or queued for saving; the blocks allocated past the accepted rows go
//!   back to the pool, and the rows written past `computed` in the kept last
//!   block are overwritten before that block fills up.

use super::seq::Seq;
use super::Scheduler;
use crate::config::Role;

impl Seq {
    /// Take this step's draft tokens off the end of `tokens`.
    pub(super) fn take_drafts(&mut self) -> Vec<u32> {
        let d = std::mem::take(&mut self.drafted);
        self.tokens.split_off(self.tokens.len() - d)
    }
}

impl Scheduler {
    /// Append a draft to running sequence `i` if it decodes this step and
    /// speculation pays (`decoding` sequences decode, `budget` tokens left);
    /// returns the draft's length.
    pub(super) fn add_draft(&mut self, i: usize, budget: usize, decoding: usize) -> usize {
        let cfg = &self.cfg.spec;
        if !cfg.enabled || decoding > cfg.max_batch || self.cfg.role == Role::Prefill {
            return 0;
        }
        let bt = self.kv.layout().block_tokens as usize;
        let ctx = self.model.config.context_length;
        // Blocks left for other sequences' growth this step.
        let reserve = self.running.len();
        let s = &mut self.running[i];
        if s.stream.is_some() || s.tokens.len() - s.computed != 1 {
            return 0;
        }
        // Tokens still to generate after the one sampled anyway, within the context.
        let room = (s.max_tokens - s.generated)
            .saturating_sub(1)
            .min(ctx.saturating_sub(s.tokens.len() + 1))
            .min(budget)
            .min(cfg.max_draft);
        if room == 0 {
            return 0;
        }
        let Some(cost) = self.pass_cost else {
            return 0;
        };
        let s = &mut self.running[i];
        let draft = &mut self.draft_buf;
        s.spec.draft(&s.tokens, &self.shared, room, &cost, draft);
        // A constrained sequence verifies only what its grammar allows.
        draft.truncate(s.sampler.valid_draft(draft));
        let need = (s.computed + 1 + draft.len()).div_ceil(bt);
        while s.table.len() < need && self.blocks.available() > reserve && s.table.grow() {}
        let d = draft.len().min(s.table.len() * bt - s.computed - 1);
        s.tokens.extend_from_slice(&draft[..d]);
        s.drafted = d;
        d
    }

    /// Sequence `i` verified `drafted` tokens and kept `accepted`: count
    /// them, adapt its draft length, and give back the blocks past its
    /// accepted rows.
    pub(super) fn verified(&mut self, i: usize, drafted: usize, accepted: usize) {
        tracing::trace!(drafted, accepted, "verified a draft");
        let m = &self.cfg.metrics;
        m.spec_drafted_tokens.inc_by(drafted as u64);
        m.spec_accepted_tokens.inc_by(accepted as u64);
        m.spec_acceptance_length.observe((accepted + 1) as f64);
        let bt = self.kv.layout().block_tokens as usize;
        let s = &mut self.running[i];
        s.spec.verified(drafted, accepted);
        s.table.truncate(s.computed.div_ceil(bt));
    }
}
