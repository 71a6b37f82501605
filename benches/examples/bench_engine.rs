//! `cargo run -p kvfabric-benches [--features candle-peer] --example bench_engine -- [ARGS]`:
//! the engine bench without the `kvfabric` binary (same arguments as
//! `kvfabric bench engine`; the model defaults to the reference model path).
//! No tracing subscriber here: the venv build's progress still shows on stderr.

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: kvfabric_benches::engine::EngineArgs,
}

fn main() -> anyhow::Result<()> {
    let mut cli = Cli::parse();
    if cli.args.model.is_none() {
        cli.args.model = Some(kvfabric_engine::model::reference_model_path());
    }
    kvfabric_benches::engine::run(&cli.args)
}
