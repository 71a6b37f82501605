//! The router's shared state: the configured mode's endpoint sets, the
//! upstream client, metrics, the tenant gate and, for `policy = "prefix"`,
//! the prefix routing of the set it applies to (plain engines, or the
//! prefill engines; decode hops then pick least-loaded: the decode engine
//! loads what the prefill engine just saved, wherever it runs). Its own file
//! so the request paths (`server.rs` plain mode, `disagg.rs` two hops) both
//! depend on it and not on each other.

use std::time::Duration;

use prometheus_client::registry::Registry;

use crate::balance::{EndpointSet, LoadGuard, SessionLimits};
use crate::config::{Mode, Policy, RouterConfig};
use crate::error::RouterError;
use crate::kv_events::NodeClient;
use crate::metrics::RouterMetrics;
use crate::prefix::PrefixRouting;
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
    /// `policy = "prefix"`: keys and the nodes' KV events for the routed set.
    pub prefix: Option<PrefixRouting>,
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
        let prefix_of = |urls: &[String]| {
            (policy == Policy::Prefix).then(|| {
                let client = NodeClient {
                    tls: tls.clone(),
                    api_key: cfg.kv_events_api_key.clone(),
                    connect_timeout: connect,
                };
                let keys =
                    Upstream::new(connect, Duration::from_millis(cfg.prefix_keys_timeout_ms));
                PrefixRouting::start(
                    urls,
                    |u| cfg.node_of(u).map(str::to_owned),
                    client,
                    keys,
                    &metrics,
                )
            })
        };
        let (routing, prefix) = match mode {
            Mode::Disaggregated { prefill, decode } => {
                let decode_policy = match policy {
                    Policy::Prefix => Policy::LeastLoaded,
                    p => p,
                };
                let prefix = prefix_of(&prefill);
                let routing = Routing::Disaggregated {
                    prefill: set(&prefill, &metrics.inflight_prefill_tokens, policy),
                    decode: set(&decode, &metrics.inflight_decode_tokens, decode_policy),
                };
                (routing, prefix)
            }
            Mode::Plain { engines } => {
                let prefix = prefix_of(&engines);
                let routing = Routing::Plain {
                    engines: set(&engines, &metrics.inflight_decode_tokens, policy),
                };
                (routing, prefix)
            }
        };
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
            prefix,
        })
    }

    /// Pick an endpoint of `set` for `req`, reserving `tokens`; counts how
    /// affinity went and, for a `prefix` set, asks for the request's block
    /// keys first and counts what the pick matched.
    pub async fn pick(&self, set: &EndpointSet, tokens: u64, req: &ClientRequest) -> LoadGuard {
        let hint = match (&self.prefix, set.policy()) {
            (Some(p), Policy::Prefix) => p.hint(set, req, &self.metrics).await,
            _ => None,
        };
        let (guard, affinity, matched) =
            set.pick_with(tokens, req.headers.session_id(), hint.as_ref());
        self.metrics.affinity(affinity);
        if let Some(h) = &hint {
            self.metrics.prefix_picks.inc();
            self.metrics.prefix_prompt_blocks.inc_by(h.blocks as u64);
            self.metrics.prefix_matched_blocks.inc_by(matched as u64);
        }
        guard
    }
}
