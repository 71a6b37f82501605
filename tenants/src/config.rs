//! The tenants file: its TOML shape, its checks, and the compiled view
//! requests are authenticated against.
//!
//! ```toml
//! [[tenants]]
//! name = "acme"                      # [A-Za-z0-9._-], 1..=64
//! api_keys = ["blake3:<64 hex>"]     # `kvfabric tenants hash-key` prints this form
//! namespace = "acme"                 # optional; default: the name
//! rate_limit_per_s = 5.0             # optional; requests per second (token bucket)
//! rate_burst = 10                    # optional; bucket size, default max(1, ceil(rate))
//! max_concurrent = 4                 # optional; requests in flight at once
//! trusted = false                    # gRPC: keys used as sent, not scoped (engines, operators)
//! ram_share = 0.25                   # optional; guaranteed part of the RAM tier
//! disk_share = "100GiB"              # optional; of the disk tier (see `shares`)
//!
//! [[shared]]
//! name = "public"                    # a shared namespace
//! members = ["acme", "beta"]         # these tenants use it instead of their own
//! ram_share = 0.1                    # optional; the shared namespace is one owner
//! ```
//!
//! Everything that would make two tenants share blocks by accident is
//! refused: a repeated name, namespace or key hash, a tenant in two shared
//! namespaces, a member that does not exist. Sharing is only ever what a
//! `[[shared]]` table says.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::keys::KeyHash;
use crate::namespace::{shared_namespace, tenant_namespace};
use crate::shares::{check_fractions, shared_owner, OwnerShares, ShareSpec};
use crate::TenantsError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default)]
    tenants: Vec<TenantSpec>,
    #[serde(default)]
    shared: Vec<SharedSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantSpec {
    name: String,
    #[serde(default)]
    api_keys: Vec<String>,
    namespace: Option<String>,
    rate_limit_per_s: Option<f64>,
    rate_burst: Option<u32>,
    max_concurrent: Option<u32>,
    #[serde(default)]
    trusted: bool,
    ram_share: Option<ShareSpec>,
    disk_share: Option<ShareSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SharedSpec {
    name: String,
    members: Vec<String>,
    ram_share: Option<ShareSpec>,
    disk_share: Option<ShareSpec>,
}

/// Per-tenant request limits (HTTP API).
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Requests per second refilled into the bucket; `None`: unlimited.
    pub rate_per_s: Option<f64>,
    /// Bucket size (requests that may arrive at once after a quiet spell).
    pub burst: f64,
    /// Requests in flight at once; `None`: unlimited.
    pub max_concurrent: Option<u32>,
}

/// One tenant as requests see it.
#[derive(Clone, Debug)]
pub struct Tenant {
    /// The tenant's name (metrics label, logs).
    pub name: Arc<str>,
    /// The namespace its blocks are chained under: its own, or the shared
    /// namespace it is a member of.
    pub namespace: Vec<u8>,
    /// The shared namespace it uses, if any.
    pub shared: Option<String>,
    pub limits: Limits,
    /// gRPC only: keys are used as sent (an engine in remote mode, an
    /// operator's tool), not scoped to the namespace.
    pub trusted: bool,
    /// Who its blocks count to in the tiers' shares: its name, or
    /// `shared:<name>` for a member of a shared namespace.
    pub owner: Arc<str>,
}

/// A loaded tenants file.
#[derive(Debug, Default)]
pub struct Tenants {
    by_key: HashMap<KeyHash, Arc<Tenant>>,
    tenants: Vec<Arc<Tenant>>,
    owners: Vec<OwnerShares>,
}

impl Tenants {
    /// Read and check the file at `path`.
    pub fn load(path: &Path) -> Result<Tenants, TenantsError> {
        let text = std::fs::read_to_string(path).map_err(|source| TenantsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Tenants::parse(&text, path)
    }

    /// Check `text` (the contents of `path`, named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Tenants, TenantsError> {
        let spec: FileSpec = toml::from_str(text).map_err(|e| TenantsError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        compile(spec).map_err(|message| TenantsError::Invalid {
            path: path.to_path_buf(),
            message,
        })
    }

    /// The tenant a key hash belongs to.
    pub fn find(&self, key: &KeyHash) -> Option<&Arc<Tenant>> {
        self.by_key.get(key)
    }

    /// Every tenant, in file order.
    pub fn tenants(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }

    /// Every owner of blocks (tenants outside shared namespaces, then the
    /// shared namespaces) and its tier shares, in file order.
    pub fn owners(&self) -> &[OwnerShares] {
        &self.owners
    }
}

fn check_name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} {name:?} must be 1 to 64 of A-Z a-z 0-9 . _ -"
        ))
    }
}

fn limits(t: &TenantSpec) -> Result<Limits, String> {
    let rate = match t.rate_limit_per_s {
        Some(r) if !(r.is_finite() && r > 0.0) => {
            return Err(format!("tenant {}: rate_limit_per_s must be > 0", t.name))
        }
        r => r,
    };
    let burst = match (t.rate_burst, rate) {
        (Some(0), _) => return Err(format!("tenant {}: rate_burst must be >= 1", t.name)),
        (Some(b), _) => f64::from(b),
        (None, Some(r)) => r.ceil().max(1.0),
        (None, None) => 1.0,
    };
    if t.max_concurrent == Some(0) {
        return Err(format!("tenant {}: max_concurrent must be >= 1", t.name));
    }
    Ok(Limits {
        rate_per_s: rate,
        burst,
        max_concurrent: t.max_concurrent,
    })
}

/// Which shared namespace each tenant belongs to (checked).
fn memberships(spec: &FileSpec) -> Result<HashMap<&str, &str>, String> {
    let names: HashSet<&str> = spec.tenants.iter().map(|t| t.name.as_str()).collect();
    let mut shared_names = HashSet::new();
    let mut member_of = HashMap::new();
    for s in &spec.shared {
        check_name("shared namespace", &s.name)?;
        if !shared_names.insert(s.name.as_str()) {
            return Err(format!("shared namespace {} is listed twice", s.name));
        }
        for m in &s.members {
            if !names.contains(m.as_str()) {
                return Err(format!("shared namespace {}: no tenant named {m}", s.name));
            }
            if let Some(other) = member_of.insert(m.as_str(), s.name.as_str()) {
                return Err(format!(
                    "tenant {m} is a member of two shared namespaces ({other}, {})",
                    s.name
                ));
            }
        }
    }
    Ok(member_of)
}

fn compile(spec: FileSpec) -> Result<Tenants, String> {
    let member_of = memberships(&spec)?;
    let mut out = Tenants::default();
    let (mut seen_names, mut seen_ns) = (HashSet::new(), HashSet::new());
    for t in &spec.tenants {
        check_name("tenant", &t.name)?;
        let own = t.namespace.clone().unwrap_or_else(|| t.name.clone());
        check_name("namespace", &own)?;
        if !seen_names.insert(t.name.as_str()) {
            return Err(format!("tenant {} is listed twice", t.name));
        }
        if !seen_ns.insert(own.clone()) {
            return Err(format!("namespace {own} is used by two tenants"));
        }
        let shared = member_of.get(t.name.as_str()).map(|s| s.to_string());
        let owner = match &shared {
            Some(s) => {
                if t.ram_share.is_some() || t.disk_share.is_some() {
                    return Err(format!("tenant {}: a member of shared namespace {s} has no share of its own (set it on the [[shared]] table)", t.name));
                }
                shared_owner(s)
            }
            None => {
                let what = |tier| format!("tenant {}: {tier}_share", t.name);
                out.owners.push(OwnerShares {
                    owner: t.name.as_str().into(),
                    ram: t
                        .ram_share
                        .as_ref()
                        .map(|s| s.check(&what("ram")))
                        .transpose()?,
                    disk: t
                        .disk_share
                        .as_ref()
                        .map(|s| s.check(&what("disk")))
                        .transpose()?,
                });
                t.name.as_str().into()
            }
        };
        let tenant = Arc::new(Tenant {
            name: t.name.as_str().into(),
            namespace: match &shared {
                Some(s) => shared_namespace(s),
                None => tenant_namespace(&own),
            },
            shared,
            limits: limits(t)?,
            trusted: t.trusted,
            owner,
        });
        for k in &t.api_keys {
            let hash = KeyHash::parse(k).map_err(|e| format!("tenant {}: {e}", t.name))?;
            if out.by_key.insert(hash, tenant.clone()).is_some() {
                return Err(format!("tenant {}: a key hash is listed twice", t.name));
            }
        }
        out.tenants.push(tenant);
    }
    for s in &spec.shared {
        let what = |tier| format!("shared namespace {}: {tier}_share", s.name);
        out.owners.push(OwnerShares {
            owner: shared_owner(&s.name),
            ram: s
                .ram_share
                .as_ref()
                .map(|x| x.check(&what("ram")))
                .transpose()?,
            disk: s
                .disk_share
                .as_ref()
                .map(|x| x.check(&what("disk")))
                .transpose()?,
        });
    }
    check_fractions(&out.owners, "ram")?;
    check_fractions(&out.owners, "disk")?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KeyHash;

    fn parse(text: &str) -> Result<Tenants, TenantsError> {
        Tenants::parse(text, Path::new("t.toml"))
    }

    fn hash(k: &str) -> String {
        KeyHash::of(k).to_string()
    }

    #[test]
    fn tenants_shared_members_and_limits() {
        let text = format!(
            r#"
            [[tenants]]
            name = "a"
            api_keys = ["{}"]
            rate_limit_per_s = 2.5
            max_concurrent = 3
            [[tenants]]
            name = "b"
            namespace = "bee"
            api_keys = ["{}", "{}"]
            [[tenants]]
            name = "c"
            api_keys = ["{}"]
            [[shared]]
            name = "public"
            members = ["a", "c"]
            "#,
            hash("ka"),
            hash("kb1"),
            hash("kb2"),
            hash("kc")
        );
        let t = parse(&text).expect("valid");
        let a = t.find(&KeyHash::of("ka")).expect("a");
        assert_eq!(&*a.name, "a");
        assert_eq!(a.namespace, b"shared:public");
        assert_eq!(a.limits.rate_per_s, Some(2.5));
        assert_eq!(a.limits.burst, 3.0);
        assert_eq!(a.limits.max_concurrent, Some(3));
        let b = t.find(&KeyHash::of("kb2")).expect("b");
        assert_eq!(b.namespace, b"tenant:bee");
        assert_eq!(
            t.find(&KeyHash::of("kc")).expect("c").namespace,
            a.namespace
        );
        assert!(t.find(&KeyHash::of("nobody")).is_none());
        assert_eq!(t.tenants().len(), 3);
        assert_eq!(&*a.owner, "shared:public");
        assert_eq!(&*b.owner, "b");
    }

    #[test]
    fn owners_and_their_shares() {
        let text = r#"
            [[tenants]]
            name = "a"
            ram_share = 0.25
            disk_share = "1GiB"
            [[tenants]]
            name = "b"
            [[tenants]]
            name = "c"
            [[shared]]
            name = "public"
            members = ["c"]
            ram_share = 4096
            "#;
        let t = parse(text).expect("valid");
        let owners: Vec<_> = t
            .owners()
            .iter()
            .map(|o| (&*o.owner, o.ram, o.disk))
            .collect();
        use crate::Share::{Bytes, Fraction};
        assert_eq!(
            owners,
            vec![
                ("a", Some(Fraction(0.25)), Some(Bytes(1 << 30))),
                ("b", None, None),
                ("shared:public", Some(Bytes(4096)), None),
            ]
        );
    }

    #[test]
    fn anything_that_would_share_by_accident_is_refused() {
        let k = hash("k");
        let cases = [
            "[[tenants]]\nname=\"a\"\n[[tenants]]\nname=\"a\"".to_string(),
            "[[tenants]]\nname=\"a\"\n[[tenants]]\nname=\"b\"\nnamespace=\"a\"".to_string(),
            format!("[[tenants]]\nname=\"a\"\napi_keys=[\"{k}\"]\n[[tenants]]\nname=\"b\"\napi_keys=[\"{k}\"]"),
            "[[tenants]]\nname=\"a\"\n[[shared]]\nname=\"p\"\nmembers=[\"z\"]".to_string(),
            "[[tenants]]\nname=\"a\"\n[[shared]]\nname=\"p\"\nmembers=[\"a\"]\n[[shared]]\nname=\"q\"\nmembers=[\"a\"]".to_string(),
            "[[tenants]]\nname=\"a b\"".to_string(),
            "[[tenants]]\nname=\"a\"\napi_keys=[\"plaintext-key\"]".to_string(),
            "[[tenants]]\nname=\"a\"\nrate_limit_per_s=0".to_string(),
            "[[tenants]]\nname=\"a\"\nmax_concurrent=0".to_string(),
            "[[tenants]]\nname=\"a\"\nunknown=1".to_string(),
            "[[tenants]]\nname=\"a\"\nram_share=1.5".to_string(),
            "[[tenants]]\nname=\"a\"\nram_share=0.6\n[[tenants]]\nname=\"b\"\nram_share=0.6".to_string(),
            "[[tenants]]\nname=\"a\"\ndisk_share=0.5\n[[shared]]\nname=\"p\"\nmembers=[\"a\"]".to_string(),
        ];
        for c in cases {
            assert!(parse(&c).is_err(), "accepted:\n{c}");
        }
    }
}
