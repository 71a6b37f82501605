//! The orders' behaviour, and a differential test against the
//! implementations they replaced (kept here, unchanged, as the reference):
//! the same random operations must give the same victims after the same
//! candidates, so the O(1) lists changed the cost and nothing else.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use super::*;

fn k(i: u8) -> BlockKey {
    BlockKey([i; 32])
}

/// An order with the key -> slot map the store keeps in its block records,
/// behind the key-based interface the orders had before slots (and the
/// reference has): insert of a queued key = touch, remove of an unqueued key
/// = nothing, touch of an unqueued key = insert (LRU) or nothing (S3-FIFO).
/// The store only touches and removes queued keys.
struct Keyed {
    order: EvictionOrder,
    slots: HashMap<BlockKey, Slot>,
    /// The record each queued key was inserted with (a fresh one per insert).
    recs: HashMap<BlockKey, Rec>,
    next_rec: Rec,
}

impl Keyed {
    fn new(policy: EvictionPolicy) -> Self {
        Keyed {
            order: EvictionOrder::new(&NodeConfig {
                eviction: policy,
                ..Default::default()
            }),
            slots: HashMap::new(),
            recs: HashMap::new(),
            next_rec: 0,
        }
    }

    fn insert(&mut self, key: BlockKey) {
        match self.slots.get(&key) {
            Some(&s) => self.order.touch(s, &key),
            None => {
                self.next_rec += 1;
                let s = self.order.insert(key, self.next_rec);
                self.slots.insert(key, s);
                self.recs.insert(key, self.next_rec);
            }
        }
    }

    fn touch(&mut self, key: BlockKey) {
        match self.slots.get(&key) {
            Some(&s) => self.order.touch(s, &key),
            None if matches!(self.order, EvictionOrder::Lru(_)) => self.insert(key),
            None => {}
        }
    }

    fn remove(&mut self, key: &BlockKey) {
        if let Some(s) = self.slots.remove(key) {
            self.order.remove(s, key);
        }
    }

    /// The order's victim; every candidate comes with the record it was
    /// inserted with, and the first is the one `peek` named, if any.
    fn victim(&mut self, mut eligible: impl FnMut(&BlockKey) -> bool) -> Option<BlockKey> {
        let peeked = self.order.peek();
        let mut first = None;
        let recs = &self.recs;
        let v = self.order.victim_at(|key, rec| {
            assert_eq!(Some(&rec), recs.get(key), "record of {key:?}");
            first.get_or_insert((*key, rec));
            eligible(key)
        });
        if peeked.is_some() {
            assert_eq!(
                peeked, first,
                "peek named another block than victim looked at first"
            );
        }
        v
    }
}

#[test]
fn lru_evicts_least_recent_and_skips_ineligible() {
    let mut o = Keyed::new(EvictionPolicy::Lru);
    for i in 0..4 {
        o.insert(k(i));
    }
    o.touch(k(0));
    assert_eq!(o.victim(|_| true), Some(k(1)));
    assert_eq!(o.victim(|x| *x != k(1)), Some(k(2)));
    o.remove(&k(1));
    o.remove(&k(2));
    o.remove(&k(3));
    assert_eq!(o.victim(|_| true), Some(k(0)));
    assert_eq!(o.victim(|_| false), None);
}

#[test]
fn s3fifo_keeps_reread_blocks_over_one_hit_wonders() {
    let mut o = Keyed::new(EvictionPolicy::S3fifo);
    for i in 0..10 {
        o.insert(k(i));
    }
    o.touch(k(0));
    o.touch(k(1));
    // Evict 8 one-hit wonders: the two re-read blocks must survive.
    for _ in 0..8 {
        let v = o.victim(|_| true).unwrap();
        assert!(v != k(0) && v != k(1), "evicted a re-read block");
        o.remove(&v);
    }
    assert_eq!(o.victim(|_| false), None);
    // A ghost coming back goes to main.
    o.insert(k(5));
    let EvictionOrder::S3Fifo(s) = &o.order else {
        panic!("not s3fifo")
    };
    assert!(s.in_main(o.slots[&k(5)]));
}

/// Differential: for both policies, several seeds and key-space sizes (from
/// a few keys, where ghosts come back and are dropped again at once, to more
/// keys than the 64-entry ghost floor), the same random inserts, touches,
/// removes and victim calls (all, none or a random part of the keys
/// eligible; most victims then removed, as the store does) on the new order
/// and the reference must pass the same candidates to `eligible` in the
/// same order and return the same victims. A final drain compares the whole
/// remaining order.
#[test]
fn same_victims_as_the_reference_implementations() {
    for policy in [EvictionPolicy::Lru, EvictionPolicy::S3fifo] {
        for keys in [6, 40, 200, 1500] {
            for seed in 0..6 {
                differential(policy, keys, seed, 20_000);
            }
        }
    }
}

/// SplitMix64: a reproducible stream without a dependency.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

pub(super) fn key(i: u64) -> BlockKey {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&i.to_le_bytes());
    BlockKey(b)
}

/// Ask two orders for a victim under one random eligibility rule (none, all,
/// or a random two thirds): they must offer the same candidates in the same
/// order and name the same victim, which is returned.
pub(super) fn same_victim(
    rng: &mut Rng,
    mut new: impl FnMut(&mut dyn FnMut(&BlockKey) -> bool) -> Option<BlockKey>,
    mut old: impl FnMut(&mut dyn FnMut(&BlockKey) -> bool) -> Option<BlockKey>,
    ctx: &str,
) -> Option<BlockKey> {
    let (mode, salt) = (rng.next() % 8, rng.next());
    let eligible = |b: &BlockKey| match mode {
        0 => false,
        1..=3 => true,
        _ => Rng(salt ^ u64::from_le_bytes(b.0[..8].try_into().unwrap())).next() % 3 != 0,
    };
    let (mut seen_new, mut seen_old) = (Vec::new(), Vec::new());
    let v_new = new(&mut |b| {
        seen_new.push(*b);
        eligible(b)
    });
    let v_old = old(&mut |b| {
        seen_old.push(*b);
        eligible(b)
    });
    assert_eq!(v_new, v_old, "victim, {ctx}");
    assert_eq!(seen_new, seen_old, "candidates, {ctx}");
    v_new
}

fn differential(policy: EvictionPolicy, keys: u64, seed: u64, ops: usize) {
    let mut new = Keyed::new(policy);
    let mut old = Reference::new(policy);
    let mut rng = Rng(seed.wrapping_mul(1_000_003) ^ keys);
    let ctx = |step: usize| format!("{policy:?} keys={keys} seed={seed} step={step}");
    for step in 0..ops {
        let r = rng.next() % 100;
        let x = key(rng.next() % keys);
        match r {
            0..=34 => {
                new.insert(x);
                old.insert(x);
            }
            35..=54 => {
                new.touch(x);
                old.touch(x);
            }
            55..=67 => {
                new.remove(&x);
                old.remove(&x);
            }
            _ => {
                let v_new = same_victim(&mut rng, |e| new.victim(e), |e| old.victim(e), &ctx(step));
                if let Some(v) = v_new.filter(|_| rng.next() % 5 != 0) {
                    new.remove(&v);
                    old.remove(&v);
                }
            }
        }
    }
    loop {
        let v = new.victim(|_| true);
        assert_eq!(v, old.victim(|_| true), "drain, {}", ctx(ops));
        let Some(v) = v else { break };
        new.remove(&v);
        old.remove(&v);
    }
}

/// The reference orders behind one interface.
enum Reference {
    Lru(RefLru),
    S3Fifo(RefS3Fifo),
}

impl Reference {
    fn new(policy: EvictionPolicy) -> Self {
        match policy {
            EvictionPolicy::Lru => Reference::Lru(RefLru::default()),
            EvictionPolicy::S3fifo => Reference::S3Fifo(RefS3Fifo::default()),
            EvictionPolicy::Lirs | EvictionPolicy::Adaptive | EvictionPolicy::Door => {
                unreachable!("lirs_tests, adaptive_tests and door_tests test these")
            }
        }
    }

    fn insert(&mut self, key: BlockKey) {
        match self {
            Reference::Lru(l) => l.touch(key),
            Reference::S3Fifo(s) => s.insert(key),
        }
    }

    fn touch(&mut self, key: BlockKey) {
        match self {
            Reference::Lru(l) => l.touch(key),
            Reference::S3Fifo(s) => s.touch(key),
        }
    }

    fn remove(&mut self, key: &BlockKey) {
        match self {
            Reference::Lru(l) => l.remove(key),
            Reference::S3Fifo(s) => s.remove(key),
        }
    }

    fn victim(&mut self, eligible: impl FnMut(&BlockKey) -> bool) -> Option<BlockKey> {
        match self {
            Reference::Lru(l) => l.victim(eligible),
            Reference::S3Fifo(s) => s.victim(eligible),
        }
    }
}

/// The LRU before the slab lists: a tick per access, oldest tick first.
#[derive(Debug, Default)]
pub struct RefLru {
    tick: u64,
    by_tick: BTreeMap<u64, BlockKey>,
    ticks: HashMap<BlockKey, u64>,
}

impl RefLru {
    fn touch(&mut self, key: BlockKey) {
        self.tick += 1;
        if let Some(old) = self.ticks.insert(key, self.tick) {
            self.by_tick.remove(&old);
        }
        self.by_tick.insert(self.tick, key);
    }

    fn remove(&mut self, key: &BlockKey) {
        if let Some(t) = self.ticks.remove(key) {
            self.by_tick.remove(&t);
        }
    }

    fn victim(&mut self, mut eligible: impl FnMut(&BlockKey) -> bool) -> Option<BlockKey> {
        self.by_tick.values().find(|k| eligible(k)).copied()
    }
}

/// The S3-FIFO before the slab lists (Yang et al., SOSP'23): new blocks enter a small FIFO (10%); those
/// read again there move to the main FIFO, the rest leave and are remembered
/// in a ghost queue; a ghost that comes back goes straight to main. Main
/// reinserts blocks read since they were last at its head.
#[derive(Debug, Default)]
pub struct RefS3Fifo {
    small: VecDeque<BlockKey>,
    main: VecDeque<BlockKey>,
    freq: HashMap<BlockKey, u8>,
    in_main: HashSet<BlockKey>,
    ghost: VecDeque<BlockKey>,
    ghost_set: HashSet<BlockKey>,
}

impl RefS3Fifo {
    fn insert(&mut self, key: BlockKey) {
        if self.freq.contains_key(&key) {
            self.touch(key);
            return;
        }
        self.freq.insert(key, 0);
        if self.ghost_set.remove(&key) {
            self.main.push_back(key);
            self.in_main.insert(key);
        } else {
            self.small.push_back(key);
        }
    }

    fn touch(&mut self, key: BlockKey) {
        if let Some(f) = self.freq.get_mut(&key) {
            *f = (*f + 1).min(3);
        }
    }

    fn remove(&mut self, key: &BlockKey) {
        if self.freq.remove(key).is_none() {
            return;
        }
        if self.in_main.remove(key) {
            self.main.retain(|k| k != key);
        } else {
            self.small.retain(|k| k != key);
            self.ghost.push_back(*key);
            self.ghost_set.insert(*key);
            let cap = (self.freq.len()).max(64);
            while self.ghost.len() > cap {
                if let Some(old) = self.ghost.pop_front() {
                    self.ghost_set.remove(&old);
                }
            }
        }
    }

    fn victim(&mut self, mut eligible: impl FnMut(&BlockKey) -> bool) -> Option<BlockKey> {
        // Bounded: every block is looked at a few times at most.
        let budget = 4 * (self.small.len() + self.main.len()) + 4;
        for _ in 0..budget {
            let total = self.small.len() + self.main.len();
            let from_small =
                !self.small.is_empty() && (self.small.len() * 10 >= total || self.main.is_empty());
            if from_small {
                let key = self.small.pop_front()?;
                let f = self.freq.get(&key).copied().unwrap_or(0);
                if f > 0 {
                    self.freq.insert(key, 0);
                    self.main.push_back(key);
                    self.in_main.insert(key);
                } else {
                    self.small.push_back(key);
                    if eligible(&key) {
                        return Some(key);
                    }
                }
            } else {
                let key = self.main.pop_front()?;
                let f = self.freq.get(&key).copied().unwrap_or(0);
                self.main.push_back(key);
                if f > 0 {
                    self.freq.insert(key, f - 1);
                } else if eligible(&key) {
                    return Some(key);
                }
            }
        }
        None
    }
}
