//! `adaptive`: it follows the order that wins on the recent lookups (a loop,
//! where LIRS wins, and a shifting working set, where LRU wins, in turn),
//! its shadows replay the tier exactly while it runs LIRS, the sign-flip
//! test (`confidence`) switches below the margin, and a pinned or
//! leased block is never its victim in either mode.

use std::collections::{HashMap, HashSet};

use super::tests::key;
use super::*;

/// A tier of `cap` blocks run by `order` the way the store runs it: a
/// request looks up its chain (the longest held prefix hits and is read),
/// then puts the rest, evicting first when full.
struct Tier {
    order: EvictionOrder,
    slots: HashMap<BlockKey, Slot>,
    cap: usize,
}

impl Tier {
    fn new(policy: EvictionPolicy, cap: usize) -> Self {
        let cfg = NodeConfig {
            eviction: policy,
            ..NodeConfig::default()
        };
        Tier {
            order: EvictionOrder::new(&cfg),
            slots: HashMap::new(),
            cap,
        }
    }

    /// One request of `chain`; the blocks hit.
    fn request(&mut self, chain: &[BlockKey]) -> usize {
        let found = chain
            .iter()
            .take_while(|k| self.slots.contains_key(k))
            .count();
        self.order.lookup(chain, found);
        for k in &chain[..found] {
            self.order.touch(self.slots[k], k);
        }
        for k in &chain[found..] {
            if self.slots.contains_key(k) {
                continue;
            }
            if self.slots.len() >= self.cap {
                let v = self
                    .order
                    .victim(|_| true)
                    .expect("a victim in a full tier");
                let s = self.slots.remove(&v).expect("victim resident");
                self.order.remove(s, &v);
            }
            self.slots.insert(*k, self.order.insert(*k, 0));
        }
        found
    }

    fn mode(&self) -> AdaptiveMode {
        match &self.order {
            EvictionOrder::Adaptive(a) => a.mode(),
            _ => unreachable!("an adaptive tier"),
        }
    }

    /// [`Tier::request`] as a cluster's directory shard sees it when this
    /// tier is the cluster's RAM: the lookup, then the keys that entered.
    fn cluster_request(&mut self, chain: &[BlockKey]) -> usize {
        let held = chain
            .iter()
            .take_while(|k| self.slots.contains_key(k))
            .count();
        self.order.cluster_lookup(chain, held);
        let absent: Vec<BlockKey> = chain
            .iter()
            .filter(|k| !self.slots.contains_key(k))
            .copied()
            .collect();
        let found = self.request(chain);
        self.order.cluster_put(&absent, self.slots.len());
        found
    }
}

/// Session `s`'s chain: a shared 4-block prefix, then 8 blocks of its own.
fn chain(s: u64) -> Vec<BlockKey> {
    grown(s, 8)
}

/// Session `s`'s chain with `own` blocks of its own.
fn grown(s: u64, own: u64) -> Vec<BlockKey> {
    (0..4)
        .chain((0..own).map(|i| 1000 + s * 64 + i))
        .map(key)
        .collect()
}

/// Loop phase: 20 sessions round-robin on a 100-block tier (a cycle longer
/// than the tier: LRU hits only the shared prefix, LIRS keeps ~11 sessions).
fn loop_round(t: &mut Tier) -> usize {
    (0..20).map(|s| t.request(&chain(s))).sum()
}

/// Shift phase: 4 sessions round-robin for 3 turns, each turn 4 blocks
/// longer, then never again (`bench eviction`'s `ending`: the working set
/// fits, so LRU hits every return; LIRS' 2% probation queue loses a new
/// session's blocks before it returns).
fn shift_round(t: &mut Tier, first: u64) -> usize {
    (0..3)
        .flat_map(|turn| (first..first + 4).map(move |s| (s, 8 + 4 * turn)))
        .map(|(s, own)| t.request(&grown(s, own)))
        .sum()
}

/// Requests until `t` runs `mode`, feeding it `round` (at most `limit`).
fn requests_until(
    t: &mut Tier,
    mode: AdaptiveMode,
    limit: usize,
    mut round: impl FnMut(&mut Tier) -> usize,
    per_round: usize,
) -> usize {
    let mut n = 0;
    while t.mode() != mode && n < limit {
        round(t);
        n += per_round;
    }
    n
}

/// The phases favour LIRS, then LRU, then LIRS (checked on the plain
/// orders), and the adaptive order switches to the winner within a few
/// dozen requests each time, and hits at least what the better plain order
/// hits in each phase's steady state minus the switch.
#[test]
fn adaptive_follows_the_winner() {
    let run = |p: EvictionPolicy| {
        let mut t = Tier::new(p, 100);
        let a: usize = (0..10).map(|_| loop_round(&mut t)).sum();
        let b: usize = (0..10).map(|r| shift_round(&mut t, 100 + 4 * r)).sum();
        (a, b)
    };
    let (lirs, lru) = (run(EvictionPolicy::Lirs), run(EvictionPolicy::Lru));
    assert!(
        lirs.0 > lru.0 * 3 / 2,
        "the loop favours LIRS: {lirs:?} {lru:?}"
    );
    assert!(
        lru.1 > lirs.1 * 11 / 10,
        "the shift favours LRU: {lirs:?} {lru:?}"
    );

    let mut t = Tier::new(EvictionPolicy::Adaptive, 100);
    for _ in 0..10 {
        loop_round(&mut t);
    }
    assert_eq!(t.mode(), AdaptiveMode::Lirs, "after the loop");
    let mut first = 100;
    let to_lru = requests_until(
        &mut t,
        AdaptiveMode::Lru,
        200,
        |t| {
            first += 4;
            shift_round(t, first)
        },
        12,
    );
    eprintln!("plain (loop, shift) lirs {lirs:?} lru {lru:?}; to LRU after {to_lru} requests");
    assert!(to_lru <= 48, "LRU mode after {to_lru} shift requests");
    for _ in 0..5 {
        first += 4;
        shift_round(&mut t, first);
    }
    assert_eq!(t.mode(), AdaptiveMode::Lru, "through the shift");
    let to_lirs = requests_until(&mut t, AdaptiveMode::Lirs, 400, loop_round, 20);
    eprintln!("to LIRS after {to_lirs} requests");
    assert!(to_lirs <= 60, "LIRS mode after {to_lirs} loop requests");
}

/// Held in LIRS mode, the adaptive order makes exactly LIRS' choices, and
/// its LIRS shadow (which replays lookups and puts, sized when the tier
/// first evicts) holds exactly what the tier holds. (A shadow that put a
/// looked-up key it lacked at once, as the planner's mini-caches do, put
/// the tier's misses twice: the first copy churned out of the probation
/// queue and the second came back as a ghost hit, protected.)
#[test]
fn adaptive_on_a_loop_is_lirs() {
    let d = NodeConfig::default();
    let knobs = AdaptiveKnobs {
        hir_percent: d.lirs_hir_percent,
        history: d.lirs_history as usize,
        idle_factor: d.lirs_idle_factor,
        window: d.adaptive_window,
        margin: 1e9,
        confidence: 0.0,
        sample_rate: 1.0,
        start: AdaptiveMode::Lirs,
        burst: 1.0,
    };
    let mut a = Tier::new(EvictionPolicy::Lru, 100);
    a.order = EvictionOrder::Adaptive(Box::new(Adaptive::new(knobs)));
    let mut l = Tier::new(EvictionPolicy::Lirs, 100);
    for r in 0..10 {
        assert_eq!(loop_round(&mut a), loop_round(&mut l), "round {r}");
        assert_eq!(a.mode(), AdaptiveMode::Lirs);
    }
    let EvictionOrder::Adaptive(ad) = &a.order else {
        unreachable!()
    };
    let shadow: HashSet<BlockKey> = ad.shadow_keys(0).collect();
    let real: HashSet<BlockKey> = a.slots.keys().copied().collect();
    assert_eq!(shadow, real, "the LIRS shadow holds what the tier holds");
}

/// With a margin no lead reaches, the order keeps its starting LRU mode
/// on the loop; with `confidence` 2 it switches to LIRS once LIRS' lead
/// passes twice the spread an even duel would give, within a few rounds,
/// and the loop's blocks then hit.
#[test]
fn confidence_switches_on_consistent_evidence_below_the_margin() {
    let d = NodeConfig::default();
    let tier = |confidence: f64| {
        let knobs = AdaptiveKnobs {
            hir_percent: d.lirs_hir_percent,
            history: d.lirs_history as usize,
            idle_factor: d.lirs_idle_factor,
            window: d.adaptive_window,
            margin: 1e9,
            confidence,
            sample_rate: 1.0,
            start: AdaptiveMode::Lru,
            burst: 1.0,
        };
        let mut t = Tier::new(EvictionPolicy::Lru, 100);
        t.order = EvictionOrder::Adaptive(Box::new(Adaptive::new(knobs)));
        t
    };
    let mut fixed = tier(0.0);
    let mut tested = tier(2.0);
    let (mut hits_fixed, mut hits_tested) = (0, 0);
    for r in 0..10 {
        let (f, t) = (loop_round(&mut fixed), loop_round(&mut tested));
        if r >= 5 {
            (hits_fixed, hits_tested) = (hits_fixed + f, hits_tested + t);
        }
    }
    assert_eq!(fixed.mode(), AdaptiveMode::Lru, "the margin alone");
    assert_eq!(tested.mode(), AdaptiveMode::Lirs, "with the test");
    assert!(
        hits_tested > hits_fixed * 3 / 2,
        "LIRS' hits on the loop: {hits_tested} vs {hits_fixed}"
    );
}

/// In LRU mode and in LIRS mode, blocks the caller refuses (pinned,
/// leased) are never the victim; the order still finds an eligible one.
#[test]
fn adaptive_never_picks_an_ineligible_block() {
    let mut t = Tier::new(EvictionPolicy::Adaptive, 100);
    let held: HashSet<BlockKey> = chain(0)[4..].iter().copied().collect();
    for _ in 0..10 {
        loop_round(&mut t);
    }
    assert_eq!(t.mode(), AdaptiveMode::Lirs);
    let mut first = 100;
    let mut checked = [0usize; 2];
    for _ in 0..30 {
        // The held session is resident, whatever the phase.
        t.request(&chain(0));
        assert!(held.iter().all(|k| t.slots.contains_key(k)));
        let v = t
            .order
            .victim(|k| !held.contains(k))
            .expect("an eligible block");
        assert!(
            !held.contains(&v),
            "held block {v:?} chosen in {:?}",
            t.mode()
        );
        // Refusing everything else too: nothing.
        assert_eq!(t.order.victim(|_| false), None);
        checked[(t.mode() == AdaptiveMode::Lru) as usize] += 1;
        first += 4;
        shift_round(&mut t, first);
    }
    assert!(checked[0] > 0, "checked in LIRS mode: {checked:?}");
    assert!(checked[1] > 0, "checked in LRU mode: {checked:?}");
}

/// Fed by a cluster, the order ignores its own tier's lookups and puts:
/// on the loop it stays in its starting LRU mode with no lookup replayed.
/// The same loop told through `cluster_lookup` and `cluster_put` (the
/// shard's view of a cluster whose RAM is this tier) switches it to LIRS
/// as fast as the tier's own lookups switch a single node's order, and
/// `stats` shows the LIRS shadow's lead.
#[test]
fn fed_by_the_cluster_the_order_judges_the_clusters_lookups() {
    let mut own = Tier::new(EvictionPolicy::Adaptive, 100);
    own.order.feed_from_cluster();
    for _ in 0..10 {
        loop_round(&mut own);
    }
    assert_eq!(own.mode(), AdaptiveMode::Lru);
    let s = own.order.adaptive_stats().expect("adaptive");
    assert!(s.cluster_fed);
    assert_eq!((s.lookups, s.lirs_hits, s.lru_hits), (0, 0, 0), "{s:?}");

    let mut single = Tier::new(EvictionPolicy::Adaptive, 100);
    let mut fed = Tier::new(EvictionPolicy::Adaptive, 100);
    fed.order.feed_from_cluster();
    let mut rounds = [None, None];
    for r in 0..10 {
        loop_round(&mut single);
        (0..20).for_each(|s| {
            fed.cluster_request(&chain(s));
        });
        for (i, t) in [&single, &fed].into_iter().enumerate() {
            if t.mode() == AdaptiveMode::Lirs && rounds[i].is_none() {
                rounds[i] = Some(r);
            }
        }
    }
    assert_eq!(fed.mode(), AdaptiveMode::Lirs, "after the loop");
    let (single_at, fed_at) = (rounds[0].expect("single node switched"), rounds[1]);
    assert!(
        fed_at.is_some_and(|r| r <= single_at + 1),
        "within a round of the single node's: {rounds:?}"
    );
    let s = fed.order.adaptive_stats().expect("adaptive");
    assert!(
        s.lirs_hits > s.lru_hits && s.switches >= 1 && s.shadow_cap == 100,
        "{s:?}"
    );
    // The tier's own lookups (through `lookup`) still count for nothing.
    let before = s.lookups;
    own.order.lookup(&chain(0), 12);
    fed.order.lookup(&chain(0), 12);
    let after = fed.order.adaptive_stats().expect("adaptive").lookups;
    assert_eq!(after, before);
}
