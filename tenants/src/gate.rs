//! [`TenantGate`]: who is asking (API key -> tenant), may they start a
//! request now (limits), and which namespace their blocks live in.
//!
//! Built from a tenants file ([`TenantGate::open`]) or in single-tenant mode
//! ([`TenantGate::single_tenant`]: every request is the anonymous tenant in
//! the empty namespace, as before tenants existed). The file is re-read every
//! `reload_interval` by [`TenantGate::spawn_reloader`] and swapped in when
//! its content changed and it is valid; an invalid file is logged and
//! counted, and the previous one stays in force (a typo must not lock every
//! tenant out). A key removed from the file is therefore refused from the
//! first reload after the file is written.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use crate::config::{Tenant, Tenants};
use crate::keys::{bearer_key, KeyHash};
use crate::limits::{InflightGuard, LimitState, Over};
use crate::metrics::{RejectLabels, ReloadLabel, TenantMetrics};
use crate::namespace::salted;
use crate::TenantsError;

/// Tenant label of single-tenant mode.
const DEFAULT_TENANT: &str = "default";

/// Who a request is.
#[derive(Clone, Debug)]
pub struct Identity {
    tenant: Option<Arc<Tenant>>,
}

impl Identity {
    /// A node of the cluster calling another (its mutual-TLS certificate,
    /// checked by the caller, names a node): keys used as sent, every
    /// namespace, no owner, as in single-tenant mode.
    pub fn cluster_node() -> Identity {
        Identity { tenant: None }
    }

    /// The tenant, `None` in single-tenant mode.
    pub fn tenant(&self) -> Option<&Tenant> {
        self.tenant.as_deref()
    }

    /// The tenant's name, `default` in single-tenant mode.
    pub fn label(&self) -> &str {
        self.tenant.as_ref().map_or(DEFAULT_TENANT, |t| &t.name)
    }

    /// The namespace this request's blocks are keyed under.
    pub fn namespace(&self, cache_salt: Option<&str>) -> Vec<u8> {
        let base = self.tenant.as_ref().map_or(&[][..], |t| &t.namespace[..]);
        salted(base, cache_salt)
    }

    /// Who this caller's blocks count to in the tiers' shares (see
    /// [`crate::shares`]); `None` in single-tenant mode.
    pub fn owner(&self) -> Option<&Arc<str>> {
        self.tenant.as_ref().map(|t| &t.owner)
    }

    /// gRPC: the key scope of this caller; `None` = keys used as sent
    /// (single-tenant mode, or a trusted tenant).
    pub fn key_scope(&self) -> Option<&[u8]> {
        self.tenant
            .as_ref()
            .filter(|t| !t.trusted)
            .map(|t| &t.namespace[..])
    }
}

/// Why a request is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No key, a malformed `Authorization` value, or a key no tenant has.
    Unauthenticated { reason: &'static str },
    /// Over the tenant's rate or concurrency limit.
    Limited { tenant: String, over: Over },
}

impl Denied {
    /// Human-readable reason (the error body's `message`).
    pub fn message(&self) -> String {
        match self {
            Denied::Unauthenticated { reason } => reason.to_string(),
            Denied::Limited {
                tenant,
                over: Over::Rate { .. },
            } => format!("Rate limit reached for tenant {tenant}; retry later"),
            Denied::Limited {
                tenant,
                over: Over::Concurrency { limit },
            } => format!(
                "Tenant {tenant} already has {limit} requests in flight (max_concurrent); retry later"
            ),
        }
    }

    /// The HTTP status of the refusal: 401 or 429.
    pub fn http_status(&self) -> u16 {
        match self {
            Denied::Unauthenticated { .. } => 401,
            Denied::Limited { .. } => 429,
        }
    }

    /// The OpenAI error body's `type` and `code`.
    pub fn openai_type_and_code(&self) -> (&'static str, &'static str) {
        match self {
            Denied::Unauthenticated { .. } => ("invalid_request_error", "invalid_api_key"),
            Denied::Limited {
                over: Over::Rate { .. },
                ..
            } => ("requests", "rate_limit_exceeded"),
            Denied::Limited { .. } => ("requests", "concurrency_limit_exceeded"),
        }
    }

    /// Whole seconds a client should wait (the `Retry-After` header), at least 1.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Denied::Unauthenticated { .. } => None,
            Denied::Limited {
                over: Over::Rate { retry_after },
                ..
            } => Some(retry_after.as_secs_f64().ceil().max(1.0) as u64),
            Denied::Limited {
                over: Over::Concurrency { .. },
                ..
            } => Some(1),
        }
    }
}

/// A request allowed to run; drop it when the response is finished.
#[derive(Debug)]
pub struct Admission {
    _inflight: InflightGuard,
}

struct Inner {
    /// `None`: single-tenant mode.
    path: Option<PathBuf>,
    current: RwLock<Arc<Tenants>>,
    /// blake3 of the file content in force.
    loaded: Mutex<[u8; 32]>,
    limits: Mutex<HashMap<Arc<str>, Arc<LimitState>>>,
    metrics: TenantMetrics,
    anonymous_limits: Arc<LimitState>,
    /// Called with the tenants in force now and after each reload.
    watchers: Mutex<Vec<Watcher>>,
}

/// A function told of the tenants in force (see [`TenantGate::watch`]).
type Watcher = Box<dyn Fn(&Tenants) + Send + Sync>;

/// Authentication, limits and namespaces of one listener; cheap to clone.
#[derive(Clone)]
pub struct TenantGate {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for TenantGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantGate")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

impl TenantGate {
    /// Single-tenant mode: no keys, the empty namespace, no limits.
    pub fn single_tenant(metrics: TenantMetrics) -> TenantGate {
        TenantGate::build(None, Tenants::default(), [0; 32], metrics)
    }

    /// Load the tenants file at `path` (an invalid file is an error here:
    /// a node must not start with tenants it cannot read).
    pub fn open(path: &Path, metrics: TenantMetrics) -> Result<TenantGate, TenantsError> {
        let (text, digest) = read(path)?;
        let tenants = Tenants::parse(&text, path)?;
        Ok(TenantGate::build(
            Some(path.to_path_buf()),
            tenants,
            digest,
            metrics,
        ))
    }

    /// [`open`](Self::open) the file if one is configured, else single-tenant
    /// mode, logged as a warning (`what` names the listener).
    pub fn from_config(
        path: Option<&Path>,
        metrics: TenantMetrics,
        what: &str,
    ) -> Result<TenantGate, TenantsError> {
        match path {
            Some(p) => {
                let gate = TenantGate::open(p, metrics)?;
                let n = gate.inner.current.read().map_or(0, |t| t.tenants().len());
                tracing::info!(listener = what, tenants = n, file = %p.display(), "API keys required (tenants file)");
                Ok(gate)
            }
            None => {
                tracing::warn!(
                    listener = what,
                    "no tenants file configured: single-tenant mode, no API keys checked, every request shares the empty namespace"
                );
                Ok(TenantGate::single_tenant(metrics))
            }
        }
    }

    fn build(
        path: Option<PathBuf>,
        tenants: Tenants,
        digest: [u8; 32],
        metrics: TenantMetrics,
    ) -> TenantGate {
        metrics.configured.set(tenants.tenants().len() as i64);
        TenantGate {
            inner: Arc::new(Inner {
                path,
                current: RwLock::new(Arc::new(tenants)),
                loaded: Mutex::new(digest),
                limits: Mutex::new(HashMap::new()),
                metrics,
                anonymous_limits: Arc::new(LimitState::new()),
                watchers: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Whether API keys are checked (a tenants file is configured).
    pub fn enabled(&self) -> bool {
        self.inner.path.is_some()
    }

    /// The metrics handles (register them once into the listener's registry).
    pub fn metrics(&self) -> &TenantMetrics {
        &self.inner.metrics
    }

    /// Who sent `authorization` (the `Authorization` header or gRPC
    /// `authorization` metadata value, `None` when absent).
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Identity, Denied> {
        if !self.enabled() {
            return Ok(Identity { tenant: None });
        }
        let found = match authorization.map(bearer_key) {
            None => Err("Missing API key: send `Authorization: Bearer <key>`"),
            Some(None) => Err("Malformed Authorization header: expected `Bearer <key>`"),
            Some(Some(key)) => {
                let tenants = self.tenants();
                match tenants.find(&KeyHash::of(key)) {
                    Some(t) => Ok(t.clone()),
                    None => Err("Incorrect API key provided"),
                }
            }
        };
        found
            .map(|t| Identity { tenant: Some(t) })
            .map_err(|reason| {
                self.inner.metrics.auth_failures.inc();
                Denied::Unauthenticated { reason }
            })
    }

    /// The identity of the tenant named `name` in the file in force (work
    /// stored under a tenant's name, such as a batch job, resumes as that
    /// tenant after a restart); in single-tenant mode the anonymous identity
    /// for its label. None: no such tenant (any more).
    pub fn identity_of(&self, name: &str) -> Option<Identity> {
        if !self.enabled() {
            return (name == DEFAULT_TENANT).then_some(Identity { tenant: None });
        }
        let tenants = self.tenants();
        let found = tenants.tenants().iter().find(|t| &*t.name == name)?;
        Some(Identity {
            tenant: Some(found.clone()),
        })
    }

    /// Start a request of `who` if its limits allow.
    pub fn admit(&self, who: &Identity) -> Result<Admission, Denied> {
        let label = TenantMetrics::label(who.label());
        let m = &self.inner.metrics;
        let gauge = m.inflight.get_or_create(&label).clone();
        let admitted = match &who.tenant {
            None => self.inner.anonymous_limits.admit(
                &crate::config::Limits {
                    rate_per_s: None,
                    burst: 1.0,
                    max_concurrent: None,
                },
                Instant::now(),
                gauge,
            ),
            Some(t) => self
                .limit_state(&t.name)
                .admit(&t.limits, Instant::now(), gauge),
        };
        match admitted {
            Ok(guard) => {
                m.requests.get_or_create(&label).inc();
                Ok(Admission { _inflight: guard })
            }
            Err(over) => {
                let reason = match over {
                    Over::Rate { .. } => "rate_limit",
                    Over::Concurrency { .. } => "concurrency",
                };
                m.rejected
                    .get_or_create(&RejectLabels {
                        tenant: label.tenant,
                        reason: reason.into(),
                    })
                    .inc();
                Err(Denied::Limited {
                    tenant: who.label().to_string(),
                    over,
                })
            }
        }
    }

    /// Count a finished request's prompt and reused tokens.
    pub fn record_usage(&self, who: &Identity, prompt_tokens: u64, cached_tokens: u64) {
        let label = TenantMetrics::label(who.label());
        let m = &self.inner.metrics;
        m.prompt_tokens.get_or_create(&label).inc_by(prompt_tokens);
        m.cached_tokens.get_or_create(&label).inc_by(cached_tokens);
        if cached_tokens > 0 {
            m.hit_requests.get_or_create(&label).inc();
        }
    }

    fn tenants(&self) -> Arc<Tenants> {
        match self.inner.current.read() {
            Ok(t) => t.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn limit_state(&self, name: &Arc<str>) -> Arc<LimitState> {
        let mut map = self.inner.limits.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(name.clone())
            .or_insert_with(|| Arc::new(LimitState::new()))
            .clone()
    }

    /// Call `f` with the tenants in force now and again after every reload
    /// that swaps a new file in (the store sets its tier shares this way).
    pub fn watch(&self, f: impl Fn(&Tenants) + Send + Sync + 'static) {
        f(&self.tenants());
        let mut w = self
            .inner
            .watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        w.push(Box::new(f));
    }

    /// Re-read the file now: `Ok(true)` when a changed, valid file was
    /// swapped in, `Ok(false)` when unchanged (or single-tenant mode). On an
    /// error the tenants in force stay.
    pub fn reload(&self) -> Result<bool, TenantsError> {
        let Some(path) = &self.inner.path else {
            return Ok(false);
        };
        let result = read(path).and_then(|(text, digest)| {
            let mut loaded = self.inner.loaded.lock().unwrap_or_else(|p| p.into_inner());
            if *loaded == digest {
                return Ok(false);
            }
            let tenants = Arc::new(Tenants::parse(&text, path)?);
            let n = tenants.tenants().len();
            match self.inner.current.write() {
                Ok(mut cur) => *cur = tenants.clone(),
                Err(p) => *p.into_inner() = tenants.clone(),
            }
            let watchers = self
                .inner
                .watchers
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for w in watchers.iter() {
                w(&tenants);
            }
            *loaded = digest;
            self.inner.metrics.configured.set(n as i64);
            tracing::info!(file = %path.display(), tenants = n, "tenants file reloaded");
            Ok(true)
        });
        let label = if result.is_ok() { "ok" } else { "error" };
        if !matches!(result, Ok(false)) {
            self.inner
                .metrics
                .reloads
                .get_or_create(&ReloadLabel {
                    result: label.into(),
                })
                .inc();
        }
        if let Err(e) = &result {
            tracing::error!(error = %e, "tenants file not reloaded; the previous tenants stay in force");
        }
        result
    }

    /// Re-read the file every `interval` on the current tokio runtime until
    /// the last clone of this gate is dropped (nothing to do in
    /// single-tenant mode).
    pub fn spawn_reloader(&self, interval: Duration) {
        if !self.enabled() {
            return;
        }
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval.max(Duration::from_millis(10)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let gate = TenantGate { inner };
                let _ = tokio::task::spawn_blocking(move || gate.reload()).await;
            }
        });
    }
}

fn read(path: &Path) -> Result<(String, [u8; 32]), TenantsError> {
    let text = std::fs::read_to_string(path).map_err(|source| TenantsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let digest = *blake3::hash(text.as_bytes()).as_bytes();
    Ok((text, digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(keys: &[&str]) -> String {
        let mut s = String::from("[[tenants]]\nname = \"a\"\nmax_concurrent = 1\napi_keys = [");
        for k in keys {
            s.push_str(&format!("\"{}\",", KeyHash::of(k)));
        }
        s.push_str("]\n");
        s
    }

    #[test]
    fn a_revoked_key_is_refused_after_one_reload_and_a_bad_file_keeps_the_old() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("tenants.toml");
        std::fs::write(&path, file(&["k1", "k2"])).expect("write");
        let gate = TenantGate::open(&path, TenantMetrics::default()).expect("open");
        assert!(gate.enabled());
        let who = gate.authenticate(Some("Bearer k1")).expect("k1 valid");
        assert_eq!(who.label(), "a");
        assert_eq!(who.namespace(None), b"tenant:a");
        let told = Arc::new(Mutex::new(Vec::new()));
        let t2 = told.clone();
        gate.watch(move |t| t2.lock().expect("lock").push(t.tenants().len()));
        assert!(!gate.reload().expect("unchanged"));

        std::fs::write(&path, file(&["k2"])).expect("write");
        assert!(gate.reload().expect("changed"));
        assert!(matches!(
            gate.authenticate(Some("Bearer k1")),
            Err(Denied::Unauthenticated { .. })
        ));
        assert!(gate.authenticate(Some("Bearer k2")).is_ok());
        assert_eq!(who.owner().map(|o| &**o), Some("a"));
        assert_eq!(
            *told.lock().expect("lock"),
            vec![1, 1],
            "now and once per reload"
        );

        std::fs::write(&path, "[[tenants]\n").expect("write");
        assert!(gate.reload().is_err());
        assert!(
            gate.authenticate(Some("Bearer k2")).is_ok(),
            "old tenants stay"
        );
        assert_eq!(gate.metrics().auth_failures.get(), 1);
    }

    #[test]
    fn missing_malformed_and_unknown_keys_are_unauthenticated() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("tenants.toml");
        std::fs::write(&path, file(&["k1"])).expect("write");
        let gate = TenantGate::open(&path, TenantMetrics::default()).expect("open");
        for h in [None, Some("k1"), Some("Basic k1"), Some("Bearer k2")] {
            let d = gate.authenticate(h).expect_err("refused");
            assert!(matches!(d, Denied::Unauthenticated { .. }), "{h:?}");
            assert_eq!(d.retry_after_secs(), None);
        }
        let who = gate.authenticate(Some("Bearer k1")).expect("ok");
        let held = gate.admit(&who).expect("first");
        let d = gate.admit(&who).expect_err("max_concurrent = 1");
        assert_eq!(d.retry_after_secs(), Some(1));
        drop(held);
        assert!(gate.admit(&who).is_ok());
    }

    #[test]
    fn single_tenant_mode_admits_everyone_in_the_empty_namespace() {
        let gate = TenantGate::single_tenant(TenantMetrics::default());
        let who = gate.authenticate(None).expect("no key needed");
        assert_eq!(who.namespace(None), Vec::<u8>::new());
        assert_eq!(who.key_scope(), None);
        assert_eq!(who.label(), "default");
        let _a = gate.admit(&who).expect("no limits");
        let _b = gate.admit(&who).expect("no limits");
    }
}
