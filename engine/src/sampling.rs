//! Next-token selection from a logits row: greedy, temperature, top-k, top-p.
//!
//! Every request owns one [`Sampler`] with its own ChaCha8 RNG, seeded from the
//! request's `seed` (or from the OS when none is given). There is no global RNG,
//! so the same seed and the same logits give the same tokens regardless of what
//! else runs in the batch. Candidate ordering is total (logit descending, then
//! token id ascending), so ties never depend on sort stability or hash order.
//!
//! A request with a grammar (`response_format`, a forced tool call) gives
//! each sampler a matcher of its own ([`GrammarMatcher`]): the caller masks
//! the row with [`Sampler::constrain`] (the masked row is also the one
//! `logprobs` reports), samples, and hands the token back with
//! [`Sampler::accept`], which advances the grammar.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::grammar::GrammarMatcher;
use crate::request::SamplingParams;
use crate::EngineError;

/// Picks tokens for one request.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// Where this sample is in its grammar (None: unconstrained).
    grammar: Option<GrammarMatcher>,
    /// Scratch buffer reused across steps (candidate ids).
    candidates: Vec<u32>,
    /// Scratch buffer reused across steps (probabilities of `candidates`).
    probs: Vec<f32>,
}

/// Index of the largest finite-or-infinite, non-NaN logit; ties go to the lowest id.
/// An empty or all-NaN row yields 0.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in logits.iter().enumerate() {
        if x.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if x <= b => {}
            _ => best = Some((i, x)),
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

impl Sampler {
    /// A sampler for one request. `seed: None` draws the seed from the OS.
    pub fn new(params: &SamplingParams) -> Sampler {
        let rng = match params.seed {
            Some(seed) => ChaCha8Rng::seed_from_u64(seed),
            None => ChaCha8Rng::seed_from_u64(rand::random::<u64>()),
        };
        Sampler {
            params: params.clone(),
            rng,
            grammar: params.constraint.as_ref().map(|c| c.matcher()),
            candidates: Vec::new(),
            probs: Vec::new(),
        }
    }

    /// Set the logits of every token the grammar forbids next to -inf (a
    /// no-op without a grammar). Call before [`sample`](Self::sample).
    pub fn constrain(&mut self, logits: &mut [f32]) -> Result<(), EngineError> {
        match &mut self.grammar {
            Some(g) => g.mask(logits),
            None if self.params.constraint.is_some() => {
                Err(EngineError::Grammar(crate::GrammarFault::MatcherLost))
            }
            None => Ok(()),
        }
    }

    /// How many leading tokens of a speculative `draft` the grammar could
    /// still produce (all of them without a grammar).
    pub fn valid_draft(&mut self, draft: &[u32]) -> usize {
        match &mut self.grammar {
            Some(g) => g.valid_prefix(draft),
            None => draft.len(),
        }
    }

    /// Take the grammar matcher out (to compute its mask on another
    /// thread); give it back with [`put_grammar`](Self::put_grammar).
    pub fn take_grammar(&mut self) -> Option<GrammarMatcher> {
        self.grammar.take()
    }

    /// Give back what [`take_grammar`](Self::take_grammar) took.
    pub fn put_grammar(&mut self, grammar: GrammarMatcher) {
        self.grammar = Some(grammar);
    }

    /// Advance the grammar past the sampled `token` (not a stop id);
    /// returns true when the grammar is complete and allows nothing more.
    pub fn accept(&mut self, token: u32) -> Result<bool, EngineError> {
        match &mut self.grammar {
            Some(g) => {
                g.advance(token)?;
                Ok(g.is_stopped())
            }
            None => Ok(false),
        }
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether this sampler always takes the argmax (temperature 0 or top_k 1).
    pub fn is_greedy(&self) -> bool {
        self.params.temperature <= 0.0 || self.params.top_k == 1
    }

    /// Choose the next token from one logits row.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.is_greedy() || logits.len() <= 1 {
            return argmax(logits);
        }
        self.candidates.clear();
        self.candidates.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, x)| !x.is_nan() && **x != f32::NEG_INFINITY)
                .map(|(i, _)| i as u32),
        );
        if self.candidates.is_empty() {
            return argmax(logits);
        }
        let order = |a: &u32, b: &u32| {
            let (xa, xb) = (logits[*a as usize], logits[*b as usize]);
            xb.total_cmp(&xa).then(a.cmp(b))
        };
        let k = self.params.top_k;
        if k > 0 && k < self.candidates.len() {
            self.candidates.select_nth_unstable_by(k - 1, order);
            self.candidates.truncate(k);
            self.candidates.sort_unstable_by(order);
        }
        // Unnormalised softmax weights; `candidates` is in id order or sorted by
        // logit, so every sum below has a fixed order.
        let max = self
            .candidates
            .iter()
            .map(|&id| logits[id as usize])
            .fold(f32::NEG_INFINITY, f32::max);
        let inv_t = 1.0 / self.params.temperature;
        let weight = |id: u32| {
            let x = logits[id as usize];
            if max == f32::INFINITY {
                // +inf logits take all the mass, shared equally.
                if x == f32::INFINITY {
                    1.0
                } else {
                    0.0
                }
            } else {
                ((x - max) * inv_t).exp()
            }
        };
        let top_p = self.params.top_p;
        if top_p > 0.0 && top_p < 1.0 {
            let total: f32 = self.candidates.iter().map(|&id| weight(id)).sum();
            let keep = self.nucleus_len(logits, total * top_p, &weight);
            self.candidates.truncate(keep);
        }
        self.probs.clear();
        self.probs
            .extend(self.candidates.iter().map(|&id| weight(id)));
        let kept: f32 = self.probs.iter().sum();
        let draw = self.rng.random::<f32>() * kept;
        let mut acc = 0.0f32;
        for (&id, &w) in self.candidates.iter().zip(self.probs.iter()) {
            acc += w;
            if draw < acc {
                return id;
            }
        }
        // Rounding left `draw` at or past the last cumulative sum: take the last kept.
        self.candidates
            .last()
            .copied()
            .unwrap_or_else(|| argmax(logits))
    }

    /// Sort the best candidates to the front (logit descending, id ascending)
    /// and return how many are needed to reach `mass`. Sorts only a growing
    /// prefix, so a peaked distribution over a 49k vocabulary costs a few
    /// selections instead of a full sort.
    fn nucleus_len(&mut self, logits: &[f32], mass: f32, weight: &impl Fn(u32) -> f32) -> usize {
        let order = |a: &u32, b: &u32| {
            let (xa, xb) = (logits[*a as usize], logits[*b as usize]);
            xb.total_cmp(&xa).then(a.cmp(b))
        };
        let n = self.candidates.len();
        let mut m = n.min(64);
        loop {
            if m < n {
                self.candidates.select_nth_unstable_by(m - 1, order);
            }
            self.candidates[..m].sort_unstable_by(order);
            let mut acc = 0.0f32;
            for (i, &id) in self.candidates[..m].iter().enumerate() {
                acc += weight(id);
                if acc >= mass {
                    return i + 1;
                }
            }
            if m == n {
                return n;
            }
            m = (m * 4).min(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, top_k: usize, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k,
            seed: Some(seed),
            constraint: None,
        }
    }

    #[test]
    fn greedy_takes_argmax_and_ties_go_to_lowest_id() {
        let mut s = Sampler::new(&SamplingParams::default());
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9]), 1);
        assert_eq!(s.sample(&[1.0, 5.0, 5.0, 5.0]), 1);
        assert_eq!(s.sample(&[f32::NAN, 0.5, f32::NAN, 0.7]), 3);
        assert_eq!(argmax(&[]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    }

    #[test]
    fn top_k_one_is_greedy_even_with_temperature() {
        let mut s = Sampler::new(&params(1.5, 1.0, 1, 7));
        for _ in 0..50 {
            assert_eq!(s.sample(&[0.0, 1.0, 0.99, 0.5]), 1);
        }
    }

    #[test]
    fn same_seed_same_tokens_and_different_seeds_differ() {
        let logits: Vec<f32> = (0..64).map(|i| ((i * 37) % 11) as f32 * 0.1).collect();
        let run = |seed| {
            let mut s = Sampler::new(&params(1.0, 1.0, 0, seed));
            (0..200).map(|_| s.sample(&logits)).collect::<Vec<u32>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn top_k_never_picks_outside_the_k_best() {
        let logits = [5.0, 4.0, 3.0, 10.0, 9.0, 0.0, 8.0];
        let mut s = Sampler::new(&params(5.0, 1.0, 3, 1));
        let mut seen = [false; 7];
        for _ in 0..2000 {
            seen[s.sample(&logits) as usize] = true;
        }
        assert_eq!(seen, [false, false, false, true, true, false, true]);
    }

    #[test]
    fn top_p_keeps_the_smallest_prefix_reaching_the_mass() {
        // probs ~ [0.6439, 0.2369, 0.0871, 0.0321] at temperature 1.
        let logits = [3.0, 2.0, 1.0, 0.0];
        let mut s = Sampler::new(&params(1.0, 0.85, 0, 3));
        let mut seen = [0usize; 4];
        for _ in 0..4000 {
            seen[s.sample(&logits) as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
        assert_eq!(seen[2] + seen[3], 0, "{seen:?}");
        // Renormalised over the two kept: 0.731 / 0.269.
        let frac = seen[0] as f64 / 4000.0;
        assert!((frac - 0.731).abs() < 0.05, "{frac}");
    }

    #[test]
    fn top_p_over_a_wide_flat_distribution_keeps_the_lowest_ids() {
        // 1000 equal logits, top_p 0.5: the nucleus is ids 0..500 (ties by id),
        // wider than the first selection window, so the prefix must grow.
        let logits = vec![1.0f32; 1000];
        let mut s = Sampler::new(&params(1.0, 0.5, 0, 9));
        let picks: Vec<u32> = (0..5000).map(|_| s.sample(&logits)).collect();
        assert!(picks.iter().all(|&t| t < 500), "outside the nucleus");
        assert!(picks.iter().any(|&t| t >= 400) && picks.iter().any(|&t| t < 100));
    }

    #[test]
    fn temperature_sampling_follows_the_softmax() {
        let logits = [0.0f32, (3.0f32).ln()]; // probs 0.25 / 0.75 at T=1
        let mut s = Sampler::new(&params(1.0, 1.0, 0, 11));
        let n = 8000;
        let ones = (0..n).filter(|_| s.sample(&logits) == 1).count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.03, "{frac}");
        // A low temperature sharpens towards the argmax.
        let mut cold = Sampler::new(&params(0.1, 1.0, 0, 11));
        assert!((0..1000).all(|_| cold.sample(&logits) == 1));
    }

    #[test]
    fn nan_and_negative_infinity_are_never_sampled() {
        let logits = [f32::NAN, 1.0, f32::NEG_INFINITY, 1.0];
        let mut s = Sampler::new(&params(1.0, 1.0, 0, 5));
        for _ in 0..500 {
            let t = s.sample(&logits);
            assert!(t == 1 || t == 3, "{t}");
        }
        let mut inf = Sampler::new(&params(1.0, 1.0, 0, 5));
        assert!((0..100).all(|_| inf.sample(&[0.0, f32::INFINITY, 2.0]) == 1));
    }
}
