//! `kvfabric tenants`: make and hash API keys for a tenants file.
//!
//! The file stores only `blake3:<hex>` of each key (docs/SECURITY.md).
//! `new-key` prints a fresh random key and the line to put in the file;
//! `hash-key` reads a key from stdin (so it stays out of shell history and
//! `ps`) and prints its stored form.

use std::io::Read;

use clap::{Args, Subcommand};
use kvfabric_tenants::{new_key, KeyHash};

#[derive(Args, Debug)]
pub struct TenantsCmd {
    #[command(subcommand)]
    action: TenantsAction,
}

#[derive(Subcommand, Debug)]
enum TenantsAction {
    /// Print a new random API key (give it to the tenant) and its hash (put it in `api_keys`).
    NewKey,
    /// Read an API key from stdin, print its hash for `api_keys`.
    HashKey,
}

pub fn run(cmd: TenantsCmd) -> anyhow::Result<()> {
    match cmd.action {
        TenantsAction::NewKey => {
            let key = new_key();
            println!("key:  {key}");
            println!("hash: {}", KeyHash::of(&key));
        }
        TenantsAction::HashKey => {
            let mut key = String::new();
            std::io::stdin().read_to_string(&mut key)?;
            let key = key.trim();
            anyhow::ensure!(!key.is_empty(), "no key on stdin");
            println!("{}", KeyHash::of(key));
        }
    }
    Ok(())
}
