//! Cluster certificates (`kvfabric certs init`): a CA and one certificate
//! and key per principal (rcgen, ECDSA P-256), for operators, tests and
//! benches.
//!
//! Layout of DIR: `ca.crt`, `ca.key`, and `<name>.crt`, `<name>.key` per
//! principal; keys are written 0600 and nothing that exists is overwritten.
//! Every certificate names its principal as the URI SAN
//! `kvfabric://<role>/<name>` (the CN repeats the name for people):
//! - a node's (`kvfabric://node/<id>`) also names the DNS names
//!   [`node_dns_name`] (its own, which a peer meaning to reach it verifies),
//!   [`SERVER_NAME`] (what a tool given an address verifies) and
//!   `localhost`, and may serve and connect (server and client auth);
//! - a tool's or a tenant's names no DNS name and may only connect.
//!
//! The CA is valid for [`CA_DAYS`]; the others for the days asked (the
//! command's default is 90), from the start of the day before. `ca.crl` is
//! the CA's revocation list (empty at first; [`revoke`] adds to it).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

use super::{node_dns_name, Principal, Role, SERVER_NAME};
use crate::error::BadInput;
use crate::TransferError;

/// Days the cluster CA stays valid (10 years: re-keying a CA is re-keying
/// the cluster; keep `ca.key` offline).
pub const CA_DAYS: u32 = 3653;

fn bad(e: impl std::fmt::Display) -> TransferError {
    TransferError::InvalidArgument(BadInput::Credentials {
        what: "certs".into(),
        reason: e.to_string(),
    })
}

fn validity(p: &mut CertificateParams, days: u32) {
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    let start = now.checked_sub(day).unwrap_or(now);
    p.not_before = start.into();
    p.not_after = (start + day * (days + 1)).into();
}

/// Make the CA and `principals`' certificates (each valid for `days`) in `dir`.
pub fn init(dir: &Path, principals: &[Principal], days: u32) -> Result<Vec<String>, TransferError> {
    let valid_name = |n: &str| {
        !n.is_empty() && n.len() <= 128 && n.bytes().all(|b| b.is_ascii_graphic() && b != b'/')
    };
    if principals.is_empty() || principals.iter().any(|p| !valid_name(&p.name)) {
        return Err(bad(
            "names must be 1-128 printable characters, without '/' or spaces",
        ));
    }
    if !(1..=CA_DAYS).contains(&days) {
        return Err(bad(format!("validity must be 1..={CA_DAYS} days")));
    }
    std::fs::create_dir_all(dir).map_err(|e| bad(format!("create {}: {e}", dir.display())))?;
    let mut names = vec![
        "ca.crt".to_string(),
        "ca.key".to_string(),
        "ca.crl".to_string(),
    ];
    for p in principals {
        names.push(format!("{}.crt", p.name));
        names.push(format!("{}.key", p.name));
    }
    if let Some(dup) = (1..names.len()).find(|&i| names[..i].contains(&names[i])) {
        return Err(bad(format!("{} is asked for twice", names[dup])));
    }
    if let Some(existing) = names.iter().find(|n| dir.join(n).exists()) {
        return Err(bad(format!(
            "{} exists; refusing to overwrite",
            dir.join(existing).display()
        )));
    }

    let ca_key = KeyPair::generate().map_err(bad)?;
    let ca_cert = ca_params()?.self_signed(&ca_key).map_err(bad)?;
    write(&dir.join("ca.crt"), ca_cert.pem().as_bytes(), 0o644)?;
    write(
        &dir.join("ca.key"),
        ca_key.serialize_pem().as_bytes(),
        0o600,
    )?;
    for p in principals {
        sign_leaf(dir, p, days, &ca_cert, &ca_key)?;
    }
    // An empty revocation list, so nodes can name it from the start.
    revoke(dir, &[])?;
    Ok(names)
}

/// The cluster CA's parameters (what `init` signs it with, and what a CRL
/// names as its issuer).
fn ca_params() -> Result<CertificateParams, TransferError> {
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(bad)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "kvfabric cluster CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut ca, CA_DAYS);
    Ok(ca)
}

/// Make `p`'s key and certificate in `dir`, signed by the CA; an existing
/// pair is replaced (each file written aside, then renamed over it).
fn sign_leaf(
    dir: &Path,
    p: &Principal,
    days: u32,
    ca: &rcgen::Certificate,
    ca_key: &KeyPair,
) -> Result<(), TransferError> {
    let key = KeyPair::generate().map_err(bad)?;
    let cert = leaf(p, days)?.signed_by(&key, ca, ca_key).map_err(bad)?;
    for (ext, bytes, mode) in [
        ("key", key.serialize_pem().into_bytes(), 0o600),
        ("crt", cert.pem().into_bytes(), 0o644),
    ] {
        let path = dir.join(format!("{}.{ext}", p.name));
        let tmp = dir.join(format!("{}.{ext}.tmp", p.name));
        let _ = std::fs::remove_file(&tmp);
        write(&tmp, &bytes, mode)?;
        std::fs::rename(&tmp, &path).map_err(|e| bad(format!("rename {}: {e}", path.display())))?;
    }
    Ok(())
}

/// Issue certificates with the CA of `dir` (`ca.crt`, `ca.key`): for new
/// `principals` (refused if `<name>.crt` exists), or, with `renew`, anew for
/// existing ones (a new key and serial, valid `days` from now; the old
/// certificate stays valid until it expires or is revoked). Nodes load
/// their certificate at start: restart each after its renewal.
pub fn issue(
    dir: &Path,
    principals: &[Principal],
    days: u32,
    renew: bool,
) -> Result<Vec<String>, TransferError> {
    if !(1..=CA_DAYS).contains(&days) {
        return Err(bad(format!("validity must be 1..={CA_DAYS} days")));
    }
    for p in principals {
        let exists = dir.join(format!("{}.crt", p.name)).exists();
        if exists != renew {
            return Err(bad(match renew {
                true => format!("{} has no certificate to renew", p.name),
                false => format!("{}.crt exists; renew it instead", p.name),
            }));
        }
    }
    let pem = std::fs::read_to_string(dir.join("ca.key"))
        .map_err(|e| bad(format!("read {}: {e}", dir.join("ca.key").display())))?;
    let ca_key = KeyPair::from_pem(&pem).map_err(bad)?;
    let ca = ca_params()?.self_signed(&ca_key).map_err(bad)?;
    let mut names = Vec::new();
    for p in principals {
        sign_leaf(dir, p, days, &ca, &ca_key)?;
        names.push(format!("{}.crt", p.name));
        names.push(format!("{}.key", p.name));
    }
    Ok(names)
}

/// Who the certificate `<name>.crt` of `dir` names (to renew it as such).
pub fn principal_in(dir: &Path, name: &str) -> Result<Principal, TransferError> {
    let path = dir.join(format!("{name}.crt"));
    let pem = std::fs::read(&path).map_err(|e| bad(format!("read {}: {e}", path.display())))?;
    let (_, p) = x509_parser::pem::parse_x509_pem(&pem).map_err(bad)?;
    super::principal_of(&p.contents)
        .ok_or_else(|| bad(format!("{} names no node, tool or tenant", path.display())))
}

/// Revoke the certificates `names` (`<name>.crt` in `dir`): add their
/// serial numbers to the CA's revocation list `ca.crl` (made if missing;
/// its number goes up by one, the entries already on it stay) and sign it
/// with `ca.key`. The new list replaces the old one atomically. The serials
/// on the list now.
pub fn revoke(dir: &Path, names: &[String]) -> Result<Vec<Vec<u8>>, TransferError> {
    let read = |f: &str| {
        std::fs::read(dir.join(f)).map_err(|e| bad(format!("read {}: {e}", dir.join(f).display())))
    };
    let (mut serials, number) = match read("ca.crl") {
        Ok(pem) => listed(&pem)?,
        Err(_) => (Vec::new(), 0),
    };
    for n in names {
        let serial = serial_of(&read(&format!("{n}.crt"))?)?;
        if !serials.contains(&serial) {
            serials.push(serial);
        }
    }
    let key = KeyPair::from_pem(&String::from_utf8_lossy(&read("ca.key")?)).map_err(bad)?;
    let ca = ca_params()?.self_signed(&key).map_err(bad)?;
    let now = SystemTime::now();
    let crl = rcgen::CertificateRevocationListParams {
        this_update: now.into(),
        next_update: (now + Duration::from_secs(86_400 * u64::from(CA_DAYS))).into(),
        crl_number: rcgen::SerialNumber::from(number + 1),
        issuing_distribution_point: None,
        revoked_certs: serials
            .iter()
            .map(|s| rcgen::RevokedCertParams {
                serial_number: rcgen::SerialNumber::from_slice(s),
                revocation_time: now.into(),
                reason_code: None,
                invalidity_date: None,
            })
            .collect(),
        key_identifier_method: rcgen::KeyIdMethod::Sha256,
    }
    .signed_by(&ca, &key)
    .map_err(bad)?;
    let pem = crl.pem().map_err(bad)?;
    let tmp = dir.join("ca.crl.tmp");
    let _ = std::fs::remove_file(&tmp);
    write(&tmp, pem.as_bytes(), 0o644)?;
    std::fs::rename(&tmp, dir.join("ca.crl")).map_err(|e| bad(format!("rename ca.crl: {e}")))?;
    Ok(serials)
}

/// The serial number of a PEM certificate.
fn serial_of(pem: &[u8]) -> Result<Vec<u8>, TransferError> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem).map_err(bad)?;
    let cert = p.parse_x509().map_err(bad)?;
    Ok(cert.tbs_certificate.raw_serial().to_vec())
}

/// The serials on a PEM revocation list, and its number.
fn listed(pem: &[u8]) -> Result<(Vec<Vec<u8>>, u64), TransferError> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem).map_err(bad)?;
    let (_, crl) = x509_parser::parse_x509_crl(&p.contents).map_err(bad)?;
    let serials = crl
        .iter_revoked_certificates()
        .map(|r| r.raw_serial().to_vec())
        .collect();
    let number = crl
        .crl_number()
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(0);
    Ok((serials, number))
}

/// The certificate parameters of principal `p`, valid for `days`.
fn leaf(p: &Principal, days: u32) -> Result<CertificateParams, TransferError> {
    let dns = match p.role {
        Role::Node => vec![
            node_dns_name(&p.name),
            SERVER_NAME.to_string(),
            "localhost".into(),
        ],
        Role::Tool | Role::Tenant => Vec::new(),
    };
    let mut c = CertificateParams::new(dns).map_err(bad)?;
    c.subject_alt_names
        .push(SanType::URI(p.uri().try_into().map_err(bad)?));
    c.distinguished_name
        .push(DnType::CommonName, p.name.as_str());
    c.is_ca = IsCa::NoCa;
    c.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    c.extended_key_usages = match p.role {
        Role::Node => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        Role::Tool | Role::Tenant => vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    validity(&mut c, days);
    Ok(c)
}

/// Create `path` with `mode` (never over an existing file) and write `bytes`.
fn write(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TransferError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|e| bad(format!("write {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use rustls::pki_types::pem::PemObject;

    use super::*;
    use crate::security::{NodeIdentity, SecurityMode};

    #[test]
    fn init_makes_loadable_identities_with_private_keys() {
        let dir = tempfile::tempdir().unwrap();
        init(dir.path(), &[node("a"), node("b")], 90).unwrap();
        for n in ["ca", "a", "b"] {
            let mode = std::fs::metadata(dir.path().join(format!("{n}.key")))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{n}.key");
        }
        let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
        let id = NodeIdentity::from_pem(
            SecurityMode::Authenticate,
            read("b.crt"),
            read("b.key"),
            read("ca.crt"),
        )
        .unwrap();
        assert_eq!(id.node_id(), Some("b"), "the id comes from the certificate");
        assert!(init(dir.path(), &[node("a")], 90).is_err(), "no overwrite");
        assert!(init(dir.path(), &[node("x/y")], 90).is_err());
    }

    fn node(name: &str) -> Principal {
        Principal {
            role: Role::Node,
            name: name.into(),
        }
    }

    #[test]
    fn tools_and_tenants_are_named_but_are_no_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let ops = Principal {
            role: Role::Tool,
            name: "ops".into(),
        };
        let acme = Principal {
            role: Role::Tenant,
            name: "acme".into(),
        };
        init(dir.path(), &[node("n0"), ops.clone(), acme.clone()], 30).unwrap();
        let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
        let load = |n: &str| {
            NodeIdentity::from_pem(
                SecurityMode::Authenticate,
                read(&format!("{n}.crt")),
                read(&format!("{n}.key")),
                read("ca.crt"),
            )
            .unwrap()
        };
        assert_eq!(load("ops").principal, ops);
        assert_eq!(load("acme").principal, acme);
        assert_eq!(load("ops").node_id(), None, "a tool is no node");
        assert_eq!(load("n0").node_id(), Some("n0"));
        let der = |n: &str| {
            rustls::pki_types::CertificateDer::from_pem_slice(&read(&format!("{n}.crt"))).unwrap()
        };
        assert_eq!(crate::security::node_id_of(&der("acme")), None);
        assert_eq!(
            crate::security::node_id_of(&der("n0")).as_deref(),
            Some("n0")
        );
        assert!(
            init(
                dir.path().join("dup").as_path(),
                &[node("x"), node("x")],
                30
            )
            .is_err(),
            "a name twice"
        );
        assert!(init(dir.path().join("d").as_path(), &[node("x")], 0).is_err());
    }

    #[test]
    fn revoked_certificates_are_refused_once_the_list_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let ops = Principal {
            role: Role::Tool,
            name: "ops".into(),
        };
        init(dir.path(), &[node("a"), node("b"), ops], 30).unwrap();
        let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
        let a = NodeIdentity::with_revocations(
            SecurityMode::Authenticate,
            read("a.crt"),
            read("a.key"),
            read("ca.crt"),
            Some(&dir.path().join("ca.crl")),
        )
        .unwrap();
        let der = |n: &str| {
            rustls::pki_types::CertificateDer::from_pem_slice(&read(&format!("{n}.crt"))).unwrap()
        };
        assert!(!a.is_revoked(&der("ops")), "the list starts empty");
        assert_eq!(revoke(dir.path(), &["ops".into()]).unwrap().len(), 1);
        assert!(!a.is_revoked(&der("ops")), "not before the reload");
        assert!(a.reload_revocations().unwrap());
        assert!(a.is_revoked(&der("ops")));
        assert!(!a.is_revoked(&der("b")));
        assert_eq!(
            revoke(dir.path(), &["b".into()]).unwrap().len(),
            2,
            "entries stay"
        );
        assert!(a.reload_revocations().unwrap());
        assert!(a.is_revoked(&der("ops")) && a.is_revoked(&der("b")));
        assert!(!a.reload_revocations().unwrap(), "unchanged");

        // Another CA's list is refused; the one in force stays.
        let other = tempfile::tempdir().unwrap();
        init(other.path(), &[node("a")], 30).unwrap();
        revoke(other.path(), &["a".into()]).unwrap();
        std::fs::copy(other.path().join("ca.crl"), dir.path().join("ca.crl")).unwrap();
        assert!(
            a.reload_revocations().is_err(),
            "a list the CA did not sign"
        );
        assert!(a.is_revoked(&der("ops")), "the list in force stays");
        assert!(revoke(dir.path(), &["nobody".into()]).is_err());
    }

    #[test]
    fn issued_and_renewed_certificates_chain_to_the_same_ca() {
        let dir = tempfile::tempdir().unwrap();
        init(dir.path(), &[node("a")], 30).unwrap();
        let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
        let b = node("b");
        issue(dir.path(), std::slice::from_ref(&b), 30, false).unwrap();
        assert!(
            issue(dir.path(), std::slice::from_ref(&b), 30, false).is_err(),
            "b exists"
        );
        assert!(
            issue(dir.path(), &[node("zz")], 30, true).is_err(),
            "nothing to renew"
        );
        let before = read("a.crt");
        assert_eq!(principal_in(dir.path(), "a").unwrap(), node("a"));
        issue(
            dir.path(),
            &[principal_in(dir.path(), "a").unwrap()],
            30,
            true,
        )
        .unwrap();
        assert_ne!(read("a.crt"), before, "a new certificate");
        for n in ["a", "b"] {
            let id = NodeIdentity::with_revocations(
                SecurityMode::Authenticate,
                read(&format!("{n}.crt")),
                read(&format!("{n}.key")),
                read("ca.crt"),
                Some(&dir.path().join("ca.crl")),
            )
            .unwrap();
            assert_eq!(id.node_id(), Some(n));
        }
        // The renewed certificate is one the CA signed: the old one revoked
        // leaves it valid.
        let a = NodeIdentity::with_revocations(
            SecurityMode::Authenticate,
            read("b.crt"),
            read("b.key"),
            read("ca.crt"),
            Some(&dir.path().join("ca.crl")),
        )
        .unwrap();
        let old = rustls::pki_types::CertificateDer::from_pem_slice(&before).unwrap();
        let renewed = rustls::pki_types::CertificateDer::from_pem_slice(&read("a.crt")).unwrap();
        std::fs::write(dir.path().join("old.crt"), &before).unwrap();
        revoke(dir.path(), &["old".into()]).unwrap();
        assert!(a.reload_revocations().unwrap());
        assert!(a.is_revoked(&old));
        assert!(!a.is_revoked(&renewed));
    }
}
