//! The most prompt lookup could give on a workload: every draft of the
//! request's own context (the engine's [`ContextIndex`], `max_draft`
//! tokens) verified at exactly the length that is then accepted, each pass
//! costing what this run's `verify_cost` measured for that length, over the
//! tokens that decoding without speculation generated. No length policy
//! knows in advance how much of a draft will be accepted, so the engine's
//! `on_vs_off` stays below this `ceiling_on_vs_off` (which also leaves out
//! drafting and the scheduler's own time); the gap is what a better length
//! policy could still win, the ceiling what only a better drafter or
//! cheaper verified rows can move.

use kvfabric_engine::spec::length::PassCost;
use kvfabric_engine::spec::ngram::ContextIndex;
use serde_json::{json, Value};

/// Tokens per pass cost, and tokens per pass, of the ceiling on `outputs`
/// (answers to `prompts`, the first token of each from the prefill).
pub fn ceiling(
    prompts: &[Vec<u32>],
    outputs: &[Vec<u32>],
    max_draft: usize,
    cost: &PassCost,
) -> Value {
    let (mut tokens, mut passes, mut spent) = (0usize, 0usize, 0f64);
    let mut draft = Vec::new();
    for (prompt, out) in prompts.iter().zip(outputs) {
        let mut index = ContextIndex::new();
        let mut ctx = prompt.clone();
        ctx.extend(out.first());
        let mut i = 1;
        while i < out.len() {
            draft.clear();
            index.draft(&ctx, max_draft, &mut draft);
            let rest = &out[i..];
            let a = draft.iter().zip(rest).take_while(|(d, o)| d == o).count();
            // The accepted tokens and the one sampled after them.
            let step = (a + 1).min(rest.len());
            ctx.extend_from_slice(&rest[..step]);
            (tokens, passes, i) = (tokens + step, passes + 1, i + step);
            spent += f64::from(cost.of(a));
        }
    }
    json!({
        "ceiling_on_vs_off": tokens as f64 / spent.max(f64::MIN_POSITIVE),
        "ceiling_acceptance_length": tokens as f64 / passes.max(1) as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copied_answer_is_drafted_whole_and_a_novel_one_not_at_all() {
        let cost = PassCost::linear(0.0, 0.25);
        // The answer copies the prompt: after its first token ("1 2") the
        // draft is 3..=10 and on, all 8 left accepted: one pass of cost 3.
        let prompt: Vec<u32> = (1..=10).chain([1]).collect();
        let copy: Vec<Vec<u32>> = vec![(2..=10).collect()];
        let c = ceiling(std::slice::from_ref(&prompt), &copy, 15, &cost);
        assert_eq!(c["ceiling_acceptance_length"], 8.0);
        assert!((c["ceiling_on_vs_off"].as_f64().unwrap_or(0.0) - 8.0 / 3.0).abs() < 1e-9);
        // Nothing to copy: one token per single-row pass.
        let novel = vec![vec![50, 51, 52, 53]];
        let c = ceiling(&[prompt], &novel, 15, &cost);
        assert_eq!(c["ceiling_on_vs_off"], 1.0);
        assert_eq!(c["ceiling_acceptance_length"], 1.0);
    }
}
