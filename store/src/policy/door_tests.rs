//! `door`'s behaviour: first-time blocks go first, a block seen before is
//! kept over them, the newest probation blocks are spared, pinned or leased
//! blocks are never chosen, and a replay where LRU keeps nothing a second
//! time gets hits under `door` (it did not degenerate to LRU).

use std::collections::HashMap;

use super::door::{Doorkeeper, WINDOW};
use super::*;

fn k(i: u32) -> BlockKey {
    let mut b = [0u8; 32];
    b[..4].copy_from_slice(&i.to_le_bytes());
    BlockKey(b)
}

/// A tier of `cap` blocks run by one order: a lookup's hit is its longest
/// held prefix (touched), the rest is put, one eviction per put when full
/// (the store's rule at watermarks 1.0 / 1.0).
struct Tier {
    order: EvictionOrder,
    slots: HashMap<BlockKey, Slot>,
    cap: usize,
    hits: usize,
}

impl Tier {
    fn new(policy: EvictionPolicy, cap: usize) -> Self {
        Tier {
            order: EvictionOrder::new(&NodeConfig {
                eviction: policy,
                ..Default::default()
            }),
            slots: HashMap::new(),
            cap,
            hits: 0,
        }
    }

    fn request(&mut self, keys: &[BlockKey]) {
        let found = keys
            .iter()
            .take_while(|k| self.slots.contains_key(k))
            .count();
        self.order.lookup(keys, found);
        for key in &keys[..found] {
            self.order.touch(self.slots[key], key);
        }
        self.hits += found;
        for key in &keys[found..] {
            if self.slots.contains_key(key) {
                continue;
            }
            if self.slots.len() >= self.cap {
                let v = self.order.victim(|_| true).expect("a victim");
                let s = self.slots.remove(&v).expect("victim is held");
                self.order.remove(s, &v);
            }
            let s = self.order.insert(*key, 0);
            self.slots.insert(*key, s);
        }
    }
}

/// Hot chains that come back after a scan of one-off chains longer than
/// the tier: LRU's tier holds only the scan when a hot chain returns.
fn hot_and_scan(rounds: u32) -> Vec<Vec<BlockKey>> {
    let mut reqs = Vec::new();
    let mut next = 10_000;
    for _ in 0..rounds {
        for h in 0..4u32 {
            reqs.push((0..5).map(|j| k(h * 100 + j)).collect());
        }
        for _ in 0..12 {
            reqs.push((0..5).map(|j| k(next + j)).collect());
            next += 5;
        }
    }
    reqs
}

#[test]
fn door_keeps_returning_chains_that_lru_loses_to_a_scan() {
    let trace = hot_and_scan(20);
    let mut lru = Tier::new(EvictionPolicy::Lru, 40);
    let mut door = Tier::new(EvictionPolicy::Door, 40);
    for r in &trace {
        lru.request(r);
        door.request(r);
    }
    // 20 rounds of 20 hot blocks: LRU hits none (60 scan blocks between
    // returns in a 40-block tier); door keeps them from the third round.
    assert_eq!(lru.hits, 0);
    assert!(door.hits >= 17 * 20, "door hit {} blocks", door.hits);
}

#[test]
fn a_block_seen_before_outlives_newer_first_timers() {
    let mut d = Door::default();
    let mut slots = HashMap::new();
    // k(0) put, evicted, put again: the keeper has seen it.
    let s = d.insert(k(0), 0);
    d.remove(s, &k(0));
    slots.insert(k(0), d.insert(k(0), 0));
    for i in 1..=40 {
        slots.insert(k(i), d.insert(k(i), i));
    }
    // LRU would evict k(0) (the oldest); door takes the oldest first-timer.
    assert_eq!(d.victim(|_, _| true), Some(k(1)));
    assert_eq!(d.peek().map(|p| p.0), Some(k(1)));
    // A first-timer read on probation moves to main, behind k(0).
    d.touch(slots[&k(1)], &k(1));
    assert_eq!(d.victim(|_, _| true), Some(k(2)));
}

#[test]
fn the_newest_on_probation_are_spared_while_main_has_blocks() {
    let mut d = Door::default();
    let s = d.insert(k(0), 0);
    d.remove(s, &k(0));
    for i in 0..100 {
        let s = d.insert(k(1000 + i), 0);
        d.touch(s, &k(1000 + i));
    }
    // 100 blocks in main; new ones up to the window stay.
    let spared = ((100.0 + 1.0) * WINDOW) as u32;
    for i in 0..spared {
        d.insert(k(i + 1), 0);
    }
    assert_eq!(d.victim(|_, _| true), Some(k(1000)));
    // One past the window: probation goes first again.
    d.insert(k(spared + 1), 0);
    d.insert(k(spared + 2), 0);
    assert_eq!(d.victim(|_, _| true), Some(k(1)));
    assert!(d.on_probation() > 0);
}

#[test]
fn pinned_and_leased_blocks_are_never_victims() {
    let mut d = Door::default();
    let mut slots = Vec::new();
    for i in 0..10 {
        slots.push(d.insert(k(i), i));
    }
    // "Pinned": the first eight (by key) and any block with record 9
    // ("leased", told by the record the store would read).
    let eligible = |key: &BlockKey, rec: Rec| {
        let i = u32::from_le_bytes(key.0[..4].try_into().unwrap());
        i >= 8 && rec != 9
    };
    assert_eq!(d.victim(eligible), Some(k(8)));
    d.remove(slots[8], &k(8));
    assert_eq!(d.victim(eligible), None);
    // Through the store's order and the main queue too.
    let mut o = EvictionOrder::new(&NodeConfig {
        eviction: EvictionPolicy::Door,
        ..Default::default()
    });
    let s = o.insert(k(1), 1);
    o.remove(s, &k(1));
    o.insert(k(1), 1);
    o.insert(k(2), 2);
    assert_eq!(o.victim(|key| *key != k(2)), Some(k(1)));
    assert_eq!(o.victim(|key| *key == k(7)), None);
}

#[test]
fn same_operations_same_victims() {
    let run = || {
        let mut t = Tier::new(EvictionPolicy::Door, 30);
        let mut victims = Vec::new();
        for r in hot_and_scan(6) {
            t.request(&r);
            victims.push(t.order.peek().map(|p| p.0));
        }
        (victims, t.hits)
    };
    assert_eq!(run(), run());
}

#[test]
fn the_keeper_forgets_after_two_generations() {
    let mut keeper = Doorkeeper::default();
    // A generation is 4 * 64 keys.
    const G: u32 = 256;
    for i in 0..G {
        keeper.add(&k(i), 64);
    }
    // One generation later the first keys are still remembered...
    for i in G..2 * G {
        keeper.add(&k(i), 64);
    }
    assert!((0..2 * G).all(|i| keeper.seen(&k(i))));
    // ... two later, forgotten but for the filter's false positives.
    keeper.add(&k(2 * G), 64);
    let still = (0..G).filter(|&i| keeper.seen(&k(i))).count();
    assert!(still < G as usize / 8, "{still} of {G} old keys still seen");
    assert!((G..=2 * G).all(|i| keeper.seen(&k(i))));
}

/// While the tier fills (its most blocks growing with each put), the
/// keeper's generations grow with it instead of one small filter taking
/// every key: keys never added are seen only as false positives.
#[test]
fn the_keeper_does_not_fill_up_while_the_tier_grows() {
    let mut keeper = Doorkeeper::default();
    const N: u32 = 20_000;
    for i in 0..N {
        keeper.add(&k(i), i as usize + 1);
    }
    let unseen = (N..N + 10_000).filter(|&i| keeper.seen(&k(i))).count();
    assert!(unseen < 100, "{unseen} of 10000 new keys seen");
    assert!((N - 1000..N).all(|i| keeper.seen(&k(i))));
}

/// In `adaptive`, the door shadow's lead takes the tier over on a trace
/// where it wins, and the tier then hits what `door` alone does.
#[test]
fn adaptive_runs_door_where_door_leads() {
    let trace = hot_and_scan(40);
    let mut ad = Tier::new(EvictionPolicy::Adaptive, 40);
    let mut lru = Tier::new(EvictionPolicy::Lru, 40);
    for r in &trace {
        ad.request(r);
        lru.request(r);
    }
    let st = ad.order.adaptive_stats().expect("adaptive");
    assert!(st.door_hits > st.lru_hits, "{st:?}");
    assert!(ad.hits > lru.hits, "adaptive {} lru {}", ad.hits, lru.hits);
}
