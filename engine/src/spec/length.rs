//! How many drafted tokens to verify: the length that maximises the
//! expected tokens per unit of forward-pass cost.
//!
//! A verified row is not free: at batch 1 a pass of 1 + k rows costs about
//! `1 + base + row * k` single-row passes, and what `base` and `row` are
//! depends on the machine. On an AVX-512 Zen 5 the reference model measured
//! 1.28 at k = 1 and 2.2 at k = 7 (`kvfabric bench spec`'s `verify_cost`;
//! [`PassCost::default`]); on an AVX2 Zen 3 each extra row cost about one
//! whole single-row pass, where drafting by those figures made free chat
//! 15% slower than no speculation. So the scheduler measures its own
//! machine's [`PassCost`] (`spec::calibrate`) when it starts. A draft
//! pays only when enough of it is accepted, and how much is
//! accepted depends on how the draft was found: a suffix match of 8 tokens
//! (a file or a JSON argument being copied) is right far more often than a
//! match of 2. [`DraftLength`] keeps, per request and per match class, the
//! tokens accepted and the drafts cut short (a geometric model: each drafted
//! token is accepted with probability `p = accepted / (accepted + cut)`), and
//! drafts the `k` maximising `(1 + p + ... + p^k) / cost(k)`, none when no
//! `k` beats a plain step. Counts start from a prior worth [`PRIOR_WEIGHT`]
//! drafts, so a class with little evidence follows the prior.

/// Weight of the prior, in drafts' worth of evidence.
const PRIOR_WEIGHT: f32 = 16.0;

/// What a pass of 1 + k rows costs, in single-row passes: `1 + base + row * k`
/// for k > 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PassCost {
    /// Extra cost of a pass with any verified row.
    pub base: f32,
    /// Extra cost of each verified row.
    pub row: f32,
}

impl Default for PassCost {
    /// The reference model on an AVX-512 Zen 5 (module doc).
    fn default() -> Self {
        PassCost {
            base: 0.13,
            row: 0.16,
        }
    }
}

impl PassCost {
    /// The cost model through measured pass times: `t0` of 1 row, `t1` of
    /// 2 rows and `tk` of 1 + `k` rows (k > 1), any unit. Noise that makes a
    /// term negative leaves it 0.
    pub fn fit(t0: f64, t1: f64, k: usize, tk: f64) -> PassCost {
        let t0 = t0.max(f64::MIN_POSITIVE);
        let row = ((tk - t1) / (k.max(2) - 1) as f64 / t0).max(0.0);
        let base = (t1 / t0 - 1.0 - row).max(0.0);
        PassCost {
            base: base as f32,
            row: row as f32,
        }
    }

    /// Cost of a pass of 1 + `k` rows, in single-row passes.
    pub fn of(&self, k: usize) -> f32 {
        if k == 0 {
            1.0
        } else {
            1.0 + self.base + self.row * k as f32
        }
    }
}

/// What a draft was found by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchClass {
    /// A suffix match of 2 or 3 tokens.
    Short,
    /// A suffix match of 4 to 7 tokens.
    Mid,
    /// A suffix match of 8 tokens, or another request's continuation of
    /// the same 8 tokens.
    Long,
}

impl MatchClass {
    /// The class of a suffix match of `n` tokens (`n >= 2`).
    pub fn of(n: usize) -> MatchClass {
        match n {
            0..=3 => MatchClass::Short,
            4..=7 => MatchClass::Mid,
            _ => MatchClass::Long,
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// Acceptance per drafted token assumed before any evidence.
    fn prior(self) -> f32 {
        match self {
            MatchClass::Short => 0.6,
            MatchClass::Mid => 0.8,
            MatchClass::Long => 0.9,
        }
    }
}

/// One request's acceptance evidence per match class.
#[derive(Clone, Debug)]
pub struct DraftLength {
    /// Per class: drafted tokens accepted (prior included).
    accepted: [f32; 3],
    /// Per class: drafts cut short by a rejected token (prior included).
    cut: [f32; 3],
}

impl Default for DraftLength {
    fn default() -> Self {
        let classes = [MatchClass::Short, MatchClass::Mid, MatchClass::Long];
        DraftLength {
            accepted: classes.map(|c| c.prior() * PRIOR_WEIGHT),
            cut: classes.map(|c| (1.0 - c.prior()) * PRIOR_WEIGHT),
        }
    }
}

impl DraftLength {
    /// Estimated acceptance of one drafted token of class `c`.
    pub fn acceptance(&self, c: MatchClass) -> f32 {
        let i = c.index();
        self.accepted[i] / (self.accepted[i] + self.cut[i])
    }

    /// Tokens to verify of a draft of class `c` with `available` tokens (0:
    /// none), passes costing `cost`.
    pub fn choose(&self, c: MatchClass, available: usize, cost: &PassCost) -> usize {
        let p = self.acceptance(c);
        let (mut best, mut best_k) = (1.0f32, 0);
        let (mut pk, mut expected) = (1.0f32, 0.0f32);
        for k in 1..=available {
            pk *= p;
            expected += pk;
            let v = (1.0 + expected) / cost.of(k);
            if v > best {
                (best, best_k) = (v, k);
            }
        }
        best_k
    }

    /// A draft of class `c` of `drafted` tokens had `accepted` kept.
    pub fn record(&mut self, c: MatchClass, drafted: usize, accepted: usize) {
        let i = c.index();
        self.accepted[i] += accepted as f32;
        if accepted < drafted {
            self.cut[i] += 1.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longer_drafts_for_longer_matches_and_none_when_drafts_keep_failing() {
        let c = PassCost::default();
        let mut l = DraftLength::default();
        let (short, long) = (
            l.choose(MatchClass::Short, 15, &c),
            l.choose(MatchClass::Long, 15, &c),
        );
        assert!(
            0 < short && short < long,
            "priors: short {short}, long {long}"
        );
        assert_eq!(
            l.choose(MatchClass::Long, 3, &c),
            3,
            "at most what is available"
        );
        // A copying request: long drafts all accepted -> the longest draft.
        for _ in 0..20 {
            l.record(MatchClass::Long, 15, 15);
        }
        assert_eq!(l.choose(MatchClass::Long, 15, &c), 15);
        // Short matches that keep failing stop drafting; the long class is unaffected.
        for _ in 0..20 {
            l.record(MatchClass::Short, 2, 0);
        }
        assert_eq!(l.choose(MatchClass::Short, 15, &c), 0);
        assert_eq!(l.choose(MatchClass::Long, 15, &c), 15);
    }

    #[test]
    fn the_chosen_length_maximises_expected_tokens_per_cost() {
        let l = DraftLength::default();
        let costly = PassCost::fit(10.0, 20.0, 8, 90.0);
        for cost in [PassCost::default(), costly] {
            for c in [MatchClass::Short, MatchClass::Mid, MatchClass::Long] {
                let p = l.acceptance(c);
                let value = |k: usize| {
                    let e: f32 = (1..=k).map(|i| p.powi(i as i32)).sum();
                    (1.0 + e) / cost.of(k)
                };
                let k = l.choose(c, 15, &cost);
                for other in 0..=15 {
                    assert!(value(k) >= value(other), "{c:?}: {k} vs {other}");
                }
            }
        }
    }

    /// Where a verified row costs over half a pass (an AVX2 machine: `bench
    /// spec`'s `verify_cost` there, 15.7 / 34.6 / 97.7 ms at k = 0 / 1 / 8),
    /// the priors of short and mid matches draft nothing and long ones draft
    /// less; a request that keeps copying whole long drafts still drafts.
    #[test]
    fn rows_costing_over_half_a_pass_draft_less_and_short_matches_not_at_all() {
        let cost = PassCost::fit(15.7, 34.6, 8, 97.7);
        assert!(cost.row > 0.5 && cost.base > 0.5, "{cost:?}");
        let mut l = DraftLength::default();
        for c in [MatchClass::Short, MatchClass::Mid] {
            assert_eq!(l.choose(c, 15, &cost), 0, "{c:?}");
        }
        let long = l.choose(MatchClass::Long, 15, &cost);
        assert!(long < l.choose(MatchClass::Long, 15, &PassCost::default()));
        for _ in 0..200 {
            l.record(MatchClass::Long, 15, 15);
        }
        assert!(l.choose(MatchClass::Long, 15, &cost) > 0);
    }

    #[test]
    fn the_fit_recovers_a_linear_cost_and_clamps_noise() {
        let c = PassCost::fit(4.0, 4.0 * 1.3, 8, 4.0 * (1.1 + 0.2 * 8.0));
        assert!(
            (c.row - 0.2).abs() < 1e-4 && (c.base - 0.1).abs() < 1e-4,
            "{c:?}"
        );
        let noisy = PassCost::fit(4.0, 3.9, 8, 3.8);
        assert_eq!((noisy.base, noisy.row), (0.0, 0.0));
    }
}
