//! The router's shared state: the configured mode's endpoint sets, the
//! upstream client, metrics, the tenant gate and, for `policy = "prefix"`,
//! the prefix routing of each set it applies to: plain engines, or the
//! prefill engines and, when `engine_nodes` names any decode engine, the
//! decode engines too. Without decode nodes a decode hop picks
//! least-loaded: the decode engine loads what the prefill engine just
//! saved, wherever it runs. With them it prefers the decode engine whose
//! node already holds the most of the prompt (a session's earlier turns it
//! decoded), so fewer blocks move. A request's block keys are asked once
//! and serve both hops. Its own file so the request paths (`server.rs`
//! plain mode, `disagg.rs` two hops) both depend on it and not on each
//! other.

use std::time::Duration;

use prometheus_client::registry::Registry;

use crate::balance::{EndpointSet, LoadGuard, SessionLimits};
use crate::config::{Mode, Policy, RouterConfig};
use crate::error::RouterError;
use crate::kv_events::NodeClient;
use crate::metrics::RouterMetrics;
use crate::prefix::{KeysClient, PrefixRouting, RequestKeys};
use crate::proxy::Upstream;
use crate::request::ClientRequest;
use kvfabric_tenants::{TenantGate, TenantMetrics};

/// Endpoint sets of the configured mode.
#[derive(Debug)]
pub(crate) enum Routing {
    Disaggregated {
        prefill: EndpointSet,
        decode: EndpointSet,
    },
    Plain {
        engines: EndpointSet,
    },
}

/// Everything a handler needs.
#[derive(Debug)]
pub(crate) struct RouterState {
    pub routing: Routing,
    pub mode_label: &'static str,
    pub upstream: Upstream,
    pub metrics: RouterMetrics,
    pub registry: Registry,
    /// API keys and per-tenant limits.
    pub tenants: TenantGate,
    /// `policy = "prefix"`: the client that asks engines for a request's
    /// block keys (once per request, for every hop).
    pub keys: Option<KeysClient>,
    /// `policy = "prefix"`: the nodes' KV events for the plain or prefill
    /// engines.
    pub prefix: Option<PrefixRouting>,
    /// The same for the decode engines, when any has a node.
    pub decode_prefix: Option<PrefixRouting>,
}

/// Which set a pick is for: each has its own prefix routing and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Plain engines (whole requests) or prefill engines.
    Prefill,
    Decode,
}

impl RouterState {
    /// Validate `cfg` and build the state; `metrics` must be registered in
    /// `registry`. `tls`: client TLS for the nodes' KV event streams.
    pub fn new(
        cfg: &RouterConfig,
        metrics: RouterMetrics,
        mut registry: Registry,
        tls: Option<tonic::transport::ClientTlsConfig>,
    ) -> Result<RouterState, RouterError> {
        let mode = cfg.validate()?;
        let tenants = TenantGate::from_config(
            cfg.tenants_file.as_deref(),
            TenantMetrics::default(),
            "router",
        )?;
        tenants.metrics().register(&mut registry);
        tenants.spawn_reloader(Duration::from_millis(cfg.tenants_reload_ms));
        let policy = cfg.policy()?;
        let params = cfg.pick_params();
        let limits = SessionLimits {
            capacity: cfg.affinity_sessions,
            ttl: Duration::from_millis(cfg.affinity_ttl_ms),
        };
        let set = |urls: &[String], gauges, policy| {
            EndpointSet::new(urls, gauges, policy, params, limits)
        };
        let mode_label = mode.label();
        let connect = Duration::from_millis(cfg.connect_timeout_ms);
        let has_node = |urls: &[String]| urls.iter().any(|u| cfg.node_of(u).is_some());
        let prefix_of = |urls: &[String]| {
            (policy == Policy::Prefix).then(|| {
                let client = NodeClient {
                    tls: tls.clone(),
                    api_key: cfg.kv_events_api_key.clone(),
                    connect_timeout: connect,
                };
                PrefixRouting::start(
                    urls,
                    |u| cfg.node_of(u).map(str::to_owned),
                    client,
                    &metrics,
                )
            })
        };
        let (routing, prefix, decode_prefix) = match mode {
            Mode::Disaggregated { prefill, decode } => {
                let decode_prefix = has_node(&decode).then(|| prefix_of(&decode)).flatten();
                let decode_policy = match policy {
                    Policy::Prefix if decode_prefix.is_none() => Policy::LeastLoaded,
                    p => p,
                };
                let prefix = prefix_of(&prefill);
                let routing = Routing::Disaggregated {
                    prefill: set(&prefill, &metrics.inflight_prefill_tokens, policy),
                    decode: set(&decode, &metrics.inflight_decode_tokens, decode_policy),
                };
                (routing, prefix, decode_prefix)
            }
            Mode::Plain { engines } => {
                let prefix = prefix_of(&engines);
                let routing = Routing::Plain {
                    engines: set(&engines, &metrics.inflight_decode_tokens, policy),
                };
                (routing, prefix, None)
            }
        };
        let keys = prefix.is_some().then(|| {
            KeysClient::new(Upstream::new(
                connect,
                Duration::from_millis(cfg.prefix_keys_timeout_ms),
            ))
        });
        Ok(RouterState {
            routing,
            mode_label,
            upstream: Upstream::new(
                Duration::from_millis(cfg.connect_timeout_ms),
                Duration::from_millis(cfg.request_timeout_ms),
            ),
            metrics,
            registry,
            tenants,
            keys,
            prefix,
            decode_prefix,
        })
    }

    /// Pick a plain engine of `set` for `req`, reserving `tokens`: its
    /// block keys first under `policy = "prefix"`, then [`Self::pick_keyed`].
    pub async fn pick(&self, set: &EndpointSet, tokens: u64, req: &ClientRequest) -> LoadGuard {
        let keys = self.request_keys(set, req).await;
        self.pick_keyed(set, Stage::Prefill, tokens, req, keys.as_ref())
    }

    /// `req`'s block keys, asked of an engine of `set`, when `set` routes
    /// by prefix; None otherwise or when the call failed (counted).
    pub async fn request_keys(
        &self,
        set: &EndpointSet,
        req: &ClientRequest,
    ) -> Option<RequestKeys> {
        if set.policy() != Policy::Prefix {
            return None;
        }
        self.keys
            .as_ref()?
            .request_keys(set, req, &self.metrics)
            .await
    }

    /// Pick an endpoint of `set` (the `stage` set) for `req`, reserving
    /// `tokens`; counts how affinity went and, for a `prefix` set given the
    /// request's `keys`, what the pick matched.
    pub fn pick_keyed(
        &self,
        set: &EndpointSet,
        stage: Stage,
        tokens: u64,
        req: &ClientRequest,
        keys: Option<&RequestKeys>,
    ) -> LoadGuard {
        let (routing, counters) = match stage {
            Stage::Prefill => (&self.prefix, &self.metrics.prefix),
            Stage::Decode => (&self.decode_prefix, &self.metrics.decode_prefix),
        };
        let hint = match (routing, keys, set.policy()) {
            (Some(r), Some(k), Policy::Prefix) => Some(r.hint(k, set.len())),
            _ => None,
        };
        let (guard, affinity, matched) =
            set.pick_with(tokens, req.headers.session_id(), hint.as_ref());
        self.metrics.affinity(affinity);
        if let Some(h) = &hint {
            counters.count(h.blocks, matched);
        }
        guard
    }
}
