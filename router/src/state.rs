//! The router's shared state: the configured mode's endpoint sets, the
//! upstream client, metrics and the tenant gate. Its own file so the
//! request paths (`server.rs` plain mode, `disagg.rs` two hops) both depend
//! on it and not on each other.

use std::time::Duration;

use prometheus_client::registry::Registry;

use crate::balance::{EndpointSet, LoadGuard, SessionLimits};
use crate::config::{Mode, RouterConfig};
use crate::error::RouterError;
use crate::metrics::RouterMetrics;
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
}

impl RouterState {
    /// Validate `cfg` and build the state; `metrics` must be registered in `registry`.
    pub fn new(
        cfg: &RouterConfig,
        metrics: RouterMetrics,
        mut registry: Registry,
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
        let set = |urls: &[String], gauges| EndpointSet::new(urls, gauges, policy, params, limits);
        let mode_label = mode.label();
        let routing = match mode {
            Mode::Disaggregated { prefill, decode } => Routing::Disaggregated {
                prefill: set(&prefill, &metrics.inflight_prefill_tokens),
                decode: set(&decode, &metrics.inflight_decode_tokens),
            },
            Mode::Plain { engines } => Routing::Plain {
                engines: set(&engines, &metrics.inflight_decode_tokens),
            },
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
        })
    }

    /// Pick an endpoint of `set` for `req`, reserving `tokens`; counts how
    /// affinity went.
    pub fn pick(&self, set: &EndpointSet, tokens: u64, req: &ClientRequest) -> LoadGuard {
        let (guard, affinity) = set.pick(tokens, req.headers.session_id());
        self.metrics.affinity(affinity);
        guard
    }
}
