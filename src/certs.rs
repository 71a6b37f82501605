//! `kvfabric certs init DIR --nodes a,b,c [--tools ops] [--tenants acme]`: a
//! cluster CA and one certificate and key per node, operator tool and
//! tenant client; `kvfabric certs issue DIR --nodes d` and `renew DIR NAME..`
//! with the same CA; `kvfabric certs revoke DIR NAME..`: onto the CA's
//! revocation list; the files and what a certificate names are described in
//! `kvfabric_transfer::security::certs` and docs/SECURITY.md.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use kvfabric_transfer::security::{certs, Principal, Role};

#[derive(Args, Debug)]
pub struct CertsCmd {
    #[command(subcommand)]
    action: CertsAction,
}

#[derive(Subcommand, Debug)]
enum CertsAction {
    /// Make a cluster CA and certificates in DIR (ca.crt, ca.key, ca.crl, <name>.crt, <name>.key).
    Init(InitArgs),
    /// Issue certificates for new names with the CA of DIR (ca.crt, ca.key).
    Issue(IssueArgs),
    /// Renew certificates of DIR: a new key and certificate for each name, as
    /// the role its certificate names; restart each node after its renewal.
    Renew(RenewArgs),
    /// Revoke certificates of DIR: add them to the CA's revocation list
    /// (DIR/ca.crl, signed with DIR/ca.key). Nodes given it as
    /// `[cluster.security] crl` (--tls-crl) refuse them within a second.
    Revoke(RevokeArgs),
}

#[derive(Args, Debug)]
struct IssueArgs {
    /// The directory `certs init` wrote.
    dir: PathBuf,
    #[command(flatten)]
    names: Names,
    /// Days the certificates stay valid.
    #[arg(long, default_value_t = 90)]
    valid_days: u32,
}

#[derive(Args, Debug)]
struct RenewArgs {
    /// The directory `certs init` wrote.
    dir: PathBuf,
    /// Names whose certificates (<name>.crt) to renew.
    #[arg(required = true)]
    names: Vec<String>,
    /// Days the new certificates stay valid.
    #[arg(long, default_value_t = 90)]
    valid_days: u32,
}

/// Who to issue certificates for, by role.
#[derive(Args, Debug)]
struct Names {
    /// Node ids to issue node certificates for, comma-separated (members:
    /// the internal services and the transfer plane accept only these).
    #[arg(long, value_delimiter = ',')]
    nodes: Vec<String>,
    /// Operators' tools (`kvfabric ctl`) to issue client certificates for.
    #[arg(long, value_delimiter = ',')]
    tools: Vec<String>,
    /// Tenants' clients to issue client certificates for (the CacheService
    /// only, under their API keys).
    #[arg(long, value_delimiter = ',')]
    tenants: Vec<String>,
}

impl Names {
    fn principals(&self) -> Vec<Principal> {
        let named = |role: Role, names: &[String]| {
            names
                .iter()
                .map(move |n| Principal {
                    role,
                    name: n.clone(),
                })
                .collect::<Vec<_>>()
        };
        let mut all = named(Role::Node, &self.nodes);
        all.extend(named(Role::Tool, &self.tools));
        all.extend(named(Role::Tenant, &self.tenants));
        all
    }
}

#[derive(Args, Debug)]
struct RevokeArgs {
    /// The directory `certs init` wrote (ca.key, ca.crl, <name>.crt).
    dir: PathBuf,
    /// Names whose certificates (<name>.crt) to revoke.
    #[arg(required = true)]
    names: Vec<String>,
}

#[derive(Args, Debug)]
struct InitArgs {
    /// Directory to write into (created if missing; existing files are never overwritten).
    dir: PathBuf,
    #[command(flatten)]
    names: Names,
    /// Days the node, tool and tenant certificates stay valid (the CA: 10 years).
    #[arg(long, default_value_t = 90)]
    valid_days: u32,
}

pub fn run(cmd: CertsCmd) -> anyhow::Result<()> {
    match cmd.action {
        CertsAction::Init(a) => {
            let mut all = a.names.principals();
            if all.is_empty() {
                all.push(Principal::node("node-0"));
            }
            let names = certs::init(&a.dir, &all, a.valid_days)?;
            println!("wrote {} in {}", names.join(" "), a.dir.display());
            Ok(())
        }
        CertsAction::Issue(a) => {
            let names = certs::issue(&a.dir, &a.names.principals(), a.valid_days, false)?;
            println!("wrote {} in {}", names.join(" "), a.dir.display());
            Ok(())
        }
        CertsAction::Renew(a) => {
            let who = a
                .names
                .iter()
                .map(|n| certs::principal_in(&a.dir, n))
                .collect::<Result<Vec<_>, _>>()?;
            let names = certs::issue(&a.dir, &who, a.valid_days, true)?;
            println!(
                "renewed {} in {}; restart each node to load its new certificate",
                names.join(" "),
                a.dir.display()
            );
            Ok(())
        }
        CertsAction::Revoke(a) => {
            let listed = certs::revoke(&a.dir, &a.names)?;
            println!(
                "revoked {}; {} now lists {} certificate(s): copy it to every node's crl path",
                a.names.join(" "),
                a.dir.join("ca.crl").display(),
                listed.len()
            );
            Ok(())
        }
    }
}
