//! Runs `kvfabric bench store` without the binary: `cargo run -p kvfabric-benches --example store_bench -- [--json]`.

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: kvfabric_benches::store::StoreArgs,
}

fn main() -> anyhow::Result<()> {
    kvfabric_benches::store::run(&Cli::parse().args)
}
