//! `kvfabric certs init DIR --nodes a,b,c [--tools ops] [--tenants acme]`: a
//! cluster CA and one certificate and key per node, operator tool and
//! tenant client; `kvfabric certs revoke DIR NAME..`: onto the CA's
//! revocation list; the files and what a certificate names are described in
//! `kvfabric_transfer::security::certs` and docs/SECURITY.md.

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub struct CertsCmd {
    #[command(subcommand)]
    action: CertsAction,
}

#[derive(Subcommand, Debug)]
enum CertsAction {
    /// Make a cluster CA and certificates in DIR (ca.crt, ca.key, ca.crl, <name>.crt, <name>.key).
    Init(InitArgs),
    /// Revoke certificates of DIR: add them to the CA's revocation list
    /// (DIR/ca.crl, signed with DIR/ca.key). Nodes given it as
    /// `[cluster.security] crl` (--tls-crl) refuse them within a second.
    Revoke(RevokeArgs),
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
    /// Node ids to issue node certificates for, comma-separated (members:
    /// the internal services and the transfer plane accept only these).
    #[arg(long, value_delimiter = ',', default_value = "node-0")]
    nodes: Vec<String>,
    /// Operators' tools (`kvfabric ctl`) to issue client certificates for.
    #[arg(long, value_delimiter = ',')]
    tools: Vec<String>,
    /// Tenants' clients to issue client certificates for (the CacheService
    /// only, under their API keys).
    #[arg(long, value_delimiter = ',')]
    tenants: Vec<String>,
    /// Days the node, tool and tenant certificates stay valid (the CA: 10 years).
    #[arg(long, default_value_t = 90)]
    valid_days: u32,
}

pub fn run(cmd: CertsCmd) -> anyhow::Result<()> {
    match cmd.action {
        CertsAction::Init(a) => {
            use kvfabric_transfer::security::{Principal, Role};
            let named = |role: Role, names: &[String]| {
                names
                    .iter()
                    .map(move |n| Principal {
                        role,
                        name: n.clone(),
                    })
                    .collect::<Vec<_>>()
            };
            let mut all = named(Role::Node, &a.nodes);
            all.extend(named(Role::Tool, &a.tools));
            all.extend(named(Role::Tenant, &a.tenants));
            let names = kvfabric_transfer::security::certs::init(&a.dir, &all, a.valid_days)?;
            println!("wrote {} in {}", names.join(" "), a.dir.display());
            Ok(())
        }
        CertsAction::Revoke(a) => {
            let listed = kvfabric_transfer::security::certs::revoke(&a.dir, &a.names)?;
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
