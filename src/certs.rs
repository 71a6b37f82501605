//! `kvfabric certs init DIR --nodes a,b,c`: a cluster CA and one certificate
//! and key per node, for operators and tests (rcgen, ECDSA P-256).
//!
//! Layout of DIR: `ca.crt`, `ca.key`, and `<node>.crt`, `<node>.key` per
//! node; keys are written 0600 and nothing that exists is overwritten. A
//! node certificate names its node id as the URI subject alternative name
//! `kvfabric://node/<id>` (the id peers take as the node's identity; the CN
//! repeats it for people), plus the DNS names `kvfabric-node` (what every
//! client verifies) and `localhost`, and may serve and connect (server and
//! client auth). Certificates are valid from the start of last year for
//! `--valid-years` years.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kvfabric_transfer::security::{node_uri, SERVER_NAME};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

#[derive(Args, Debug)]
pub struct CertsCmd {
    #[command(subcommand)]
    action: CertsAction,
}

#[derive(Subcommand, Debug)]
enum CertsAction {
    /// Make a cluster CA and node certificates in DIR (ca.crt, ca.key, <node>.crt, <node>.key).
    Init(InitArgs),
}

#[derive(Args, Debug)]
struct InitArgs {
    /// Directory to write into (created if missing; existing files are never overwritten).
    dir: PathBuf,
    /// Node ids to issue certificates for, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "node-0")]
    nodes: Vec<String>,
    /// Years the certificates stay valid.
    #[arg(long, default_value_t = 10)]
    valid_years: i32,
}

pub fn run(cmd: CertsCmd) -> anyhow::Result<()> {
    match cmd.action {
        CertsAction::Init(a) => init(&a.dir, &a.nodes, a.valid_years),
    }
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
pub fn init(dir: &Path, nodes: &[String], years: i32) -> anyhow::Result<()> {
    if nodes.is_empty() || nodes.iter().any(|n| n.is_empty() || n.contains('/')) {
        bail!("--nodes needs one or more ids, without '/'");
    }
    if !(1..=100).contains(&years) {
        bail!("--valid-years must be 1..=100");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut names = vec!["ca.crt".to_string(), "ca.key".to_string()];
    for n in nodes {
        names.push(format!("{n}.crt"));
        names.push(format!("{n}.key"));
    }
    if let Some(existing) = names.iter().find(|n| dir.join(n).exists()) {
        bail!(
            "{} exists; refusing to overwrite",
            dir.join(existing).display()
        );
    }

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "kvfabric cluster CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut ca, years);
    let ca_cert = ca.self_signed(&ca_key)?;
    write(&dir.join("ca.crt"), ca_cert.pem().as_bytes(), 0o644)?;
    write(
        &dir.join("ca.key"),
        ca_key.serialize_pem().as_bytes(),
        0o600,
    )?;

    for node in nodes {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(vec![SERVER_NAME.to_string(), "localhost".into()])?;
        p.subject_alt_names
            .push(SanType::URI(node_uri(node).try_into()?));
        p.distinguished_name.push(DnType::CommonName, node.as_str());
        p.is_ca = IsCa::NoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        validity(&mut p, years);
        let cert = p.signed_by(&key, &ca_cert, &ca_key)?;
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
    println!(
        "wrote {} in {} (CA and {} node certificates)",
        names.join(" "),
        dir.display(),
        nodes.len()
    );
    Ok(())
}

/// Create `path` with `mode` (never over an existing file) and write `bytes`.
fn write(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    f.write_all(bytes)
        .with_context(|| format!("write {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use kvfabric_transfer::security::{NodeIdentity, SecurityMode};

    use super::*;

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
