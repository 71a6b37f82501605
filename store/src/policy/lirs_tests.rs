//! LIRS: a differential test against a plain reference (the same rules on
//! `Vec`s, O(n) per operation: the spec the linked version must follow),
//! its behaviour on a loop and a scan, and, in a real store, that pinned and
//! leased blocks are never chosen.

use std::collections::{HashMap, HashSet, VecDeque};

use super::tests::{key, same_victim, Rng};
use super::*;

#[derive(Clone, Copy, PartialEq, Debug)]
enum St {
    Lir,
    Hir,
    Ghost,
}

/// LIRS as a spec: S bottom first, Q oldest first, ghosts oldest first.
struct RefLirs {
    s: Vec<BlockKey>,
    q: Vec<BlockKey>,
    ghosts: VecDeque<BlockKey>,
    st: HashMap<BlockKey, St>,
    lir: usize,
    resident: usize,
    hir_percent: f64,
    history: usize,
    clock: u64,
    /// key -> (last access, last reuse interval); kept while in S or resident.
    times: HashMap<BlockKey, (u64, u64)>,
    idle_factor: f64,
    /// Idle time of the last dead block with a reuse interval.
    dead_idle: Option<u64>,
    /// Resident blocks demoted as dead and not read since.
    marked: HashSet<BlockKey>,
    /// Blocks evicted while marked, oldest first.
    dead: VecDeque<BlockKey>,
    /// The resident count at the latest `victim` call.
    floor: Option<usize>,
}

impl RefLirs {
    fn new(hir_percent: f64, history: usize, idle_factor: f64) -> Self {
        RefLirs {
            s: Vec::new(),
            q: Vec::new(),
            ghosts: VecDeque::new(),
            st: HashMap::new(),
            lir: 0,
            resident: 0,
            hir_percent,
            history,
            clock: 0,
            times: HashMap::new(),
            idle_factor,
            dead_idle: None,
            marked: HashSet::new(),
            dead: VecDeque::new(),
            floor: None,
        }
    }
    fn accessed(&mut self, k: BlockKey) {
        self.clock += 1;
        let (last, _) = self.times[&k];
        self.times.insert(k, (self.clock, self.clock - last));
    }
    fn ghost_cap(&self) -> usize {
        self.history * self.resident.max(64)
    }
    fn idle(&self, k: &BlockKey) -> bool {
        let (last, irr) = self.times[k];
        if self.st[k] != St::Lir || self.idle_factor <= 0.0 {
            return false;
        }
        if irr > 0 {
            return (self.clock - last) as f64 > self.idle_factor * irr as f64;
        }
        if let Some(d) = self.dead_idle {
            return self.clock - last > d;
        }
        !self.ghosts.is_empty()
            && self.ghosts.len() >= self.ghost_cap()
            && last < self.times[&self.ghosts[0]].0
    }
    fn forget(&mut self, k: &BlockKey) {
        self.st.remove(k);
        self.times.remove(k);
    }
    fn cap(&self) -> usize {
        let base = match self.floor {
            Some(f) if f < self.resident => f,
            _ => self.resident,
        };
        let hir = ((base as f64 * self.hir_percent / 100.0) as usize).max(1);
        base.saturating_sub(hir)
    }
    fn drop_from(v: &mut Vec<BlockKey>, k: &BlockKey) -> bool {
        let at = v.iter().position(|x| x == k);
        if let Some(i) = at {
            v.remove(i);
        }
        at.is_some()
    }
    fn prune(&mut self) {
        while let Some(&b) = self.s.first() {
            match self.st[&b] {
                St::Lir => break,
                St::Ghost => {
                    self.s.remove(0);
                    self.ghosts.retain(|g| *g != b);
                    self.forget(&b);
                }
                St::Hir => {
                    self.s.remove(0);
                }
            }
        }
    }
    fn demote_bottom(&mut self) {
        if self.s.is_empty() {
            return;
        }
        assert_eq!(self.st[&self.s[0]], St::Lir, "S's bottom is LIR");
        let b = self.s.remove(0);
        self.st.insert(b, St::Hir);
        self.lir -= 1;
        self.q.push(b);
        self.prune();
    }
    /// The bottom LIR block is dead: to Q's front.
    fn demote_dead(&mut self) {
        let b = self.s.remove(0);
        let (last, irr) = self.times[&b];
        if irr > 0 {
            self.dead_idle = Some(self.clock - last);
        }
        self.st.insert(b, St::Hir);
        self.marked.insert(b);
        self.lir -= 1;
        self.q.insert(0, b);
        self.prune();
    }
    fn promote(&mut self, k: BlockKey) {
        self.marked.remove(&k);
        self.st.insert(k, St::Lir);
        self.lir += 1;
        Self::drop_from(&mut self.s, &k);
        self.s.push(k);
        self.prune();
        while self.lir > self.cap() && self.s[0] != k {
            self.demote_bottom();
        }
    }
    fn resident(&self, k: &BlockKey) -> bool {
        matches!(self.st.get(k), Some(St::Lir | St::Hir))
    }
    fn insert(&mut self, k: BlockKey) {
        self.resident += 1;
        if let Some(i) = self.dead.iter().position(|d| *d == k) {
            self.dead.remove(i);
            self.dead_idle = None;
            self.clock += 1;
            self.times.insert(k, (self.clock, 0));
            self.promote(k);
            return;
        }
        if self.st.get(&k) == Some(&St::Ghost) {
            self.accessed(k);
            self.ghosts.retain(|g| *g != k);
            self.promote(k);
            return;
        }
        self.clock += 1;
        self.times.insert(k, (self.clock, 0));
        if self.lir < self.cap() {
            self.st.insert(k, St::Lir);
            self.lir += 1;
            self.s.push(k);
            self.prune();
        } else {
            self.st.insert(k, St::Hir);
            self.s.push(k);
            self.q.push(k);
        }
    }
    fn touch(&mut self, k: BlockKey) {
        self.accessed(k);
        self.marked.remove(&k);
        match self.st[&k] {
            St::Lir => {
                let bottom = self.s[0] == k;
                Self::drop_from(&mut self.s, &k);
                self.s.push(k);
                if bottom {
                    self.prune();
                }
            }
            St::Hir if self.s.contains(&k) => {
                Self::drop_from(&mut self.q, &k);
                self.promote(k);
            }
            St::Hir => {
                self.s.push(k);
                Self::drop_from(&mut self.q, &k);
                self.q.push(k);
            }
            St::Ghost => unreachable!(),
        }
    }
    fn remove(&mut self, k: BlockKey) {
        self.resident -= 1;
        match self.st[&k] {
            St::Lir => {
                Self::drop_from(&mut self.s, &k);
                self.lir -= 1;
                self.forget(&k);
                self.prune();
            }
            St::Hir => {
                Self::drop_from(&mut self.q, &k);
                if self.marked.remove(&k) {
                    self.forget(&k);
                    self.dead.push_back(k);
                    while self.dead.len() > self.resident.max(64) {
                        self.dead.pop_front();
                    }
                } else if !self.s.contains(&k) {
                    self.forget(&k);
                } else {
                    self.st.insert(k, St::Ghost);
                    self.ghosts.push_back(k);
                }
            }
            St::Ghost => unreachable!(),
        }
        while self.ghosts.len() > self.ghost_cap() {
            let old = self.ghosts.pop_front().unwrap();
            Self::drop_from(&mut self.s, &old);
            self.forget(&old);
        }
    }
    fn victim(&mut self, mut eligible: impl FnMut(&BlockKey) -> bool) -> Option<BlockKey> {
        self.floor = Some(self.resident);
        loop {
            if self.lir > self.cap() {
                self.demote_bottom();
            } else if self.s.first().is_some_and(|b| self.idle(b)) {
                self.demote_dead();
            } else {
                break;
            }
        }
        if let Some(k) = self.q.iter().find(|k| eligible(k)) {
            return Some(*k);
        }
        let st = &self.st;
        self.s
            .iter()
            .find(|k| st[*k] == St::Lir && eligible(k))
            .copied()
    }
}

/// The same random inserts, touches, removes and victim calls (all, none or
/// part of the keys eligible; most victims then removed, as the store does)
/// on `Lirs` and the reference give the same candidates and victims, for
/// key spaces from a few keys to many more than the ghost floor (64 per
/// history unit), so ghosts come back, are pruned and are trimmed.
#[test]
fn lirs_matches_the_reference() {
    for (hir, history, idle) in [
        (1.0, 12, 2.0),
        (10.0, 1, 0.0),
        (50.0, 2, 1.0),
        (1.0, 3, 3.0),
    ] {
        for keys in [6u64, 60, 400, 1500] {
            for seed in 0..4 {
                lirs_differential(hir, history, idle, keys, seed, 12_000);
            }
        }
    }
}

fn lirs_differential(hir: f64, history: usize, idle: f64, keys: u64, seed: u64, ops: usize) {
    let mut new = Lirs::new(hir, history, idle);
    let mut old = RefLirs::new(hir, history, idle);
    let mut slots: HashMap<BlockKey, Slot> = HashMap::new();
    // The record each resident key was inserted with (a fresh one per
    // insert, as the store's would be): `victim_at` must pass it back.
    let mut recs: HashMap<BlockKey, u32> = HashMap::new();
    let mut rng = Rng(seed.wrapping_mul(1_000_003) ^ keys);
    for step in 0..ops {
        let ctx =
            format!("hir={hir} history={history} idle={idle} keys={keys} seed={seed} step={step}");
        let r = rng.next() % 100;
        let x = key(rng.next() % keys);
        match r {
            0..=39 if !old.resident(&x) => {
                recs.insert(x, step as u32);
                slots.insert(x, new.insert(x, step as u32));
                old.insert(x);
            }
            0..=59 if old.resident(&x) => {
                new.touch(slots[&x], &x);
                old.touch(x);
            }
            60..=67 if old.resident(&x) => {
                new.remove(slots.remove(&x).unwrap(), &x);
                old.remove(x);
            }
            68.. => {
                let at = |e: &mut dyn FnMut(&BlockKey) -> bool| {
                    new.victim_at(|k, r| {
                        assert_eq!(Some(&r), recs.get(k), "record of {k:?}, {ctx}");
                        e(k)
                    })
                };
                let v = same_victim(&mut rng, at, |e| old.victim(e), &ctx);
                if let Some(v) = v.filter(|_| rng.next() % 5 != 0) {
                    new.remove(slots.remove(&v).unwrap(), &v);
                    old.remove(v);
                }
            }
            _ => {}
        }
        let (resident, lir, ghosts) = new.counts();
        assert_eq!(
            (resident, lir, ghosts),
            (old.resident, old.lir, old.ghosts.len()),
            "{ctx}"
        );
        assert!(ghosts <= history * resident.max(64), "{ctx}");
    }
}

/// A loop over more blocks than the tier (LRU's worst case: no hit) keeps
/// a fixed part resident under LIRS, and keeps it while a scan of one-off
/// blocks (two after each loop access) runs beside the loop; once the loop
/// stops, its blocks age out and the scan gets the tier. With these knobs
/// and the defaults: the scan stretches the loop's reuse intervals
/// threefold, so its protected blocks are taken for dead when it starts (a
/// false death, undone when they come back). Before the dead FIFO, with the
/// defaults, the loop never hit again once the scan started.
#[test]
fn lirs_survives_a_loop_and_a_scan() {
    let d = NodeConfig::default();
    for knobs in [
        (1.0, 12, 2.0),
        (
            d.lirs_hir_percent,
            d.lirs_history as usize,
            d.lirs_idle_factor,
        ),
    ] {
        loop_and_scan(knobs);
    }
}

fn loop_and_scan((hir, history, idle): (f64, usize, f64)) {
    let (tier, looped) = (100usize, 150u64);
    let mut o = Lirs::new(hir, history, idle);
    let mut slots: HashMap<BlockKey, Slot> = HashMap::new();
    let access = |o: &mut Lirs, slots: &mut HashMap<BlockKey, Slot>, k: BlockKey| -> bool {
        if let Some(&s) = slots.get(&k) {
            o.touch(s, &k);
            return true;
        }
        if slots.len() >= tier {
            let v = o.victim(|_| true).unwrap();
            o.remove(slots.remove(&v).unwrap(), &v);
        }
        slots.insert(k, o.insert(k, 0));
        false
    };
    let mut scan = 1_000_000u64;
    for (rounds, one_offs) in [(10, 0), (10, 2)] {
        let mut hits = 0;
        for round in 0..rounds {
            for i in 0..looped {
                let hit = access(&mut o, &mut slots, key(i));
                hits += usize::from(hit && round > 0);
                for _ in 0..one_offs {
                    access(&mut o, &mut slots, key(scan));
                    scan += 1;
                }
            }
        }
        // MIN would hit ~99 of 150 a round; LIRS keeps its LIR set (99 blocks).
        assert!(
            hits >= (rounds - 1) * 90,
            "knobs {hir}/{history}/{idle}, {one_offs} one-offs: {hits}"
        );
    }
    for _ in 0..10_000 {
        access(&mut o, &mut slots, key(scan));
        scan += 1;
    }
    let kept = (0..looped).filter(|i| slots.contains_key(&key(*i))).count();
    assert_eq!(kept, 0, "the loop's blocks outlived the loop");
}

/// The op pattern of `bench store --metadata-scale` (every op puts a new
/// block into a full tier; every second op reads the block put `tier/40`
/// ops earlier): with the default 1% HIR queue that block is already gone
/// (the bench once failed "block evicted before its read": LIRS keeping
/// never-read blocks from displacing others, not a bug), with the 5% the
/// bench runs LIRS with every read hits.
#[test]
fn lirs_keeps_a_new_block_for_its_hir_queue_share() {
    let tier = 4000usize;
    let back = (tier / 40) as u64;
    for (hir, all_hit) in [(1.0, false), (5.0, true)] {
        let mut o = Lirs::new(hir, 24, 1.5);
        let mut slots: HashMap<BlockKey, Slot> = HashMap::new();
        let (mut reads, mut hits) = (0, 0);
        for i in 0..(6 * tier) as u64 {
            if slots.len() >= tier {
                let v = o.victim(|_| true).unwrap();
                o.remove(slots.remove(&v).unwrap(), &v);
            }
            slots.insert(key(i), o.insert(key(i), 0));
            if i % 2 == 0 && i >= back && i >= 2 * tier as u64 {
                reads += 1;
                let k = key(i - back);
                if let Some(&s) = slots.get(&k) {
                    o.touch(s, &k);
                    hits += 1;
                }
            }
        }
        assert_eq!(
            hits == reads,
            all_hit,
            "hir {hir}%: {hits} of {reads} reads hit"
        );
    }
}

/// `bench eviction`'s `ending` trace at block level: `active` sessions at a time,
/// round-robin, each a chain of keys after a shared 4-block system prompt
/// (6 blocks of its own to start, 2 more a turn), living 2-8 turns; an
/// ended session never returns and a new one takes its place until 24 have
/// run. Each request looks up its chain (the longest stored prefix hits and
/// is read), then puts the rest. The blocks hit, on a tier of `tier` blocks.
fn ending_sessions_hits(order: &mut EvictionOrder, tier: usize, active: usize, seed: u64) -> usize {
    let mut rng = Rng(seed);
    let mut next = 100u64;
    let fresh = |next: &mut u64, n: usize| -> Vec<u64> {
        let own = (*next..*next + n as u64).collect();
        *next += n as u64;
        own
    };
    let mut life = move || 2 + (rng.next() % 7) as usize;
    let mut sessions: Vec<(Vec<u64>, usize)> =
        (0..active).map(|_| (fresh(&mut next, 6), life())).collect();
    let (mut started, mut hits) = (active, 0);
    let mut slots: HashMap<BlockKey, Slot> = HashMap::new();
    while sessions.iter().any(|s| s.1 > 0) {
        for s in sessions.iter_mut().filter(|s| s.1 > 0) {
            let chain = |own: &[u64]| {
                (0..4)
                    .chain(own.iter().copied())
                    .map(key)
                    .collect::<Vec<_>>()
            };
            let looked = chain(&s.0);
            let found = looked.iter().take_while(|k| slots.contains_key(k)).count();
            for k in &looked[..found] {
                order.touch(slots[k], k);
            }
            hits += found;
            s.0.extend(fresh(&mut next, 2));
            for k in chain(&s.0).into_iter().skip(found) {
                if slots.contains_key(&k) {
                    continue;
                }
                if slots.len() >= tier {
                    let v = order.victim(|_| true).expect("a victim in a full tier");
                    order.remove(slots.remove(&v).expect("victim resident"), &v);
                }
                slots.insert(k, order.insert(k, 0));
            }
            s.1 -= 1;
            if s.1 == 0 && started < 24 {
                *s = (fresh(&mut next, 6), life());
                started += 1;
            }
        }
    }
    hits
}

/// On sessions that end (a tier that holds every live session: 26 blocks
/// each at their longest), the default order hits at least what LRU hits.
/// LIRS as first shipped (dead protected blocks demoted to Q's back, a
/// never-reused protected block kept until the ghost history filled) fell
/// below LRU here and on `bench eviction`'s `ending` and `version` traces:
/// the dead session's blocks stayed ahead of the new sessions' in the
/// eviction order, and its last answer's blocks (never reused) stayed
/// protected.
#[test]
fn lirs_default_is_not_below_lru_when_sessions_end() {
    let lirs_cfg = NodeConfig {
        eviction: EvictionPolicy::Lirs,
        ..NodeConfig::default()
    };
    let lru_cfg = NodeConfig {
        eviction: EvictionPolicy::Lru,
        ..NodeConfig::default()
    };
    let (mut lirs, mut lru) = (0, 0);
    for active in [4, 6] {
        for tier in [active * 26, active * 26 * 13 / 10] {
            for seed in 0..6 {
                let a =
                    ending_sessions_hits(&mut EvictionOrder::new(&lirs_cfg), tier, active, seed);
                let b = ending_sessions_hits(&mut EvictionOrder::new(&lru_cfg), tier, active, seed);
                eprintln!("active {active} tier {tier} seed {seed}: lirs {a} lru {b}");
                lirs += a;
                lru += b;
            }
        }
    }
    assert!(lirs >= lru, "lirs {lirs} < lru {lru} blocks hit");
}

/// In a store running LIRS or the default order (adaptive), a pinned block
/// and a leased block stay while a loop and a scan push many times the tier
/// through it; the rest of the tier turns over.
#[test]
fn lirs_store_never_evicts_pinned_or_leased_blocks() {
    store_never_evicts_pinned_or_leased_blocks(EvictionPolicy::Lirs);
    assert_eq!(NodeConfig::default().eviction, EvictionPolicy::Adaptive);
    store_never_evicts_pinned_or_leased_blocks(EvictionPolicy::Adaptive);
}

fn store_never_evicts_pinned_or_leased_blocks(eviction: EvictionPolicy) {
    use crate::keys::{BlockOrder, DType, KvLayout};
    use crate::{PutOptions, Registry, Store};
    let layout = KvLayout {
        layers: 1,
        kv_heads: 1,
        head_dim: 1024,
        dtype: DType::F32,
        block_tokens: 1,
        order: BlockOrder::LayerKvTokenHead,
    };
    let block = vec![7u8; layout.block_bytes()];
    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::b(32 * layout.block_bytes() as u64),
        high_watermark: 1.0,
        low_watermark: 1.0,
        eviction,
        ..Default::default()
    };
    let s = Store::open(cfg, &mut Registry::default()).unwrap();
    let put = |i: u64| {
        s.put(key(i), layout, &block, PutOptions::default())
            .unwrap();
    };
    put(0);
    put(1);
    assert_eq!(s.pin(&[key(0)], None), 1);
    let lease = s.lease(&key(1)).unwrap().unwrap();
    for round in 0..20 {
        for i in 2..80 {
            put(i + 1000 * (round % 2));
            if i % 3 == 0 {
                drop(s.lease(&key(i)).unwrap());
            }
        }
    }
    assert_eq!(s.lookup(&[key(0), key(1)]).len(), 2);
    drop(lease);
    let others = (2..80)
        .flat_map(|i| [i, i + 1000])
        .filter(|i| !s.lookup(&[key(*i)]).is_empty())
        .count();
    assert_eq!(
        others, 30,
        "the tier is full and turned over around the two held blocks"
    );
}
