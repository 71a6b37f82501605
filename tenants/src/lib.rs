//! kvfabric tenants: who may use a listener and which blocks are theirs.
//!
//! Shared by the engine's OpenAI API, the router and the node's gRPC
//! CacheService, so all three read the same tenants file the same way:
//!
//! - [`config`]: the TOML file (tenants, hashed API keys, shared namespaces,
//!   limits) and the checks that keep tenants from sharing by accident;
//! - [`keys`]: the stored form of a key (`blake3:<hex>`), new keys, `Bearer`;
//! - [`namespace`]: the namespace bytes block keys are chained under, and
//!   the gRPC key scope;
//! - [`limits`]: per-tenant rate (token bucket) and concurrency limits;
//! - [`shares`]: per-tenant shares of the node's RAM and disk tiers;
//! - [`metrics`]: per-tenant Prometheus series;
//! - [`gate`]: [`TenantGate`], the handle a listener asks, which reloads the
//!   file without a restart;
//! - [`http`] (feature `axum`): the gate as axum middleware, shared by the
//!   engine's and the router's APIs.
//!
//! The threat model and setup are in docs/SECURITY.md.

pub mod config;
mod error;
pub mod gate;
#[cfg(feature = "axum")]
pub mod http;
pub mod keys;
pub mod limits;
pub mod metrics;
pub mod namespace;
pub mod shares;

pub use config::{Limits, Tenant, Tenants};
pub use error::TenantsError;
pub use gate::{Admission, Denied, Identity, TenantGate};
pub use keys::{bearer_key, new_key, KeyHash};
pub use metrics::TenantMetrics;
pub use shares::{OwnerShares, Share};
