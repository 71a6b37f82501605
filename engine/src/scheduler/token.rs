//! Taking one token: sample from the logits row, send it, and decide
//! whether the sequence is finished. Shared by a sequence's own steps
//! (`advance`) and by forks taking their first token (`fork.rs`).

use super::{Role, Seq};
use crate::request::{FinishReason, GenerationEvent, Usage};

/// Sample the next token of `s` from `logits` and send it; returns the
/// token, or None when the sequence is finished. A prefill-role engine with a fabric
/// (`flush`) answers once its saves are done.
pub(super) fn take_token(
    s: &mut Seq,
    logits: Vec<f32>,
    role: Role,
    flush: bool,
    ctx: usize,
) -> Option<u32> {
    let tok = s.sampler.sample(&logits);
    let usage = |s: &Seq| Usage {
        prompt_tokens: s.prompt_len,
        completion_tokens: s.generated,
        cached_tokens: s.cached_tokens.unwrap_or(0),
    };
    if s.stop.contains(&tok) {
        if flush {
            s.finished = Some((FinishReason::Stop, usage(s)));
        } else {
            let _ = s.events.blocking_send(GenerationEvent::Finished {
                reason: FinishReason::Stop,
                usage: usage(s),
            });
        }
        return None;
    }
    let ev = GenerationEvent::Token {
        id: tok,
        logits: s.return_logits.then_some(logits),
    };
    if s.events.blocking_send(ev).is_err() {
        return None;
    }
    s.tokens.push(tok);
    s.generated += 1;
    if s.generated >= s.max_tokens || s.tokens.len() >= ctx || role == Role::Prefill {
        if flush {
            s.finished = Some((FinishReason::Length, usage(s)));
        } else {
            let _ = s.events.blocking_send(GenerationEvent::Finished {
                reason: FinishReason::Length,
                usage: usage(s),
            });
        }
        return None;
    }
    Some(tok)
}
