//! `kvfabric certs init DIR --nodes a,b,c`: a cluster CA and one certificate
//! and key per node; the files and what a certificate names are described in
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
        CertsAction::Init(a) => {
            let names = kvfabric_transfer::security::certs::init(&a.dir, &a.nodes, a.valid_years)?;
            println!("wrote {} in {}", names.join(" "), a.dir.display());
            Ok(())
        }
    }
}
