//! API keys and their stored form.
//!
//! The tenants file never holds a key, only `blake3:<hex>` of it, so a leaked
//! or world-readable file gives no credential away. Keys are random
//! ([`new_key`]: 32 bytes from the OS generator, hex), so an unsalted fast
//! hash is enough: there is no dictionary to try. A presented key is hashed
//! once and looked up by its hash; nothing compares secrets byte by byte.

use crate::TenantsError;

/// Prefix of a stored key hash.
const HASH_PREFIX: &str = "blake3:";
/// Prefix of keys made by [`new_key`] (recognizable in logs and scanners).
const KEY_PREFIX: &str = "kvf-";

/// The 32-byte hash a key is stored and looked up by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyHash(pub [u8; 32]);

impl KeyHash {
    /// Hash a presented key.
    pub fn of(key: &str) -> KeyHash {
        KeyHash(*blake3::hash(key.as_bytes()).as_bytes())
    }

    /// Parse the stored form `blake3:<64 hex digits>`.
    pub fn parse(s: &str) -> Result<KeyHash, TenantsError> {
        let bad = || TenantsError::KeyHash {
            found: s.chars().take(80).collect(),
        };
        let hex = s.trim().strip_prefix(HASH_PREFIX).ok_or_else(bad)?;
        let hash = blake3::Hash::from_hex(hex).map_err(|_| bad())?;
        Ok(KeyHash(*hash.as_bytes()))
    }
}

impl std::fmt::Display for KeyHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{HASH_PREFIX}{}",
            blake3::Hash::from_bytes(self.0).to_hex()
        )
    }
}

/// A fresh random API key: `kvf-` and 64 hex digits (256 bits).
pub fn new_key() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("{KEY_PREFIX}{}", blake3::Hash::from_bytes(bytes).to_hex())
}

/// The key carried by an `Authorization` value: `Bearer <key>` (the scheme
/// is case-insensitive). `None` for any other form or an empty key.
pub fn bearer_key(authorization: &str) -> Option<&str> {
    let (scheme, key) = authorization.trim().split_once(' ')?;
    let key = key.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !key.is_empty()).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_form_round_trips_and_rejects_garbage() {
        let key = new_key();
        assert!(key.starts_with("kvf-") && key.len() == 68, "{key}");
        let h = KeyHash::of(&key);
        let stored = h.to_string();
        assert_eq!(KeyHash::parse(&stored).expect("parses"), h);
        assert_ne!(KeyHash::of("other"), h);
        for bad in [
            "",
            "blake3:",
            "sha256:00",
            "blake3:zz",
            &stored[..stored.len() - 1],
        ] {
            assert!(KeyHash::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn bearer_values() {
        assert_eq!(bearer_key("Bearer abc"), Some("abc"));
        assert_eq!(bearer_key("bearer   abc "), Some("abc"));
        assert_eq!(bearer_key("Basic abc"), None);
        assert_eq!(bearer_key("Bearer "), None);
        assert_eq!(bearer_key("abc"), None);
    }
}
