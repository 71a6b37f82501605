//! Token log-probabilities (`logprobs`, `top_logprobs`) and their two wire
//! shapes: the chat API's `logprobs.content[]` list and the completions
//! API's parallel arrays (`tokens`, `token_logprobs`, `top_logprobs`,
//! `text_offset`).
//!
//! Computed from the very logits row the sampler chose the token from (the
//! scheduler sends it with the token when the request asks for logprobs):
//! a log-softmax in f64, so a 49k-entry row sums without f32 rounding. The
//! top list is ordered as the greedy sampler orders candidates (logit
//! descending, then id ascending), so the first entry is the greedy token.

use serde_json::{json, Map, Value};

use crate::tokenizer::Tokenizer;

/// Chat API limit on `top_logprobs`.
pub(super) const MAX_TOP_LOGPROBS_CHAT: usize = 20;
/// Completions API limit on `logprobs`.
pub(super) const MAX_TOP_LOGPROBS_COMPLETION: usize = 5;

/// One generated token's log-probability and its best alternatives.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TokenLogprob {
    pub id: u32,
    pub logprob: f64,
    /// (id, logprob), most likely first; `top` entries asked for.
    pub top: Vec<(u32, f64)>,
}

/// Log-softmax of `logits` at `id`, and the `top` most likely ids.
pub(crate) fn token_logprob(logits: &[f32], id: u32, top: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let sum: f64 = logits
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&x| (x as f64 - max).exp())
        .sum();
    let log_z = max + sum.ln();
    let lp = |i: u32| {
        let x = logits.get(i as usize).copied().unwrap_or(f32::NAN);
        if x.is_nan() {
            f64::NEG_INFINITY
        } else {
            x as f64 - log_z
        }
    };
    let mut ids: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| !logits[i as usize].is_nan())
        .collect();
    let order = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let k = top.min(ids.len());
    if k > 0 && k < ids.len() {
        ids.select_nth_unstable_by(k - 1, order);
    }
    ids.truncate(k);
    ids.sort_unstable_by(order);
    TokenLogprob {
        id,
        logprob: lp(id),
        top: ids.into_iter().map(|i| (i, lp(i))).collect(),
    }
}

fn token_string(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer.token_bytes(id).unwrap_or_default().to_vec();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// JSON of a logprob: f64 -> a JSON number, -inf -> -9999 (as OpenAI does).
fn number(lp: f64) -> Value {
    json!(if lp.is_finite() { lp } else { -9999.0 })
}

/// The chat API's `logprobs` object: `{"content": [...]}`.
pub(super) fn chat_json(tokenizer: &Tokenizer, tokens: &[TokenLogprob]) -> Value {
    let entry = |id: u32, lp: f64| {
        let (token, bytes) = token_string(tokenizer, id);
        json!({"token": token, "logprob": number(lp), "bytes": bytes})
    };
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(t.id, t.logprob);
            e["top_logprobs"] = t.top.iter().map(|&(i, lp)| entry(i, lp)).collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// The completions API's `logprobs` object; `offset` is the text length
/// before the first token (the echoed prompt, or earlier chunks).
pub(super) fn completion_json(
    tokenizer: &Tokenizer,
    tokens: &[TokenLogprob],
    offset: usize,
) -> Value {
    let mut strings = Vec::with_capacity(tokens.len());
    let mut offsets = Vec::with_capacity(tokens.len());
    let mut at = offset;
    for t in tokens {
        let (s, _) = token_string(tokenizer, t.id);
        offsets.push(at);
        at += s.len();
        strings.push(s);
    }
    let top: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut m = Map::new();
            for &(i, lp) in &t.top {
                m.insert(token_string(tokenizer, i).0, number(lp));
            }
            Value::Object(m)
        })
        .collect();
    json!({
        "tokens": strings,
        "token_logprobs": tokens.iter().map(|t| number(t.logprob)).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::argmax;

    #[test]
    fn log_softmax_sums_to_one_and_top_starts_with_argmax() {
        let logits = [1.0f32, 3.0, 3.0, -2.0, f32::NAN, 0.5];
        let t = token_logprob(&logits, 5, 3);
        let total: f64 = [0u32, 1, 2, 3, 5]
            .iter()
            .map(|&i| token_logprob(&logits, i, 0).logprob.exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-12, "{total}");
        assert_eq!(
            t.top[0].0,
            argmax(&logits),
            "ties go to the lowest id, as greedy"
        );
        assert_eq!(t.top.iter().map(|p| p.0).collect::<Vec<_>>(), vec![1, 2, 0]);
        assert!((t.logprob - token_logprob(&logits, 5, 0).logprob).abs() < 1e-15);
        // exp(0.5 - logZ) by hand.
        let z: f64 = [1.0f64, 3.0, 3.0, -2.0, 0.5].iter().map(|x| x.exp()).sum();
        assert!((t.logprob - (0.5 - z.ln())).abs() < 1e-9);
    }

    #[test]
    fn large_logits_do_not_overflow() {
        let logits = [1000.0f32, 999.0];
        let t = token_logprob(&logits, 0, 2);
        assert!(
            (t.logprob - (-(1.0 + (-1.0f64).exp()).ln())).abs() < 1e-9,
            "{t:?}"
        );
    }
}
