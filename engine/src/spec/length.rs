//! How many drafted tokens to verify: the length that maximises the
//! expected tokens per unit of forward-pass cost.
//!
//! A verified row is not free: on the reference model at batch 1 a pass of
//! 1 + k rows costs about `1 + VERIFY_BASE + VERIFY_ROW * k` single-row
//! passes (`kvfabric bench spec`'s `verify_cost`: 1.28 at k = 1, 2.2 at
//! k = 7). A draft pays only when enough of it is accepted, and how much is
//! accepted depends on how the draft was found: a suffix match of 8 tokens
//! (a file or a JSON argument being copied) is right far more often than a
//! match of 2. [`DraftLength`] keeps, per request and per match class, the
//! tokens accepted and the drafts cut short (a geometric model: each drafted
//! token is accepted with probability `p = accepted / (accepted + cut)`), and
//! drafts the `k` maximising `(1 + p + ... + p^k) / cost(k)`, none when no
//! `k` beats a plain step. Counts start from a prior worth [`PRIOR_WEIGHT`]
//! drafts, so a class with little evidence follows the prior.

/// Extra cost of a pass with any verified row, in single-row passes.
const VERIFY_BASE: f32 = 0.13;
/// Extra cost of each verified row, in single-row passes.
const VERIFY_ROW: f32 = 0.16;
/// Weight of the prior, in drafts' worth of evidence.
const PRIOR_WEIGHT: f32 = 16.0;

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

/// Cost of a pass of 1 + `k` rows, in single-row passes.
fn pass_cost(k: usize) -> f32 {
    if k == 0 {
        1.0
    } else {
        1.0 + VERIFY_BASE + VERIFY_ROW * k as f32
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

    /// Tokens to verify of a draft of class `c` with `available` tokens (0: none).
    pub fn choose(&self, c: MatchClass, available: usize) -> usize {
        let p = self.acceptance(c);
        let (mut best, mut best_k) = (1.0f32, 0);
        let (mut pk, mut expected) = (1.0f32, 0.0f32);
        for k in 1..=available {
            pk *= p;
            expected += pk;
            let v = (1.0 + expected) / pass_cost(k);
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
        let mut l = DraftLength::default();
        let (short, long) = (
            l.choose(MatchClass::Short, 15),
            l.choose(MatchClass::Long, 15),
        );
        assert!(
            0 < short && short < long,
            "priors: short {short}, long {long}"
        );
        assert_eq!(
            l.choose(MatchClass::Long, 3),
            3,
            "at most what is available"
        );
        // A copying request: long drafts all accepted -> the longest draft.
        for _ in 0..20 {
            l.record(MatchClass::Long, 15, 15);
        }
        assert_eq!(l.choose(MatchClass::Long, 15), 15);
        // Short matches that keep failing stop drafting; the long class is unaffected.
        for _ in 0..20 {
            l.record(MatchClass::Short, 2, 0);
        }
        assert_eq!(l.choose(MatchClass::Short, 15), 0);
        assert_eq!(l.choose(MatchClass::Long, 15), 15);
    }

    #[test]
    fn the_chosen_length_maximises_expected_tokens_per_cost() {
        let l = DraftLength::default();
        for c in [MatchClass::Short, MatchClass::Mid, MatchClass::Long] {
            let p = l.acceptance(c);
            let value = |k: usize| {
                let e: f32 = (1..=k).map(|i| p.powi(i as i32)).sum();
                (1.0 + e) / pass_cost(k)
            };
            let k = l.choose(c, 15);
            for other in 0..=15 {
                assert!(value(k) >= value(other), "{c:?}: {k} vs {other}");
            }
        }
    }
}
