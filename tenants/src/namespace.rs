//! The namespace bytes a request's block keys are chained under.
//!
//! `KeyChain::new(namespace, ..)` puts these bytes (length-prefixed) in front
//! of every block key, so two requests with different namespaces never share
//! a block, in an engine's prefix cache or anywhere in the fabric. The forms
//! are disjoint by construction:
//!
//! - single-tenant mode (no tenants file): empty, as before tenants existed;
//! - a tenant: `tenant:<namespace>` (the tenant's `namespace`, default its name);
//! - a shared namespace: `shared:<name>` (used by its members instead of their own);
//! - any of these with a `cache_salt`: `<base> NUL salt:<salt>`. Names never
//!   contain NUL (checked when the file loads), so a salt cannot fake a base.
//!
//! gRPC clients compute their own keys, so the node cannot know which
//! namespace a key was chained under: for a tenant that is not trusted it
//! re-keys every key the client sends with [`scope_key`] (keyed by the
//! tenant's namespace), which no other tenant can produce.

/// Namespace of a tenant whose `namespace` is `ns`.
pub fn tenant_namespace(ns: &str) -> Vec<u8> {
    [b"tenant:".as_slice(), ns.as_bytes()].concat()
}

/// Namespace of the shared namespace `name`.
pub fn shared_namespace(name: &str) -> Vec<u8> {
    [b"shared:".as_slice(), name.as_bytes()].concat()
}

/// `base` refined by a request's `cache_salt` (none or empty: `base` itself).
pub fn salted(base: &[u8], cache_salt: Option<&str>) -> Vec<u8> {
    match cache_salt {
        Some(salt) if !salt.is_empty() => [base, b"\0salt:".as_slice(), salt.as_bytes()].concat(),
        _ => base.to_vec(),
    }
}

/// The key a gRPC client's `key` is stored under for a tenant whose
/// namespace is `namespace`: a blake3 keyed by the namespace, so tenant B
/// cannot name (read, overwrite, remove or pin) a key of tenant A's.
pub fn scope_key(namespace: &[u8], key: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key("kvfabric 2026-11 cache-service tenant key scope");
    h.update(&(namespace.len() as u32).to_le_bytes());
    h.update(namespace);
    h.update(key);
    *h.finalize().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_are_disjoint() {
        assert_ne!(tenant_namespace("a"), shared_namespace("a"));
        let base = tenant_namespace("a");
        assert_eq!(salted(&base, None), base);
        assert_eq!(salted(&base, Some("")), base);
        assert_ne!(salted(&base, Some("x")), base);
        assert_ne!(salted(&base, Some("x")), salted(&base, Some("y")));
        // Single-tenant mode: a salt still splits.
        assert_ne!(salted(b"", Some("x")), Vec::<u8>::new());
    }

    #[test]
    fn scoped_keys_differ_per_namespace() {
        let k = [7u8; 32];
        let a = scope_key(&tenant_namespace("a"), &k);
        assert_eq!(a, scope_key(&tenant_namespace("a"), &k));
        assert_ne!(a, scope_key(&tenant_namespace("b"), &k));
        assert_ne!(a, k);
    }
}
