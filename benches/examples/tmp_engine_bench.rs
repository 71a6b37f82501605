use clap::Parser;
#[derive(Parser)]
struct A { #[command(flatten)] a: kvfabric_benches::engine::EngineArgs }
fn main() -> anyhow::Result<()> { kvfabric_benches::engine::run(&A::parse().a) }
