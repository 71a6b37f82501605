//! kvfabric-benches: benchmark drivers run by `kvfabric bench <name>`.
//!
//! Every figure is reported as a ratio against a physical limit or a real
//! peer (iperf3, fio, redis-server, memcpy, llama.cpp, Mooncake) measured in the same run.
//! Each module exposes a clap `Args` struct and a `run(&Args)` that returns
//! the JSON report; `kvfabric bench <name> --json` prints it, without
//! `--json` a readable table. This crate sits on top of the others and, like a
//! binary, reports errors with `anyhow`.

pub mod agentic;
pub mod batch;
pub mod cluster;
pub mod engine;
pub mod eviction;
pub mod hosts;
pub mod kv;
pub(crate) mod mooncake;
pub mod reuse;
pub mod sim;
pub mod soak;
pub mod spec;
pub mod store;
pub mod transfer;
pub mod vllm;

/// The model a bench was given (`--model`; the binary fills in the fetched
/// reference model), refused with a clear error when absent or missing.
pub(crate) fn model_file(model: &Option<std::path::PathBuf>) -> anyhow::Result<std::path::PathBuf> {
    let path = model
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no model given (--model PATH)"))?;
    anyhow::ensure!(
        path.exists(),
        "model not found at {}: run `kvfabric model fetch`",
        path.display()
    );
    Ok(path)
}

/// Run `work` on a fresh 2-worker tokio runtime on a thread of its own, so a
/// bench works whether or not its caller is already async.
pub(crate) fn on_own_runtime<T, F>(work: F) -> anyhow::Result<T>
where
    T: Send + 'static,
    F: FnOnce(&tokio::runtime::Runtime) -> anyhow::Result<T> + Send + 'static,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        work(&rt)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("bench thread panicked"))?
}

/// Run `fut` as a task on one of `rt`'s workers and wait for it. A future
/// polled by `block_on` lives on the calling thread, so every wakeup from the
/// I/O driver costs a thread hop that no real caller (a store or engine task)
/// pays; latency figures are taken from a worker like theirs.
pub(crate) fn on_worker<T, F>(rt: &tokio::runtime::Runtime, fut: F) -> anyhow::Result<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = anyhow::Result<T>> + Send + 'static,
{
    rt.block_on(rt.spawn(fut))
        .map_err(|e| anyhow::anyhow!("bench task failed: {e}"))?
}

/// Print a bench report: one JSON line with `--json`, else `table`.
pub(crate) fn print_report(
    json: bool,
    report: &serde_json::Value,
    table: impl FnOnce(&serde_json::Value),
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        table(report);
    }
    Ok(())
}
