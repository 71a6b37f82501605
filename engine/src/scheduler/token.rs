//! Taking tokens: account a computed chunk ([`Scheduler::advance`]),
//! register its full blocks (and queue them for saving), sample from each
//! logits row, send the token, and decide whether the sequence is finished.
//! [`take_token`] is shared by a sequence's own steps and by forks taking
//! their first token (`fork.rs`).

use super::seq::Seq;
use super::{fabric, Role, Scheduler};
use crate::request::{FinishReason, GenerationEvent, Usage};

/// Sample the next token of `s` from `logits` and send it; returns the
/// token, or None when the sequence is finished. A prefill-role engine with a fabric
/// (`flush`) answers once its saves are done. A grammar masks the row
/// first (the masked row is the one sent for logprobs), and a grammar
/// that is complete after the token ends the sample (`stop`).
pub(super) fn take_token(
    s: &mut Seq,
    mut logits: Vec<f32>,
    role: Role,
    flush: bool,
    ctx: usize,
) -> Option<u32> {
    if let Err(e) = s.sampler.constrain(&mut logits) {
        let _ = s
            .events
            .blocking_send(GenerationEvent::Error(e.to_string()));
        return None;
    }
    let tok = s.sampler.sample(&logits);
    if s.stop.contains(&tok) {
        finish(s, FinishReason::Stop, flush);
        return None;
    }
    let complete = match s.sampler.accept(tok) {
        Ok(complete) => complete,
        Err(e) => {
            let _ = s
                .events
                .blocking_send(GenerationEvent::Error(e.to_string()));
            return None;
        }
    };
    let ev = GenerationEvent::Token {
        id: tok,
        logits: s.return_logits.then_some(logits),
    };
    if s.events.blocking_send(ev).is_err() {
        return None;
    }
    s.tokens.push(tok);
    s.generated += 1;
    if complete {
        finish(s, FinishReason::Stop, flush);
        return None;
    }
    if s.generated >= s.max_tokens || s.tokens.len() >= ctx || role == Role::Prefill {
        finish(s, FinishReason::Length, flush);
        return None;
    }
    Some(tok)
}

/// End `s` for `reason`: now, or (`flush`) once its saves are done.
fn finish(s: &mut Seq, reason: FinishReason, flush: bool) {
    let usage = Usage {
        prompt_tokens: s.prompt_len,
        completion_tokens: s.generated,
        cached_tokens: s.cached_tokens.unwrap_or(0),
    };
    if flush {
        s.finished = Some((reason, usage));
    } else {
        let _ = s
            .events
            .blocking_send(GenerationEvent::Finished { reason, usage });
    }
}

impl Scheduler {
    /// Account a computed chunk and sample its logits rows (one, or one
    /// per verified draft token and one more); returns true when the
    /// sequence is finished.
    pub(super) fn advance(&mut self, i: usize, n: usize, rows: Vec<Vec<f32>>) -> bool {
        let drafts = self.running[i].take_drafts();
        let s = &mut self.running[i];
        let computed = n - drafts.len();
        // Prompt tokens this chunk computed (drafts are never prompt tokens).
        let prompt_part = (s.computed + computed)
            .min(s.prompt_len)
            .saturating_sub(s.computed);
        self.cfg
            .metrics
            .prompt_tokens_computed
            .inc_by(prompt_part as u64);
        s.computed += computed;
        self.register_full(i);
        let mut accepted = 0;
        let mut finished = false;
        for (j, logits) in rows.into_iter().enumerate() {
            match self.emit(i, logits) {
                None => {
                    finished = true;
                    break;
                }
                // The drafted token is the sampled one: its KV row stands.
                Some(tok) if drafts.get(j) == Some(&tok) => {
                    accepted += 1;
                    self.running[i].computed += 1;
                    self.register_full(i);
                }
                Some(_) => break,
            }
        }
        if !drafts.is_empty() {
            self.verified(i, drafts.len(), accepted);
        }
        finished
    }

    /// Register (and queue for saving) every block of sequence `i` whose
    /// tokens are all computed.
    fn register_full(&mut self, i: usize) {
        let bt = self.kv.layout().block_tokens as usize;
        let s = &mut self.running[i];
        while (s.registered + 1) * bt <= s.computed {
            let r = s.registered;
            let key = s
                .chain
                .next(s.parent.as_ref(), &s.tokens[r * bt..(r + 1) * bt]);
            s.table.register(r, key);
            s.parent = Some(key);
            s.registered += 1;
            if let Some(c) = &self.connector {
                fabric::save_block(c.as_ref(), &mut self.saves, s, r, key, bt);
            }
        }
    }

    /// Sample the next token of sequence `i` from `logits` and send it;
    /// None when the sequence finished (stop token, length, gone). The
    /// prompt's first logits also start its other samples (`n`; fork.rs).
    fn emit(&mut self, i: usize, logits: Vec<f32>) -> Option<u32> {
        let role = self.cfg.role;
        let ctx = self.model.config.context_length;
        if !self.running[i].forks.is_empty() {
            self.spawn_forks(i, &logits);
        }
        // A prefill-role engine with a fabric answers once its saves are done.
        let flush = role == Role::Prefill && self.connector.is_some();
        take_token(&mut self.running[i], logits, role, flush, ctx)
    }
}
