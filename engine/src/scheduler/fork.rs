//! `n` samples of one prompt: the prompt is computed once, by the request's
//! own sequence; when its logits arrive each fork becomes a sequence of
//! its own.
//!
//! A fork holds one more reference to each of the prompt's full blocks
//! (`BlockTable::share`, the same owned handles the prefix cache uses, so
//! dropping the fork gives them back) and its own copy of the partial last
//! block, which it writes its first generated tokens into. It takes its
//! first token from the same logits row with its own sampler, then decodes
//! like any sequence; preempted, it recomputes from the prefix cache like
//! any other. `prompt_tokens_computed` counts the prompt once for all `n`.

use super::seq::Seq;
use super::token::take_token;
use super::{Role, Scheduler};
use crate::request::GenerationEvent;
use crate::sampling::Sampler;

impl Scheduler {
    /// Start every fork of running sequence `i` (its prompt just computed,
    /// `logits` its last row) and add them to the running set.
    pub(super) fn spawn_forks(&mut self, i: usize, logits: &[f32]) {
        let bt = self.kv.layout().block_tokens as usize;
        let role = self.cfg.role;
        let flush = role == Role::Prefill && self.connector.is_some();
        let ctx = self.model.config.context_length;
        let forks = std::mem::take(&mut self.running[i].forks);
        for fork in forks {
            let parent = &self.running[i];
            let full = parent.computed / bt;
            let mut table = parent.table.share(0..full);
            if !parent.computed.is_multiple_of(bt) {
                if !table.grow() {
                    let _ = fork.events.blocking_send(GenerationEvent::Error(
                        "no KV block left for another sample".into(),
                    ));
                    continue;
                }
                let (src, dst) = (parent.table.ids()[full], table.ids()[full]);
                self.kv.copy_block(src, dst);
            }
            self.next_id += 1;
            let mut child = Seq {
                id: self.next_id,
                events: fork.events,
                tokens: parent.tokens.clone(),
                prompt_len: parent.prompt_len,
                computed: parent.computed,
                table,
                registered: parent.registered,
                parent: parent.parent,
                chain: parent.chain.clone(),
                sampler: Sampler::new(&fork.sampling),
                max_tokens: parent.max_tokens,
                generated: 0,
                stop: parent.stop.clone(),
                return_logits: parent.return_logits,
                cached_tokens: parent.cached_tokens,
                fabric: parent.fabric.clone(),
                finished: None,
                stream: None,
                forks: Vec::new(),
                spec: parent.spec.clone(),
                drafted: 0,
                batch: parent.batch,
                owner: parent.owner.clone(),
            };
            let cached_tokens = child.cached_tokens.unwrap_or(0);
            let _ = child
                .events
                .blocking_send(GenerationEvent::Admitted { cached_tokens });
            if take_token(&mut child, logits.to_vec(), role, flush, ctx).is_some() {
                self.running.push(child);
            } else if child.finished.is_some() {
                self.start_flush(child);
            }
        }
    }
}
