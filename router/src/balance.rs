//! Endpoint load tracking and picking.
//!
//! Load is counted in tokens, not requests: one 4k-token prompt costs a
//! prefill engine as much as dozens of short ones, so "fewest requests" would
//! pile long prompts on one engine. Each endpoint's load is its
//! `inflight_*_tokens{endpoint}` gauge: picking adds the request's estimate
//! and returns a [`LoadGuard`] that subtracts it when dropped, so the tokens
//! are released on every path (answered, failed, timed out, client gone)
//! without bookkeeping at each exit.
//!
//! Picks run under a lock (read all gauges, choose, add to the winner) so
//! two concurrent requests never both see the same idle engine; ties rotate,
//! so an idle cluster still spreads sequential requests. The choice itself is
//! `pick.rs`'s pure [`choose`] (shared with `kvfabric bench agentic`); this
//! file owns the state it reads: gauges, the tie-break start, the session map.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use rand::Rng;

use crate::metrics::EndpointLabels;
use crate::pick::{
    choose, least_loaded, AffinityOutcome, PickInput, PickParams, Policy, SessionMap,
};

/// One engine and its in-flight tokens.
#[derive(Debug)]
pub(crate) struct Endpoint {
    /// Base URL, e.g. `http://127.0.0.1:8001`.
    pub url: String,
    inflight_tokens: Gauge,
}

/// Endpoints of one kind (prefill, decode or plain engines).
#[derive(Debug)]
pub(crate) struct EndpointSet {
    endpoints: Vec<Arc<Endpoint>>,
    policy: Policy,
    params: PickParams,
    /// Tie-break start and sessions; the lock also makes read+add atomic.
    state: Mutex<PickState>,
}

/// What picks remember between requests.
#[derive(Debug)]
struct PickState {
    /// Where the next tie-break scan starts.
    next: usize,
    /// Session -> index of the endpoint that last served it (affinity).
    sessions: SessionMap,
}

/// How sessions are remembered (affinity).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SessionLimits {
    pub capacity: usize,
    pub ttl: Duration,
}

/// What each endpoint's node holds of one prompt (the `prefix` policy's
/// inputs, gathered by `prefix.rs`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PrefixHint {
    /// Leading prompt blocks each endpoint's node holds.
    pub cached: Vec<usize>,
    /// Blocks past the shared prefix each holds, counted one by one.
    pub own_held: Vec<usize>,
    /// Full blocks of the prompt.
    pub blocks: usize,
    /// Leading blocks other prompts share.
    pub shared: usize,
    pub block_tokens: usize,
}

/// Tokens reserved on an endpoint; released when dropped.
#[derive(Debug)]
pub(crate) struct LoadGuard {
    endpoint: Arc<Endpoint>,
    tokens: i64,
}

impl LoadGuard {
    /// The endpoint's base URL.
    pub fn url(&self) -> &str {
        &self.endpoint.url
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.endpoint.inflight_tokens.dec_by(self.tokens);
    }
}

impl EndpointSet {
    /// Endpoints `urls` (non-empty), loads kept in `gauges{endpoint=url}`.
    pub fn new(
        urls: &[String],
        gauges: &Family<EndpointLabels, Gauge>,
        policy: Policy,
        params: PickParams,
        limits: SessionLimits,
    ) -> Self {
        let endpoints = urls
            .iter()
            .map(|url| {
                let gauge = gauges
                    .get_or_create(&EndpointLabels {
                        endpoint: url.clone(),
                    })
                    .clone();
                Arc::new(Endpoint {
                    url: url.clone(),
                    inflight_tokens: gauge,
                })
            })
            .collect();
        EndpointSet {
            endpoints,
            policy,
            params,
            state: Mutex::new(PickState {
                next: 0,
                sessions: SessionMap::new(limits.capacity, limits.ttl),
            }),
        }
    }

    /// The first endpoint's URL (for `GET /v1/models`).
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        self.endpoints.iter().map(|e| e.url.as_str())
    }

    /// Endpoints in the set.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// The policy picks use.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The least loaded endpoint now, without reserving anything.
    pub fn least_loaded_url(&self) -> String {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let i = least_loaded(&self.loads(), st.next);
        self.endpoints[i].url.clone()
    }

    fn loads(&self) -> Vec<u64> {
        self.endpoints
            .iter()
            .map(|e| e.inflight_tokens.get().max(0) as u64)
            .collect()
    }

    /// Pick an endpoint by the policy and reserve `tokens` on it; `session`
    /// is the client's `x-session-affinity` (used by the affinity policy).
    #[cfg(test)]
    pub fn pick(&self, tokens: u64, session: Option<&str>) -> (LoadGuard, AffinityOutcome) {
        let (guard, affinity, _) = self.pick_with(tokens, session, None);
        (guard, affinity)
    }

    /// Pick an endpoint by the policy and reserve `tokens` on it, with the
    /// `prefix` policy's inputs; without
    /// them (the keys call failed) a `prefix` set picks least-loaded.
    /// Also returns the chosen endpoint's cached leading blocks (0 without a hint).
    pub fn pick_with(
        &self,
        tokens: u64,
        session: Option<&str>,
        prefix: Option<&PrefixHint>,
    ) -> (LoadGuard, AffinityOutcome, usize) {
        let tokens = i64::try_from(tokens).unwrap_or(i64::MAX / 2);
        // A poisoned lock only means another pick panicked; the state is still usable.
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let loads = self.loads();
        let policy = match (self.policy, prefix) {
            (Policy::Prefix, None) => Policy::LeastLoaded,
            (p, _) => p,
        };
        let hint = prefix.cloned().unwrap_or_default();
        let sticky = match (self.policy, session) {
            (Policy::Affinity, Some(s)) => st.sessions.get(s, now),
            _ => None,
        };
        let mut choice = choose(
            policy,
            &self.params,
            &PickInput {
                loads: &loads,
                start: st.next,
                draw: rand::rng().random(),
                sticky,
                cached_blocks: &hint.cached,
                prompt_blocks: hint.blocks,
                shared_blocks: Some(hint.shared),
                own_held: &hint.own_held,
                block_tokens: hint.block_tokens,
            },
        );
        if self.policy == Policy::Affinity {
            match session {
                Some(s) => st.sessions.set(s, choice.index, now),
                None => choice.affinity = AffinityOutcome::NotAsked,
            }
        }
        st.next = choice.index + 1;
        let endpoint = self.endpoints[choice.index].clone();
        endpoint.inflight_tokens.inc_by(tokens);
        let matched = hint.cached.get(choice.index).copied().unwrap_or(0);
        (LoadGuard { endpoint, tokens }, choice.affinity, matched)
    }

    /// Sessions remembered now.
    #[cfg(test)]
    fn sessions(&self) -> usize {
        self.state.lock().map(|s| s.sessions.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(n: usize, policy: Policy) -> (EndpointSet, Family<EndpointLabels, Gauge>) {
        let gauges = Family::<EndpointLabels, Gauge>::default();
        let urls: Vec<String> = (0..n).map(|i| format!("http://e{i}:1")).collect();
        let limits = SessionLimits {
            capacity: 4,
            ttl: Duration::from_secs(60),
        };
        let params = PickParams {
            affinity_load_slack_tokens: 100,
            ..PickParams::default()
        };
        (
            EndpointSet::new(&urls, &gauges, policy, params, limits),
            gauges,
        )
    }

    fn load(gauges: &Family<EndpointLabels, Gauge>, url: &str) -> i64 {
        gauges
            .get_or_create(&EndpointLabels {
                endpoint: url.into(),
            })
            .get()
    }

    #[test]
    fn least_loaded_picks_the_endpoint_with_fewest_tokens() {
        let (s, gauges) = set(3, Policy::LeastLoaded);
        let big = s.pick(1000, None).0;
        let mid = s.pick(100, None).0;
        assert_ne!(big.url(), mid.url());
        let small = s.pick(10, None).0;
        let taken = [big.url(), mid.url(), small.url()];
        assert!(
            taken
                .iter()
                .all(|u| taken.iter().filter(|v| *v == u).count() == 1),
            "each idle endpoint gets one: {taken:?}"
        );
        // Now loads are 1000 / 100 / 10: the next request goes to the 10-token one.
        let next = s.pick(50, None).0;
        assert_eq!(next.url(), small.url());
        assert_eq!(load(&gauges, small.url()), 60);
        // Then 1000 / 100 / 60: the 60 one again.
        let again = s.pick(5, None).0;
        assert_eq!(again.url(), small.url());
        // Releasing the big one makes it the least loaded.
        let big_url = big.url().to_owned();
        drop(big);
        assert_eq!(load(&gauges, &big_url), 0);
        assert_eq!(s.pick(1, None).0.url(), big_url);
    }

    #[test]
    fn tokens_are_released_on_completion_and_on_error_paths() {
        let (s, gauges) = set(2, Policy::LeastLoaded);
        let url = {
            let g = s.pick(300, None).0;
            assert_eq!(load(&gauges, g.url()), 300);
            g.url().to_owned()
        }; // completed: guard dropped at scope end
        assert_eq!(load(&gauges, &url), 0);
        // An error path: the guard is dropped by an early return.
        fn failing_hop(s: &EndpointSet) -> Result<(), String> {
            let _g = s.pick(77, None).0;
            Err("upstream failed".into())
        }
        assert!(failing_hop(&s).is_err());
        assert_eq!(load(&gauges, "http://e0:1"), 0);
        assert_eq!(load(&gauges, "http://e1:1"), 0);
    }

    #[test]
    fn ties_rotate_and_random_stays_in_range() {
        let (s, _) = set(2, Policy::LeastLoaded);
        let a = s.pick(0, None).0.url().to_owned();
        let b = s.pick(0, None).0.url().to_owned();
        assert_ne!(a, b, "idle endpoints alternate");
        let (r, gauges) = set(3, Policy::Random);
        let guards: Vec<LoadGuard> = (0..30).map(|_| r.pick(1, None).0).collect();
        let total: i64 = (0..3)
            .map(|i| load(&gauges, &format!("http://e{i}:1")))
            .sum();
        assert_eq!(total, 30);
        drop(guards);
        let total: i64 = (0..3)
            .map(|i| load(&gauges, &format!("http://e{i}:1")))
            .sum();
        assert_eq!(total, 0);
    }

    #[test]
    fn prefix_follows_the_hint_and_without_one_picks_least_loaded() {
        let (s, gauges) = set(3, Policy::Prefix);
        let busy = s.pick_with(100, None, None).0;
        assert_eq!(busy.url(), "http://e0:1");
        // Engine 0 holds 8 of the prompt's 10 blocks (16 tokens each): its
        // 100 tokens in flight cost less than 160 tokens to prefill elsewhere.
        let hint = PrefixHint {
            cached: vec![8, 0, 0],
            own_held: vec![0, 0, 0],
            blocks: 10,
            shared: 10,
            block_tokens: 16,
        };
        let (g, _, matched) = s.pick_with(1, None, Some(&hint));
        assert_eq!((g.url(), matched), ("http://e0:1", 8));
        drop(g);
        // Without keys (the call failed): the least loaded, not engine 0.
        let (g, _, matched) = s.pick_with(1, None, None);
        assert_ne!(g.url(), "http://e0:1");
        assert_eq!(matched, 0);
        drop((g, busy));
        assert_eq!(load(&gauges, "http://e0:1"), 0);
    }

    #[test]
    fn affinity_sticks_falls_back_when_overloaded_and_bounds_sessions() {
        let (s, _) = set(3, Policy::Affinity);
        let (g, out) = s.pick(10, Some("s1"));
        assert_eq!(out, AffinityOutcome::New);
        let home = g.url().to_owned();
        drop(g);
        for _ in 0..5 {
            let (g, out) = s.pick(10, Some("s1"));
            assert_eq!((g.url(), out), (home.as_str(), AffinityOutcome::Hit));
        }
        // Its engine busy beyond 1.5 x 0 + 100 tokens: another engine, counted as a fallback.
        let (busy, _) = s.pick(500, Some("s1"));
        assert_eq!(busy.url(), home);
        let (g, out) = s.pick(10, Some("s1"));
        assert_eq!(out, AffinityOutcome::Fallback);
        assert_ne!(g.url(), home);
        // ... and the session now follows the engine that served it.
        let moved = g.url().to_owned();
        drop(g);
        assert_eq!(s.pick(1, Some("s1")).0.url(), moved);
        // No header: no affinity bookkeeping.
        assert_eq!(s.pick(1, None).1, AffinityOutcome::NotAsked);
        // The map holds at most 4 sessions.
        for i in 0..10 {
            let _ = s.pick(1, Some(&format!("other-{i}")));
        }
        assert_eq!(s.sessions(), 4);
    }
}
