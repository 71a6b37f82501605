//! Picking an engine: the pure part of routing, shared by the router
//! (`balance.rs`) and `kvfabric bench agentic --routing` so both route by the
//! same rule, not by two copies of it.
//!
//! Nothing here does I/O or reads a clock or a random generator: the caller
//! passes the engines' loads (in-flight tokens), a random draw, the engine
//! that last served the session, and each engine's cached prefix length.
//!
//! Policies ([`Policy`]):
//! - `random`: the draw modulo the engine count;
//! - `least-loaded`: fewest in-flight tokens, ties resolved by scanning from a
//!   rotating start;
//! - `affinity`: the engine that last served the session, while its load is
//!   within `affinity_load_factor` x the least-loaded engine's load +
//!   `affinity_load_slack_tokens`; else least-loaded (a fallback);
//! - `prefix`: Dynamo's KV-router cost, lowest wins:
//!   `cost = prefix_overlap_weight * (prompt_blocks - cached_blocks) * block_tokens + load`
//!   i.e. the prompt tokens the engine would still have to prefill, weighed
//!   against the tokens it already has in flight (ties: least-loaded).
//!
//! [`SessionMap`] is the bounded session -> engine map (LRU + TTL);
//! [`PrefixIndex`] the block -> engines index built from the nodes' KV events.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// How an endpoint is chosen among several.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// The endpoint with the fewest in-flight tokens (ties rotate).
    LeastLoaded,
    /// Uniformly at random.
    Random,
    /// The session's last engine while its load is within the bound.
    Affinity,
    /// Longest cached prefix weighed against load (Dynamo's KV-router cost).
    Prefix,
}

impl Policy {
    /// Every policy, in config spelling order.
    pub const ALL: [Policy; 4] = [
        Policy::Random,
        Policy::LeastLoaded,
        Policy::Affinity,
        Policy::Prefix,
    ];

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::LeastLoaded => "least-loaded",
            Policy::Random => "random",
            Policy::Affinity => "affinity",
            Policy::Prefix => "prefix",
        }
    }

    /// Parse the config spelling.
    pub fn parse(s: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The tunables of `affinity` and `prefix`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PickParams {
    /// Affinity holds while the sticky engine's load <= this x the least load + slack.
    pub affinity_load_factor: f64,
    /// Tokens added to the affinity bound (so an idle cluster stays sticky).
    pub affinity_load_slack_tokens: u64,
    /// Weight of the tokens still to prefill against in-flight tokens (prefix).
    pub prefix_overlap_weight: f64,
}

impl Default for PickParams {
    fn default() -> Self {
        PickParams {
            affinity_load_factor: 1.5,
            affinity_load_slack_tokens: 4096,
            prefix_overlap_weight: 1.0,
        }
    }
}

/// What the caller knows about one request.
#[derive(Clone, Copy, Debug, Default)]
pub struct PickInput<'a> {
    /// In-flight tokens of each engine (non-empty).
    pub loads: &'a [u64],
    /// Where the least-loaded tie scan starts (rotate it between picks).
    pub start: usize,
    /// A uniform random draw (random policy).
    pub draw: u64,
    /// The engine that last served the session (affinity).
    pub sticky: Option<usize>,
    /// Leading prompt blocks each engine holds (prefix; empty = none known).
    pub cached_blocks: &'a [usize],
    /// Full blocks of the prompt (prefix).
    pub prompt_blocks: usize,
    /// Tokens per block (prefix).
    pub block_tokens: usize,
}

/// How affinity went for one pick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AffinityOutcome {
    /// Not an affinity pick (other policy, or no session given).
    NotAsked,
    /// A session seen for the first time (or forgotten): least-loaded.
    New,
    /// The session's last engine, within the load bound.
    Hit,
    /// The session's last engine was over the bound: least-loaded instead.
    Fallback,
}

/// The chosen engine and how affinity went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub index: usize,
    pub affinity: AffinityOutcome,
}

/// The engine with the fewest tokens, scanning from `start` (ties: the first seen).
pub fn least_loaded(loads: &[u64], start: usize) -> usize {
    let n = loads.len().max(1);
    let start = start % n;
    let mut best = start;
    for i in 1..loads.len() {
        let idx = (start + i) % n;
        if loads[idx] < loads[best] {
            best = idx;
        }
    }
    best
}

/// True when an engine at `load` may keep a session while the least loaded is at `min_load`.
pub fn within_affinity_bound(load: u64, min_load: u64, p: &PickParams) -> bool {
    load as f64 <= p.affinity_load_factor * min_load as f64 + p.affinity_load_slack_tokens as f64
}

/// Dynamo's KV-router cost of sending a `prompt_blocks` prompt to an engine
/// holding its first `cached_blocks` blocks and `load` tokens in flight.
pub fn prefix_cost(
    load: u64,
    prompt_blocks: usize,
    cached_blocks: usize,
    block_tokens: usize,
    w: f64,
) -> f64 {
    let to_prefill = prompt_blocks.saturating_sub(cached_blocks) * block_tokens;
    w * to_prefill as f64 + load as f64
}

/// Pick an engine for one request by `policy`.
pub fn choose(policy: Policy, p: &PickParams, input: &PickInput<'_>) -> Choice {
    let n = input.loads.len();
    assert!(n > 0, "choose needs at least one engine");
    let least = || least_loaded(input.loads, input.start);
    let plain = |index| Choice {
        index,
        affinity: AffinityOutcome::NotAsked,
    };
    match policy {
        Policy::Random => plain((input.draw % n as u64) as usize),
        Policy::LeastLoaded => plain(least()),
        Policy::Affinity => match input.sticky.filter(|&s| s < n) {
            None => Choice {
                index: least(),
                affinity: AffinityOutcome::New,
            },
            Some(s) => {
                let min = input.loads.iter().copied().min().unwrap_or(0);
                if within_affinity_bound(input.loads[s], min, p) {
                    Choice {
                        index: s,
                        affinity: AffinityOutcome::Hit,
                    }
                } else {
                    Choice {
                        index: least(),
                        affinity: AffinityOutcome::Fallback,
                    }
                }
            }
        },
        Policy::Prefix => {
            let cost = |i: usize| {
                let cached = input.cached_blocks.get(i).copied().unwrap_or(0);
                prefix_cost(
                    input.loads[i],
                    input.prompt_blocks,
                    cached,
                    input.block_tokens,
                    p.prefix_overlap_weight,
                )
            };
            let start = input.start % n;
            let mut best = start;
            for k in 1..n {
                let i = (start + k) % n;
                let (ci, cb) = (cost(i), cost(best));
                if ci < cb || (ci == cb && input.loads[i] < input.loads[best]) {
                    best = i;
                }
            }
            plain(best)
        }
    }
}

/// Session -> the engine that last served it; at most `capacity` sessions
/// (the least recently used goes first), each forgotten `ttl` after its last use.
#[derive(Debug)]
pub struct SessionMap {
    capacity: usize,
    ttl: Duration,
    tick: u64,
    map: HashMap<String, (usize, u64, Instant)>,
    order: BTreeMap<u64, String>,
}

impl SessionMap {
    /// An empty map of at most `capacity` (>= 1) sessions.
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        SessionMap {
            capacity: capacity.max(1),
            ttl,
            tick: 0,
            map: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    /// The engine of `session`, unless unknown or idle for longer than the TTL.
    pub fn get(&mut self, session: &str, now: Instant) -> Option<usize> {
        let &(engine, tick, used) = self.map.get(session)?;
        if now.saturating_duration_since(used) > self.ttl {
            self.map.remove(session);
            self.order.remove(&tick);
            return None;
        }
        Some(engine)
    }

    /// Remember that `engine` served `session` now.
    pub fn set(&mut self, session: &str, engine: usize, now: Instant) {
        self.tick += 1;
        if let Some((_, old, _)) = self.map.remove(session) {
            self.order.remove(&old);
        }
        while self.map.len() >= self.capacity {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.map.remove(&oldest);
        }
        self.map
            .insert(session.to_owned(), (engine, self.tick, now));
        self.order.insert(self.tick, session.to_owned());
    }

    /// Sessions remembered.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no session is remembered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Which engines hold which block (by 32-byte block key), from the nodes'
/// KV events; at most 64 engines.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    holders: HashMap<[u8; 32], u64>,
}

/// Engines a [`PrefixIndex`] can track.
pub const PREFIX_INDEX_MAX_ENGINES: usize = 64;

impl PrefixIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Engine `engine` (< 64) now holds `key` (`stored`) or no longer does.
    pub fn apply(&mut self, engine: usize, key: [u8; 32], stored: bool) {
        if engine >= PREFIX_INDEX_MAX_ENGINES {
            return;
        }
        let bit = 1u64 << engine;
        if stored {
            *self.holders.entry(key).or_insert(0) |= bit;
        } else if let Some(m) = self.holders.get_mut(&key) {
            *m &= !bit;
            if *m == 0 {
                self.holders.remove(&key);
            }
        }
    }

    /// Forget everything `engine` held (its event stream lagged or restarted:
    /// a resync follows).
    pub fn clear_engine(&mut self, engine: usize) {
        if engine >= PREFIX_INDEX_MAX_ENGINES {
            return;
        }
        let bit = 1u64 << engine;
        self.holders.retain(|_, m| {
            *m &= !bit;
            *m != 0
        });
    }

    /// For each of `engines` engines: how many leading blocks of `keys` it holds.
    pub fn cached_blocks(&self, keys: &[[u8; 32]], engines: usize) -> Vec<usize> {
        let mut out = vec![0; engines];
        let mut alive = if engines >= 64 {
            u64::MAX
        } else {
            (1u64 << engines) - 1
        };
        for (depth, k) in keys.iter().enumerate() {
            alive &= self.holders.get(k).copied().unwrap_or(0);
            if alive == 0 {
                break;
            }
            for (e, o) in out.iter_mut().enumerate().take(PREFIX_INDEX_MAX_ENGINES) {
                if alive & (1 << e) != 0 {
                    *o = depth + 1;
                }
            }
        }
        out
    }

    /// Blocks indexed (any engine).
    pub fn len(&self) -> usize {
        self.holders.len()
    }

    /// True when nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.holders.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(loads: &'a [u64]) -> PickInput<'a> {
        PickInput {
            loads,
            block_tokens: 16,
            ..PickInput::default()
        }
    }

    #[test]
    fn policies_parse_and_random_uses_the_draw() {
        for p in Policy::ALL {
            assert_eq!(Policy::parse(p.as_str()), Some(p));
        }
        assert_eq!(Policy::parse("round-robin"), None);
        let loads = [0, 0, 0];
        for d in 0..9 {
            let c = choose(
                Policy::Random,
                &PickParams::default(),
                &PickInput {
                    draw: d,
                    ..input(&loads)
                },
            );
            assert_eq!(c.index, (d % 3) as usize);
        }
    }

    #[test]
    fn affinity_sticks_while_within_the_bound_and_falls_back_when_overloaded() {
        let p = PickParams {
            affinity_load_factor: 1.5,
            affinity_load_slack_tokens: 100,
            prefix_overlap_weight: 1.0,
        };
        // Sticky engine 2 at 250 <= 1.5 * 100 + 100: it keeps the session.
        let loads = [100, 120, 250];
        let c = choose(
            Policy::Affinity,
            &p,
            &PickInput {
                sticky: Some(2),
                ..input(&loads)
            },
        );
        assert_eq!(
            c,
            Choice {
                index: 2,
                affinity: AffinityOutcome::Hit
            }
        );
        // At 251 it is over the bound: least-loaded (engine 0) instead.
        let loads = [100, 120, 251];
        let c = choose(
            Policy::Affinity,
            &p,
            &PickInput {
                sticky: Some(2),
                ..input(&loads)
            },
        );
        assert_eq!(
            c,
            Choice {
                index: 0,
                affinity: AffinityOutcome::Fallback
            }
        );
        // No session known: least-loaded, counted as new.
        let c = choose(Policy::Affinity, &p, &input(&loads));
        assert_eq!(
            c,
            Choice {
                index: 0,
                affinity: AffinityOutcome::New
            }
        );
    }

    #[test]
    fn prefix_picks_the_longest_prefix_unless_the_engine_is_overloaded() {
        let p = PickParams::default();
        // 10-block prompt, 16 tokens a block; engine 1 holds 8 blocks.
        let cached = [0, 8, 2];
        let loads = [0, 50, 0];
        let c = choose(
            Policy::Prefix,
            &p,
            &PickInput {
                cached_blocks: &cached,
                prompt_blocks: 10,
                ..input(&loads)
            },
        );
        // costs: 160, 32 + 50, 128 -> engine 1.
        assert_eq!(c.index, 1);
        // Engine 1 busy with 200 tokens: cost 232 > 128 -> engine 2 (2 blocks cached).
        let loads = [0, 200, 0];
        let c = choose(
            Policy::Prefix,
            &p,
            &PickInput {
                cached_blocks: &cached,
                prompt_blocks: 10,
                ..input(&loads)
            },
        );
        assert_eq!(c.index, 2);
        // Nothing cached anywhere: least-loaded.
        let loads = [50, 10, 30];
        let c = choose(
            Policy::Prefix,
            &p,
            &PickInput {
                prompt_blocks: 10,
                ..input(&loads)
            },
        );
        assert_eq!(c.index, 1);
    }

    #[test]
    fn session_map_is_bounded_lru_with_ttl() {
        let t0 = Instant::now();
        let mut m = SessionMap::new(2, Duration::from_secs(10));
        m.set("a", 0, t0);
        m.set("b", 1, t0);
        assert_eq!(m.get("a", t0), Some(0));
        m.set("a", 2, t0); // "a" used again: "b" is now the oldest
        m.set("c", 1, t0);
        assert_eq!(m.len(), 2);
        assert_eq!(m.get("b", t0), None, "least recently used went first");
        assert_eq!(m.get("a", t0), Some(2));
        assert_eq!(m.get("c", t0), Some(1));
        assert_eq!(m.get("a", t0 + Duration::from_secs(11)), None, "expired");
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn prefix_index_counts_leading_blocks_per_engine() {
        let k = |i: u8| [i; 32];
        let mut ix = PrefixIndex::new();
        for i in 0..4 {
            ix.apply(0, k(i), true);
        }
        ix.apply(1, k(0), true);
        ix.apply(1, k(2), true); // not a prefix: block 1 missing
        assert_eq!(
            ix.cached_blocks(&[k(0), k(1), k(2), k(3)], 3),
            vec![4, 1, 0]
        );
        ix.apply(0, k(1), false);
        assert_eq!(ix.cached_blocks(&[k(0), k(1), k(2)], 3), vec![1, 1, 0]);
        ix.clear_engine(0);
        assert_eq!(ix.cached_blocks(&[k(0)], 2), vec![0, 1]);
        ix.clear_engine(1);
        assert!(ix.is_empty());
    }
}
