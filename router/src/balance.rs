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
//! Least-loaded picks under a lock (read all gauges, add to the winner) so
//! two concurrent requests never both see the same idle engine; ties rotate,
//! so an idle cluster still spreads sequential requests.

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use rand::Rng;

use crate::config::Policy;
use crate::metrics::EndpointLabels;

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
    /// Where the next tie-break scan starts; the lock also makes read+add atomic.
    next: Mutex<usize>,
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
    pub fn new(urls: &[String], gauges: &Family<EndpointLabels, Gauge>, policy: Policy) -> Self {
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
            next: Mutex::new(0),
        }
    }

    /// The first endpoint's URL (for `GET /v1/models`).
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        self.endpoints.iter().map(|e| e.url.as_str())
    }

    /// Pick an endpoint by the policy and reserve `tokens` on it.
    pub fn pick(&self, tokens: u64) -> LoadGuard {
        let tokens = i64::try_from(tokens).unwrap_or(i64::MAX / 2);
        let n = self.endpoints.len();
        // A poisoned lock only means another pick panicked; the index is still usable.
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let chosen = match self.policy {
            Policy::Random => rand::rng().random_range(0..n),
            Policy::LeastLoaded => {
                let start = *next % n;
                let mut best = start;
                for i in 1..n {
                    let idx = (start + i) % n;
                    if self.endpoints[idx].inflight_tokens.get()
                        < self.endpoints[best].inflight_tokens.get()
                    {
                        best = idx;
                    }
                }
                best
            }
        };
        *next = chosen + 1;
        let endpoint = self.endpoints[chosen].clone();
        endpoint.inflight_tokens.inc_by(tokens);
        LoadGuard { endpoint, tokens }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(n: usize, policy: Policy) -> (EndpointSet, Family<EndpointLabels, Gauge>) {
        let gauges = Family::<EndpointLabels, Gauge>::default();
        let urls: Vec<String> = (0..n).map(|i| format!("http://e{i}:1")).collect();
        (EndpointSet::new(&urls, &gauges, policy), gauges)
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
        let big = s.pick(1000);
        let mid = s.pick(100);
        assert_ne!(big.url(), mid.url());
        let small = s.pick(10);
        let taken = [big.url(), mid.url(), small.url()];
        assert!(
            taken
                .iter()
                .all(|u| taken.iter().filter(|v| *v == u).count() == 1),
            "each idle endpoint gets one: {taken:?}"
        );
        // Now loads are 1000 / 100 / 10: the next request goes to the 10-token one.
        let next = s.pick(50);
        assert_eq!(next.url(), small.url());
        assert_eq!(load(&gauges, small.url()), 60);
        // Then 1000 / 100 / 60: the 60 one again.
        let again = s.pick(5);
        assert_eq!(again.url(), small.url());
        // Releasing the big one makes it the least loaded.
        let big_url = big.url().to_owned();
        drop(big);
        assert_eq!(load(&gauges, &big_url), 0);
        assert_eq!(s.pick(1).url(), big_url);
    }

    #[test]
    fn tokens_are_released_on_completion_and_on_error_paths() {
        let (s, gauges) = set(2, Policy::LeastLoaded);
        let url = {
            let g = s.pick(300);
            assert_eq!(load(&gauges, g.url()), 300);
            g.url().to_owned()
        }; // completed: guard dropped at scope end
        assert_eq!(load(&gauges, &url), 0);
        // An error path: the guard is dropped by an early return.
        fn failing_hop(s: &EndpointSet) -> Result<(), String> {
            let _g = s.pick(77);
            Err("upstream failed".into())
        }
        assert!(failing_hop(&s).is_err());
        assert_eq!(load(&gauges, "http://e0:1"), 0);
        assert_eq!(load(&gauges, "http://e1:1"), 0);
    }

    #[test]
    fn ties_rotate_and_random_stays_in_range() {
        let (s, _) = set(2, Policy::LeastLoaded);
        let a = s.pick(0).url().to_owned();
        let b = s.pick(0).url().to_owned();
        assert_ne!(a, b, "idle endpoints alternate");
        let (r, gauges) = set(3, Policy::Random);
        let guards: Vec<LoadGuard> = (0..30).map(|_| r.pick(1)).collect();
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
}
