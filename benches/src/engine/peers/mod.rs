//! The peers `kvfabric bench engine` measures in the same run: llama.cpp on
//! the same GGUF file and on its F32 conversion (through PyPI
//! llama-cpp-python in a venv this module builds once), and candle (see
//! [`super::candle_peer`]).
//!
//! Everything here is best-effort by design: a peer that cannot be built or
//! run yields a [`PeerOutcome::Unavailable`] with the reason, never an error
//! that would lose the kvfabric figures. The Python side lives in
//! `benches/peers/` (embedded at compile time, so the binary works from any
//! directory): `llamacpp_venv.sh` builds the venv (native flags, idempotent,
//! progress on stderr), `gguf_to_f32.py` converts and caches the F32 file with
//! its sha256, `llamacpp_bench.py` times the four figures and prints one JSON
//! line.
//!
//! Here: both llama.cpp columns; `workload`: the workload, the rates and
//! the outcomes; [`venv`]: the venv, the F32 conversion and one driver run; `child`:
//! running a child process with a time limit and reading its JSON line.

pub(crate) mod child;
#[cfg(test)]
mod tests;
mod venv;
mod workload;

use std::path::{Path, PathBuf};

use serde_json::json;

pub use venv::{LlamaCppVenv, PeerLimits};
pub use workload::{PeerOutcome, PeerWorkload, Rates};

/// Where the llama.cpp venv lives by default: `~/.cache/kvfabric/llamacpp-venv`.
pub fn default_venv() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default()
        .join(".cache/kvfabric/llamacpp-venv")
}

/// Both llama.cpp columns: the venv once, then the model as given and its
/// F32 conversion. Each outcome carries its own reason when unavailable.
pub fn llamacpp(
    venv_dir: &Path,
    model: &Path,
    work: &PeerWorkload,
    limits: PeerLimits,
) -> (PeerOutcome, PeerOutcome) {
    let venv = match LlamaCppVenv::ensure(venv_dir, limits) {
        Ok(v) => v,
        Err(e) => {
            let why = format!("{e:#}");
            return (
                PeerOutcome::Unavailable(why.clone()),
                PeerOutcome::Unavailable(why),
            );
        }
    };
    tracing::info!(
        threads = work.threads,
        "measuring llama.cpp on {}",
        model.display()
    );
    let native = match venv.measure(model, work, limits) {
        Ok((rates, details)) => PeerOutcome::Measured { rates, details },
        Err(e) => PeerOutcome::Unavailable(format!("{e:#}")),
    };
    let f32 = venv.f32_model(model, limits).and_then(|(path, record)| {
        tracing::info!(
            threads = work.threads,
            "measuring llama.cpp on {}",
            path.display()
        );
        let (rates, mut details) = venv.measure(&path, work, limits)?;
        details["model"] = json!(path);
        details["conversion"] = record;
        Ok((rates, details))
    });
    let f32 = match f32 {
        Ok((rates, details)) => PeerOutcome::Measured { rates, details },
        Err(e) => PeerOutcome::Unavailable(format!("{e:#}")),
    };
    (native, f32)
}
