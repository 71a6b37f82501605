//! The router's Prometheus metrics.
//!
//! [`RouterMetrics`] is a bundle of prometheus-client handles registered into
//! a registry the caller owns (prefix `kvfabric_router`). The in-flight token
//! gauges are not a copy of the load balancer's state: they ARE its state
//! (see `balance.rs`), so what `/metrics` shows is exactly what picks use.
//!
//! Series (after the prefix):
//! - `requests_total{mode, route, outcome}`: client requests; outcome is
//!   `ok`, `fallback` (answered by decode after the prefill hop failed),
//!   `client_error` (4xx), `upstream_error` (5xx / 502), `cancelled` (client
//!   went away first).
//! - `inflight_prefill_tokens{endpoint}`, `inflight_decode_tokens{endpoint}`:
//!   estimated tokens in flight per engine (plain-mode engines count under
//!   decode: they run whole requests).
//! - `upstream_errors_total{endpoint, hop, kind}`: hop `prefill|decode|plain|models`,
//!   kind `connect|timeout|status|bad_answer`.
//! - `prefill_fallbacks_total`: requests sent straight to decode after a failed prefill hop.
//! - `request_duration_seconds{mode, route}`: arrival to the last byte sent.
//! - `affinity_hits_total`, `affinity_fallbacks_total`: affinity-policy picks
//!   that kept a session on its last engine (its KV is there: no transfer),
//!   and picks that moved it because that engine was over the load bound.
//! - `prefix_picks_total`, `prefix_prompt_blocks_total`,
//!   `prefix_matched_blocks_total`: prefix-policy picks made with the
//!   request's block keys, their full blocks, and the leading blocks the
//!   chosen engine's node held (matched / prompt = the prefix hit ratio the
//!   router saw), for plain engines or the prefill hop;
//!   `decode_prefix_picks_total`, `decode_prefix_prompt_blocks_total`,
//!   `decode_prefix_matched_blocks_total`: the same for decode hops (routed
//!   by prefix when decode engines have `engine_nodes` entries);
//!   `prefix_fallbacks_total`: prefix-policy requests routed least-loaded
//!   because the keys call failed (once per request, whatever its hops).
//! - `kv_event_streams`: KV event subscriptions up now;
//!   `kv_events_total`: events applied to the prefix index;
//!   `kv_event_resyncs_total`: times an engine's blocks were forgotten (a
//!   `RESYNC` event or a lost stream).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of `requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `disaggregated` or `plain`.
    pub mode: String,
    /// The API path, e.g. `/v1/completions`.
    pub route: String,
    pub outcome: String,
}

/// Labels of the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub mode: String,
    pub route: String,
}

/// Labels of the per-engine gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    /// Base URL of the engine.
    pub endpoint: String,
}

/// Labels of `upstream_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamErrorLabels {
    pub endpoint: String,
    pub hop: String,
    pub kind: String,
}

fn latency_histogram() -> Histogram {
    // 5 ms .. ~164 s
    Histogram::new(exponential_buckets(0.005, 2.0, 16))
}

/// What the prefix policy's picks of one kind of hop saw.
#[derive(Clone, Debug, Default)]
pub struct PrefixPicks {
    /// Picks made with the request's block keys.
    pub picks: Counter,
    /// Full prompt blocks of those picks.
    pub prompt_blocks: Counter,
    /// Prompt blocks the chosen engine's node held.
    pub matched_blocks: Counter,
}

impl PrefixPicks {
    /// One pick over `blocks` prompt blocks, of which the engine held `matched`.
    pub fn count(&self, blocks: usize, matched: usize) {
        self.picks.inc();
        self.prompt_blocks.inc_by(blocks as u64);
        self.matched_blocks.inc_by(matched as u64);
    }

    fn register(&self, r: &mut Registry, name: &str, of: &str) {
        r.register(
            format!("{name}_picks"),
            format!("Prefix-policy picks made with the request's block keys ({of})"),
            self.picks.clone(),
        );
        r.register(
            format!("{name}_prompt_blocks"),
            format!("Full prompt blocks of the prefix-policy picks ({of})"),
            self.prompt_blocks.clone(),
        );
        r.register(
            format!("{name}_matched_blocks"),
            format!("Prompt blocks the chosen engine's node held, prefix policy ({of})"),
            self.matched_blocks.clone(),
        );
    }
}

/// Router metrics; clone freely (every clone updates the same series).
#[derive(Clone, Debug)]
pub struct RouterMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub inflight_prefill_tokens: Family<EndpointLabels, Gauge>,
    pub inflight_decode_tokens: Family<EndpointLabels, Gauge>,
    pub upstream_errors: Family<UpstreamErrorLabels, Counter>,
    pub prefill_fallbacks: Counter,
    pub affinity_hits: Counter,
    pub affinity_fallbacks: Counter,
    /// Prefix picks of plain engines or prefill hops.
    pub prefix: PrefixPicks,
    /// Prefix picks of decode hops.
    pub decode_prefix: PrefixPicks,
    pub prefix_fallbacks: Counter,
    pub kv_event_streams: Gauge,
    pub kv_events: Counter,
    pub kv_event_resyncs: Counter,
    pub request_duration_seconds: Family<RouteLabels, Histogram, fn() -> Histogram>,
}

impl Default for RouterMetrics {
    fn default() -> Self {
        RouterMetrics::new()
    }
}

impl RouterMetrics {
    /// Fresh, unregistered metrics.
    pub fn new() -> RouterMetrics {
        RouterMetrics {
            requests: Family::default(),
            inflight_prefill_tokens: Family::default(),
            inflight_decode_tokens: Family::default(),
            upstream_errors: Family::default(),
            prefill_fallbacks: Counter::default(),
            affinity_hits: Counter::default(),
            affinity_fallbacks: Counter::default(),
            prefix: PrefixPicks::default(),
            decode_prefix: PrefixPicks::default(),
            prefix_fallbacks: Counter::default(),
            kv_event_streams: Gauge::default(),
            kv_events: Counter::default(),
            kv_event_resyncs: Counter::default(),
            request_duration_seconds: Family::new_with_constructor(latency_histogram),
        }
    }

    /// Register every series under `kvfabric_router`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("kvfabric_router");
        r.register(
            "requests",
            "Client requests by mode, route and outcome",
            self.requests.clone(),
        );
        r.register(
            "inflight_prefill_tokens",
            "Estimated prompt tokens in flight per prefill engine",
            self.inflight_prefill_tokens.clone(),
        );
        r.register(
            "inflight_decode_tokens",
            "Estimated prompt + completion tokens in flight per decode (or plain) engine",
            self.inflight_decode_tokens.clone(),
        );
        r.register(
            "upstream_errors",
            "Failed engine hops by endpoint, hop and kind",
            self.upstream_errors.clone(),
        );
        r.register(
            "prefill_fallbacks",
            "Requests sent straight to decode after the prefill hop failed",
            self.prefill_fallbacks.clone(),
        );
        r.register(
            "affinity_hits",
            "Requests the affinity policy kept on their session's last engine",
            self.affinity_hits.clone(),
        );
        r.register(
            "affinity_fallbacks",
            "Requests whose session's last engine was over the affinity load bound",
            self.affinity_fallbacks.clone(),
        );
        self.prefix
            .register(r, "prefix", "plain engines or prefill hops");
        self.decode_prefix
            .register(r, "decode_prefix", "decode hops");
        r.register(
            "prefix_fallbacks",
            "Prefix-policy requests routed least-loaded because the keys call failed",
            self.prefix_fallbacks.clone(),
        );
        r.register(
            "kv_event_streams",
            "KV event subscriptions to engines' nodes up now",
            self.kv_event_streams.clone(),
        );
        r.register(
            "kv_events",
            "KV events applied to the prefix index",
            self.kv_events.clone(),
        );
        r.register(
            "kv_event_resyncs",
            "Times an engine's indexed blocks were forgotten (RESYNC or a lost stream)",
            self.kv_event_resyncs.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Client request latency, arrival to last byte",
            self.request_duration_seconds.clone(),
        );
    }

    /// Count how affinity went for one pick.
    pub(crate) fn affinity(&self, outcome: crate::pick::AffinityOutcome) {
        use crate::pick::AffinityOutcome;
        match outcome {
            AffinityOutcome::Hit => {
                self.affinity_hits.inc();
            }
            AffinityOutcome::Fallback => {
                self.affinity_fallbacks.inc();
            }
            AffinityOutcome::New | AffinityOutcome::NotAsked => {}
        }
    }

    /// Count one failed hop.
    pub(crate) fn upstream_error(&self, endpoint: &str, hop: &str, kind: &str) {
        self.upstream_errors
            .get_or_create(&UpstreamErrorLabels {
                endpoint: endpoint.to_owned(),
                hop: hop.to_owned(),
                kind: kind.to_owned(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_encoded_with_the_prefix() {
        let m = RouterMetrics::new();
        let mut registry = Registry::default();
        m.register(&mut registry);
        m.upstream_error("http://a:1", "prefill", "connect");
        m.inflight_decode_tokens
            .get_or_create(&EndpointLabels {
                endpoint: "http://b:2".into(),
            })
            .set(7);
        m.decode_prefix.count(5, 3);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains(
                r#"kvfabric_router_upstream_errors_total{endpoint="http://a:1",hop="prefill",kind="connect"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"kvfabric_router_inflight_decode_tokens{endpoint="http://b:2"} 7"#),
            "{text}"
        );
        for line in [
            "kvfabric_router_decode_prefix_picks_total 1",
            "kvfabric_router_decode_prefix_prompt_blocks_total 5",
            "kvfabric_router_decode_prefix_matched_blocks_total 3",
            "kvfabric_router_prefix_picks_total 0",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
    }
}
