//! Per-tenant shares of the node's RAM and disk tiers: how many bytes of a
//! tier each owner of blocks is guaranteed, so one tenant filling the cache
//! cannot evict another's blocks below that.
//!
//! An owner is a tenant that is not in a shared namespace (named by the
//! tenant's name), or a shared namespace (named `shared:<name>`: its members'
//! blocks are all under it, so it counts as one owner). In the tenants file a
//! share is `ram_share` / `disk_share` on a `[[tenants]]` or `[[shared]]`
//! table: a float in (0, 1] is a fraction of the tier, an integer or a
//! string (`"4GiB"`) is bytes. Owners without one split what the explicit
//! shares leave equally. The store (`kvfabric-store`, `shares`) keeps the
//! bytes each owner uses and evicts from owners over their share first.

use std::sync::Arc;

use bytesize::ByteSize;
use serde::Deserialize;

/// A guaranteed part of a tier.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Share {
    /// A fraction of the tier's capacity, in (0, 1].
    Fraction(f64),
    /// A number of bytes.
    Bytes(u64),
}

impl Share {
    /// The share in bytes of a tier of `capacity` bytes (at most `capacity`).
    pub fn bytes(self, capacity: u64) -> u64 {
        match self {
            Share::Fraction(f) => ((capacity as f64) * f) as u64,
            Share::Bytes(b) => b,
        }
        .min(capacity)
    }
}

/// A share as the file writes it (see the module doc).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum ShareSpec {
    Bytes(u64),
    Fraction(f64),
    Sized(ByteSize),
}

impl ShareSpec {
    /// The checked share (`what` names it in errors).
    pub(crate) fn check(&self, what: &str) -> Result<Share, String> {
        match *self {
            ShareSpec::Fraction(f) if f > 0.0 && f <= 1.0 => Ok(Share::Fraction(f)),
            ShareSpec::Fraction(f) => Err(format!(
                "{what}: a fraction must be in (0, 1], got {f} (bytes: an integer or \"4GiB\")"
            )),
            ShareSpec::Bytes(b) => Ok(Share::Bytes(b)),
            ShareSpec::Sized(b) => Ok(Share::Bytes(b.as_u64())),
        }
    }
}

/// One owner of blocks and its configured shares.
#[derive(Clone, Debug, PartialEq)]
pub struct OwnerShares {
    /// The tenant's name, or `shared:<name>` (the metric label too).
    pub owner: Arc<str>,
    pub ram: Option<Share>,
    pub disk: Option<Share>,
}

/// Owner name of the shared namespace `name`.
pub fn shared_owner(name: &str) -> Arc<str> {
    format!("shared:{name}").into()
}

/// The guaranteed bytes of each of `owners` in a tier of `capacity` bytes
/// (`pick` chooses the tier's share): explicit shares as given, the rest of
/// the tier split equally among the owners without one.
pub fn resolve(
    owners: &[OwnerShares],
    capacity: u64,
    pick: impl Fn(&OwnerShares) -> Option<Share>,
) -> Vec<u64> {
    let explicit: u64 = owners
        .iter()
        .filter_map(|o| pick(o).map(|s| s.bytes(capacity)))
        .sum();
    let rest = capacity.saturating_sub(explicit);
    let defaults = owners.iter().filter(|o| pick(o).is_none()).count() as u64;
    owners
        .iter()
        .map(|o| match pick(o) {
            Some(s) => s.bytes(capacity),
            None => rest / defaults.max(1),
        })
        .collect()
}

/// Explicit fractions of one tier must not add up to more than the tier.
pub(crate) fn check_fractions(owners: &[OwnerShares], tier: &str) -> Result<(), String> {
    let pick = |o: &OwnerShares| if tier == "ram" { o.ram } else { o.disk };
    let sum: f64 = owners
        .iter()
        .filter_map(|o| match pick(o) {
            Some(Share::Fraction(f)) => Some(f),
            _ => None,
        })
        .sum();
    if sum > 1.0 + 1e-9 {
        return Err(format!(
            "{tier}_share fractions add up to {sum:.3}, more than the whole tier"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(name: &str, ram: Option<Share>) -> OwnerShares {
        OwnerShares {
            owner: name.into(),
            ram,
            disk: None,
        }
    }

    #[test]
    fn explicit_shares_first_the_rest_split_equally() {
        let owners = [
            owner("a", Some(Share::Fraction(0.5))),
            owner("b", None),
            owner("c", None),
            owner("d", Some(Share::Bytes(100))),
        ];
        assert_eq!(resolve(&owners, 1000, |o| o.ram), vec![500, 200, 200, 100]);
        assert_eq!(resolve(&owners, 1000, |o| o.disk), vec![250; 4]);
        // Bytes larger than the tier are the tier.
        assert_eq!(Share::Bytes(5000).bytes(1000), 1000);
    }

    #[test]
    fn spec_forms() {
        let f: ShareSpec = toml::from_str::<toml::Value>("x = 0.25").map_or_else(
            |e| panic!("{e}"),
            |v| v["x"].clone().try_into().expect("fraction"),
        );
        assert_eq!(f.check("x"), Ok(Share::Fraction(0.25)));
        let b: ShareSpec = toml::Value::Integer(4096).try_into().expect("bytes");
        assert_eq!(b.check("x"), Ok(Share::Bytes(4096)));
        let s: ShareSpec = toml::Value::String("2KiB".into())
            .try_into()
            .expect("sized");
        assert_eq!(s.check("x"), Ok(Share::Bytes(2048)));
        let bad: ShareSpec = toml::Value::Float(1.5).try_into().expect("float");
        assert!(bad.check("x").is_err());
    }
}
