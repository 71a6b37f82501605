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
//! Here: the workload, the rates, the outcomes and both llama.cpp columns;
//! [`venv`]: the venv, the F32 conversion and one driver run; `child`:
//! running a child process with a time limit and reading its JSON line.

mod child;
#[cfg(test)]
mod tests;
mod venv;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

pub(crate) use child::{last_json_line, parse_rates, run_child, Output};
pub use venv::{LlamaCppVenv, PeerLimits};

/// Pinned llama-cpp-python (the version the reference figures used).
pub const LLAMA_CPP_PYTHON_VERSION: &str = "0.3.36";
/// Pinned PyPI gguf (the converter; same as the engine's oracle venv).
pub const GGUF_VERSION: &str = "0.19.0";

/// The exact work every engine does, so all columns time the same tokens.
#[derive(Clone, Debug)]
pub struct PeerWorkload {
    pub threads: usize,
    pub repeats: usize,
    pub decode_steps: usize,
    pub prefill512: Vec<u32>,
    pub prefill2048: Vec<u32>,
    /// Eight 128-token prompts; batch 1 decodes the first one.
    pub decode_prompts: Vec<Vec<u32>>,
}

/// The four rates of one engine, tokens per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    pub prefill512: f64,
    pub prefill2048: f64,
    pub decode1: f64,
    pub decode8: f64,
}

impl Rates {
    /// The report's keys for these rates: `<prefix>_prefill512_tps` ...
    /// (`prefill512_tps` ... for an empty prefix), null when not measured.
    pub fn keys(prefix: &str, rates: Option<&Rates>) -> Vec<(String, Value)> {
        let name = |figure: &str| {
            if prefix.is_empty() {
                format!("{figure}_tps")
            } else {
                format!("{prefix}_{figure}_tps")
            }
        };
        let v = |f: fn(&Rates) -> f64| rates.map_or(Value::Null, |r| json!(f(r)));
        vec![
            (name("prefill512"), v(|r| r.prefill512)),
            (name("prefill2048"), v(|r| r.prefill2048)),
            (name("decode1"), v(|r| r.decode1)),
            (name("decode8"), v(|r| r.decode8)),
        ]
    }
}

/// What one peer gave: its rates plus details worth reporting, or why not.
#[derive(Clone, Debug)]
pub enum PeerOutcome {
    Measured { rates: Rates, details: Value },
    Unavailable(String),
}

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
