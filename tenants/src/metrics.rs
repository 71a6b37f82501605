//! Per-tenant Prometheus series, registered under `kvfabric_tenant_*`.
//!
//! Names (stable): `kvfabric_tenant_requests_total{tenant}` (admitted),
//! `kvfabric_tenant_rejected_requests_total{tenant,reason}` (`rate_limit`,
//! `concurrency`), `kvfabric_tenant_inflight_requests{tenant}`,
//! `kvfabric_tenant_prompt_tokens_total{tenant}`,
//! `kvfabric_tenant_cached_tokens_total{tenant}` (prompt tokens whose KV was
//! reused), `kvfabric_tenant_hit_requests_total{tenant}` (finished requests
//! that reused at least one block), `kvfabric_tenant_auth_failures_total` (no label: a bad key names
//! no tenant, and a label per guess would grow without bound),
//! `kvfabric_tenant_config_reloads_total{result}` (`ok`, `error`) and
//! `kvfabric_tenant_configured_tenants`. In single-tenant mode every request
//! counts under `tenant="default"`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    pub tenant: String,
    /// `rate_limit` or `concurrency`.
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabel {
    /// `ok` or `error`.
    pub result: String,
}

/// The handles; clones update the same series.
#[derive(Clone, Debug, Default)]
pub struct TenantMetrics {
    pub requests: Family<TenantLabel, Counter>,
    pub rejected: Family<RejectLabels, Counter>,
    pub inflight: Family<TenantLabel, Gauge>,
    pub prompt_tokens: Family<TenantLabel, Counter>,
    pub cached_tokens: Family<TenantLabel, Counter>,
    pub hit_requests: Family<TenantLabel, Counter>,
    pub auth_failures: Counter,
    pub reloads: Family<ReloadLabel, Counter>,
    pub configured: Gauge,
}

impl TenantMetrics {
    /// Register every series under `kvfabric_tenant_*`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("kvfabric_tenant");
        r.register(
            "requests",
            "Requests admitted, per tenant",
            self.requests.clone(),
        );
        r.register(
            "rejected_requests",
            "Requests refused by a tenant's rate or concurrency limit",
            self.rejected.clone(),
        );
        r.register(
            "inflight_requests",
            "Requests of a tenant running now",
            self.inflight.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens of finished requests, per tenant",
            self.prompt_tokens.clone(),
        );
        r.register(
            "cached_tokens",
            "Prompt tokens whose KV was reused, per tenant",
            self.cached_tokens.clone(),
        );
        r.register(
            "hit_requests",
            "Finished requests that reused at least one cached block, per tenant",
            self.hit_requests.clone(),
        );
        r.register(
            "auth_failures",
            "Requests refused for a missing, malformed or unknown API key",
            self.auth_failures.clone(),
        );
        r.register(
            "config_reloads",
            "Reloads of a changed tenants file, by result",
            self.reloads.clone(),
        );
        r.register(
            "configured_tenants",
            "Tenants in the loaded tenants file",
            self.configured.clone(),
        );
    }

    pub(crate) fn label(tenant: &str) -> TenantLabel {
        TenantLabel {
            tenant: tenant.to_string(),
        }
    }
}
