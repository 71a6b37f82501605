//! How many drafted tokens to verify: the length that maximises the
//! expected tokens per unit of forward-pass cost.
//!
//! A verified row is not free: a pass of 1 + k rows costs [`PassCost::of`]
//! single-row passes, and how much that is depends on the machine and on k
//! (the kernels take rows in passes, so the cost is a staircase). On an
//! AVX-512 Zen 5 the reference model measured 1.28 at k = 1 and 2.2 at k =
//! 7 (`kvfabric bench spec`'s `verify_cost`; [`PassCost::default`]); on an
//! AVX2 Zen 3 each extra row once cost about one whole single-row pass,
//! where drafting by those figures made free chat 15% slower than no
//! speculation. So the scheduler measures its own machine's cost per k
//! (`spec::calibrate`) when it starts. A draft
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

/// Draft lengths a [`PassCost`] holds a cost for; past it the cost grows by
/// the last measured row's.
pub const TABLE_K: usize = 16;

/// What a pass of 1 + k rows costs, in single-row passes, per k.
///
/// Measured per k, not fitted to a line: the kernels take rows in passes
/// (on AVX-512 up to 8 rows dequantize each weight once, 9..=16 twice), so
/// the cost is a staircase. On an AVX-512 Zen 4 the first verified row cost
/// 0.44 of a pass and each of the next six 0.22-0.25, then the ninth row
/// 0.59 (`bench spec`'s `verify_cost`); a line through 1, 2 and 9 rows put
/// every row at 0.40, and the drafts chosen by it were shorter than paid.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PassCost {
    /// `by_k[k]`: a pass of 1 + k rows; `by_k[0] = 1`, never decreasing.
    by_k: [f32; TABLE_K + 1],
}

impl Default for PassCost {
    /// The reference model on an AVX-512 Zen 5 (module doc).
    fn default() -> Self {
        PassCost::linear(0.13, 0.16)
    }
}

impl PassCost {
    /// `1 + base + row * k` for k > 0 (`[engine.spec] verify_base_cost`,
    /// `verify_row_cost`).
    pub fn linear(base: f32, row: f32) -> PassCost {
        PassCost {
            by_k: std::array::from_fn(|k| {
                if k == 0 {
                    1.0
                } else {
                    1.0 + base + row * k as f32
                }
            }),
        }
    }

    /// The costs through measured pass times `(k, time)`, any unit, one of
    /// them at k = 0: k's between two measured ones are interpolated
    /// linearly, k's past the last one follow its slope. Noise that would
    /// make a longer draft cheaper than a shorter one is levelled (each
    /// cost is at least the one before it). None without a positive time at
    /// k = 0.
    pub fn from_times(times: &[(usize, f64)]) -> Option<PassCost> {
        let mut pts: Vec<(usize, f64)> = times
            .iter()
            .copied()
            .filter(|&(k, t)| k <= TABLE_K && t.is_finite())
            .collect();
        pts.sort_by_key(|&(k, _)| k);
        pts.dedup_by_key(|&mut (k, _)| k);
        let t0 = pts.first().filter(|&&(k, t)| k == 0 && t > 0.0)?.1;
        let at = |k: usize| -> f64 {
            let i = pts.partition_point(|&(pk, _)| pk <= k);
            let (k0, t0) = pts[i - 1];
            if k0 == k {
                return t0;
            }
            // Between two points, or past the last one on the last slope.
            let (a, b) = match pts.get(i) {
                Some(&next) => ((k0, t0), next),
                None if i >= 2 => (pts[i - 2], (k0, t0)),
                None => return t0,
            };
            a.1 + (b.1 - a.1) * (k - a.0) as f64 / (b.0 - a.0) as f64
        };
        let mut by_k = [1.0f32; TABLE_K + 1];
        for k in 1..=TABLE_K {
            by_k[k] = by_k[k - 1].max((at(k) / t0) as f32);
        }
        Some(PassCost { by_k })
    }

    /// Cost of a pass of 1 + `k` rows, in single-row passes.
    pub fn of(&self, k: usize) -> f32 {
        match self.by_k.get(k) {
            Some(&c) => c,
            None => {
                let last = self.by_k[TABLE_K];
                last + (last - self.by_k[TABLE_K - 1]) * (k - TABLE_K) as f32
            }
        }
    }

    /// The costs of k = 0..=[`TABLE_K`] (for logs and reports).
    pub fn table(&self) -> &[f32] {
        &self.by_k
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
        let costly = PassCost::from_times(&[(0, 10.0), (1, 20.0), (8, 90.0)]).expect("costs");
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
        let cost = PassCost::from_times(&[(0, 15.7), (1, 34.6), (8, 97.7)]).expect("costs");
        assert!(
            cost.of(1) > 2.0 && cost.of(2) - cost.of(1) > 0.5,
            "{cost:?}"
        );
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
    fn measured_costs_are_interpolated_extrapolated_and_never_decrease() {
        // A staircase: rows 1..=7 cheap, the 9th row a second pass.
        let times = [
            (0, 4.0),
            (1, 5.6),
            (4, 8.0),
            (7, 10.4),
            (8, 13.0),
            (9, 14.0),
        ];
        let c = PassCost::from_times(&times).expect("costs");
        assert_eq!(c.of(0), 1.0);
        assert!((c.of(1) - 1.4).abs() < 1e-6, "{c:?}");
        assert!((c.of(2) - 1.6).abs() < 1e-6, "interpolated: {c:?}");
        assert!((c.of(8) - 3.25).abs() < 1e-6, "{c:?}");
        // Past the last point, on its slope (0.25 per row), also past the table.
        assert!((c.of(11) - 4.0).abs() < 1e-5, "{c:?}");
        assert!(
            (c.of(TABLE_K + 2) - (3.5 + 0.25 * 9.0)).abs() < 1e-4,
            "{c:?}"
        );
        // The line through a linear machine's points is the linear model.
        let lin = PassCost::from_times(&[(0, 4.0), (1, 4.0 * 1.3), (8, 4.0 * 2.7)]);
        let want = PassCost::linear(0.1, 0.2);
        for k in 0..=TABLE_K + 3 {
            let (a, b) = (lin.expect("costs").of(k), want.of(k));
            assert!((a - b).abs() < 1e-4, "k {k}: {a} vs {b}");
        }
        // Noise never makes a longer draft cheaper; no time at k = 0, no model.
        let noisy = PassCost::from_times(&[(0, 4.0), (1, 3.9), (2, 5.0), (3, 4.8)]).expect("noisy");
        assert_eq!(noisy.table()[..4], [1.0, 1.0, 1.25, 1.25]);
        assert!(noisy.table().windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(PassCost::from_times(&[(1, 4.0), (2, 5.0)]), None);
        assert_eq!(PassCost::from_times(&[(0, 0.0), (2, 5.0)]), None);
    }
}
