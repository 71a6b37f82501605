//! Cluster certificates (`kvfabric certs init`): a CA and one certificate
//! and key per node (rcgen, ECDSA P-256), for operators, tests and benches.
//!
//! Layout of DIR: `ca.crt`, `ca.key`, and `<node>.crt`, `<node>.key` per
//! node; keys are written 0600 and nothing that exists is overwritten. A
//! node certificate names its node id as the URI SAN `kvfabric://node/<id>`
//! (the id peers take as the node's identity; the CN repeats it for people),
//! plus the DNS names `kvfabric-node` (what every client verifies) and
//! `localhost`, and may serve and connect (server and client auth).
//! Certificates are valid from the start of last year for `years` years.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

use super::{node_uri, SERVER_NAME};
use crate::error::BadInput;
use crate::TransferError;

fn bad(e: impl std::fmt::Display) -> TransferError {
    TransferError::InvalidArgument(BadInput::Credentials {
        what: "certs".into(),
        reason: e.to_string(),
    })
}

/// The current year (UTC), from the clock.
fn this_year() -> i32 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    1970 + (secs / 31_556_952) as i32
}

fn validity(p: &mut CertificateParams, years: i32) {
    let start = this_year() - 1;
    p.not_before = rcgen::date_time_ymd(start, 1, 1);
    p.not_after = rcgen::date_time_ymd(start + 1 + years, 1, 1);
}

/// Make the CA and `nodes`' certificates in `dir`.
pub fn init(dir: &Path, nodes: &[String], years: i32) -> Result<Vec<String>, TransferError> {
    if nodes.is_empty() || nodes.iter().any(|n| n.is_empty() || n.contains('/')) {
        return Err(bad("node ids must be non-empty, without '/'"));
    }
    if !(1..=100).contains(&years) {
        return Err(bad("validity must be 1..=100 years"));
    }
    std::fs::create_dir_all(dir).map_err(|e| bad(format!("create {}: {e}", dir.display())))?;
    let mut names = vec!["ca.crt".to_string(), "ca.key".to_string()];
    for n in nodes {
        names.push(format!("{n}.crt"));
        names.push(format!("{n}.key"));
    }
    if let Some(existing) = names.iter().find(|n| dir.join(n).exists()) {
        return Err(bad(format!(
            "{} exists; refusing to overwrite",
            dir.join(existing).display()
        )));
    }

    let ca_key = KeyPair::generate().map_err(bad)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(bad)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "kvfabric cluster CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut ca, years);
    let ca_cert = ca.self_signed(&ca_key).map_err(bad)?;
    write(&dir.join("ca.crt"), ca_cert.pem().as_bytes(), 0o644)?;
    write(
        &dir.join("ca.key"),
        ca_key.serialize_pem().as_bytes(),
        0o600,
    )?;

    for node in nodes {
        let key = KeyPair::generate().map_err(bad)?;
        let mut p = CertificateParams::new(vec![SERVER_NAME.to_string(), "localhost".into()])
            .map_err(bad)?;
        p.subject_alt_names
            .push(SanType::URI(node_uri(node).try_into().map_err(bad)?));
        p.distinguished_name.push(DnType::CommonName, node.as_str());
        p.is_ca = IsCa::NoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        validity(&mut p, years);
        let cert = p.signed_by(&key, &ca_cert, &ca_key).map_err(bad)?;
        write(
            &dir.join(format!("{node}.crt")),
            cert.pem().as_bytes(),
            0o644,
        )?;
        write(
            &dir.join(format!("{node}.key")),
            key.serialize_pem().as_bytes(),
            0o600,
        )?;
    }
    Ok(names)
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

    use super::*;
    use crate::security::{NodeIdentity, SecurityMode};

    #[test]
    fn init_makes_loadable_identities_with_private_keys() {
        let dir = tempfile::tempdir().unwrap();
        init(dir.path(), &["a".into(), "b".into()], 10).unwrap();
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
        assert_eq!(id.node_id, "b", "the id comes from the certificate");
        assert!(init(dir.path(), &["a".into()], 10).is_err(), "no overwrite");
        assert!(init(dir.path(), &["x/y".into()], 10).is_err());
    }
}
