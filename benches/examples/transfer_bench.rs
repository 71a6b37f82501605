//! Temporary driver for `benches::transfer::run` (the lead wires `kvfabric bench transfer`).
use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}
#[derive(Subcommand)]
enum Cmd {
    Bench {
        #[command(subcommand)]
        which: Which,
    },
}
#[derive(Subcommand)]
enum Which {
    Transfer(kvfabric_benches::transfer::TransferArgs),
}

fn main() -> anyhow::Result<()> {
    let Cmd::Bench { which: Which::Transfer(a) } = Cli::parse().cmd;
    kvfabric_benches::transfer::run(&a)
}
