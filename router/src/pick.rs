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
//! - `prefix`: Dynamo's KV-router cost with a session's own blocks weighed
//!   apart, lowest wins ([`prefix_cost`], `pick_prefix.rs`):
//!   `(prefix_overlap_weight * shared blocks missing +
//!   prefix_session_weight * own blocks missing) * block_tokens + load`,
//!   i.e. the prompt tokens
//!   the engine would still have to prefill or fetch, weighed against the
//!   tokens it already has in flight (ties: least-loaded). Shared blocks are
//!   those other prompts also start with ([`PrefixBranches`]); a caller that
//!   does not know weighs every block as shared (Dynamo's cost).
//!
//! [`SessionMap`] is the bounded session -> engine map (LRU + TTL);
//! [`PrefixIndex`] the block -> engines index built from the nodes' KV events.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

pub use crate::pick_params::{PickParams, DEFAULT_PREFIX_SESSION_WEIGHT};

pub use crate::pick_prefix::{
    prefix_cost, Held, PrefixBranches, PrefixIndex, PREFIX_INDEX_MAX_ENGINES,
};

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
    /// Leading prompt blocks other prompts share (prefix; None = unknown:
    /// every block weighs `prefix_overlap_weight`).
    pub shared_blocks: Option<usize>,
    /// Blocks past `shared_blocks` each engine holds, counted one by one
    /// (prefix; empty = counted from `cached_blocks`).
    pub own_held: &'a [usize],
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
                let held = Held {
                    leading: input.cached_blocks.get(i).copied().unwrap_or(0),
                    own: input.own_held.get(i).copied(),
                };
                prefix_cost(
                    input.loads[i],
                    input.prompt_blocks,
                    input.shared_blocks.unwrap_or(input.prompt_blocks),
                    held,
                    input.block_tokens,
                    p,
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
            ..PickParams::default()
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
    fn prefix_keeps_a_session_on_its_history_unless_clearly_overloaded() {
        // 75-block prompt (16 tokens a block): 40 blocks of system prompt
        // shared by every session, then 35 of this session's own history.
        // Engine 0 served the session (72 blocks cached) and has another
        // session's turn (1200 tokens) in flight; engine 1 holds the system
        // prompt only and is idle; engine 2 holds nothing.
        let p = PickParams::default();
        let cached = [72, 40, 0];
        let pick = |loads: &[u64], shared: Option<usize>, cached: &[usize]| {
            choose(
                Policy::Prefix,
                &p,
                &PickInput {
                    cached_blocks: cached,
                    prompt_blocks: 75,
                    shared_blocks: shared,
                    ..input(loads)
                },
            )
            .index
        };
        // Dynamo's cost (every block weighs 1): 48 + 1200 > 560: the
        // session's history moves to engine 1.
        assert_eq!(pick(&[1200, 0, 0], None, &cached), 1);
        // Its own 35 blocks weigh 4: 48 * 4 + 1200 < 560 * 4: it stays.
        assert_eq!(pick(&[1200, 0, 0], Some(40), &cached), 0);
        // Clearly overloaded (two more turns in flight): 192 + 2400 > 2240.
        assert_eq!(pick(&[2400, 0, 0], Some(40), &cached), 1);
        // A new session (its 35 history blocks cached nowhere) still
        // spreads: engine 1 copies the shared prompt (640 at weight 1)
        // rather than queue behind engine 0's 1200 tokens.
        assert_eq!(pick(&[1200, 0, 0], Some(40), &[40, 0, 0]), 1);
        // ...unless the shared prompt is the only thing to go by: with
        // every block weighed as own (nothing known shared) it piles up.
        assert_eq!(pick(&[1200, 0, 0], Some(0), &[40, 0, 0]), 0);
        // Engine 1 served the session but read the shared prompt from
        // engine 0's node: its node holds none of the leading blocks, all
        // 35 of the session's own. Counted one by one it keeps the session
        // (640 + 1200 < 2240); by the leading count alone it would not.
        let own = |own_held: &[usize]| {
            choose(
                Policy::Prefix,
                &p,
                &PickInput {
                    cached_blocks: &[40, 0, 0],
                    own_held,
                    prompt_blocks: 75,
                    shared_blocks: Some(40),
                    ..input(&[0, 1200, 0])
                },
            )
            .index
        };
        assert_eq!(own(&[0, 35, 0]), 1);
        assert_eq!(own(&[]), 0);
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
}
