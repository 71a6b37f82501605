//! The llama.cpp venv (built once, checked on every run), the F32
//! conversion of a GGUF file, and one timed driver run.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};

use super::child::{last_json_line, parse_rates, run_child, tail, Output};
use super::workload::{PeerWorkload, Rates, GGUF_VERSION, LLAMA_CPP_PYTHON_VERSION};

const VENV_SCRIPT: &str = include_str!("../../../peers/llamacpp_venv.sh");
const BENCH_SCRIPT: &str = include_str!("../../../peers/llamacpp_bench.py");
const F32_SCRIPT: &str = include_str!("../../../peers/gguf_to_f32.py");

/// A built llama.cpp venv: its Python imports llama_cpp and gguf.
pub struct LlamaCppVenv {
    pub(super) python: PathBuf,
    pub(super) scripts: tempfile::TempDir,
}

/// Limits on the peers' child processes.
#[derive(Clone, Copy, Debug)]
pub struct PeerLimits {
    /// Building the venv (download + compile of llama.cpp).
    pub build: Duration,
    /// One conversion or one driver run.
    pub run: Duration,
}

impl LlamaCppVenv {
    /// Build the venv at `dir` unless it is already built (then this is a
    /// quick import check). Compile progress goes to stderr.
    pub fn ensure(dir: &Path, limits: PeerLimits) -> anyhow::Result<LlamaCppVenv> {
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(VENV_SCRIPT)
            .arg("llamacpp_venv.sh")
            .arg(dir)
            .arg(LLAMA_CPP_PYTHON_VERSION)
            .arg(GGUF_VERSION);
        let done = run_child(cmd, b"", Output::ToStderr, limits.build)
            .context("building the llama.cpp venv")?;
        anyhow::ensure!(
            done.status.success(),
            "building the llama.cpp venv in {} failed ({}); log: {}.build.log",
            dir.display(),
            done.status,
            dir.display()
        );
        let scripts = tempfile::Builder::new()
            .prefix("kvfabric-peers-")
            .tempdir()?;
        std::fs::write(scripts.path().join("llamacpp_bench.py"), BENCH_SCRIPT)?;
        std::fs::write(scripts.path().join("gguf_to_f32.py"), F32_SCRIPT)?;
        Ok(LlamaCppVenv {
            python: dir.join("bin/python"),
            scripts,
        })
    }

    /// Run `source` (a driver script) in the venv with `job` as JSON on
    /// stdin: its JSON line, or why it failed.
    pub(crate) fn run_json(
        &self,
        name: &str,
        source: &str,
        job: &Value,
        limits: PeerLimits,
    ) -> anyhow::Result<Value> {
        std::fs::write(self.scripts.path().join(name), source)?;
        let done = run_child(
            self.python(name),
            &serde_json::to_vec(job)?,
            Output::Capture,
            limits.run,
        )?;
        anyhow::ensure!(
            done.status.success(),
            "{name} failed ({}): {}",
            done.status,
            tail(&done.stderr, 6)
        );
        last_json_line(&done.stdout)
    }

    fn python(&self, script: &str) -> Command {
        let mut cmd = Command::new(&self.python);
        cmd.arg(self.scripts.path().join(script));
        cmd
    }

    /// The F32 conversion of `model`, cached next to it as
    /// `<name>.f32.gguf` with `<name>.f32.gguf.sha256` (converted once; a
    /// cached file is re-hashed and reused). Returns the converter's record.
    pub fn f32_model(&self, model: &Path, limits: PeerLimits) -> anyhow::Result<(PathBuf, Value)> {
        let name = model
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| anyhow::anyhow!("model path {} has no file name", model.display()))?;
        let stem = name.strip_suffix(".gguf").unwrap_or(name);
        let dst = model.with_file_name(format!("{stem}.f32.gguf"));
        let mut cmd = self.python("gguf_to_f32.py");
        cmd.arg(model).arg(&dst);
        let done = run_child(cmd, b"", Output::Capture, limits.run)?;
        anyhow::ensure!(
            done.status.success(),
            "F32 conversion failed ({}): {}",
            done.status,
            tail(&done.stderr, 6)
        );
        let record = last_json_line(&done.stdout)?;
        Ok((dst, record))
    }

    /// Run the driver on `model` with `work`; the four rates and the driver's
    /// details (versions, llama.cpp system info, batch settings).
    ///
    /// llama.cpp first runs as configured by default, with its extra weight
    /// buffer types (repacked and AMX kernels). If that run dies on a signal
    /// (on a Xeon with AMX, llama-cpp-python 0.3.36's AMX path segfaulted
    /// on this model's Q4_1 weights), it runs again without them, and the
    /// details say so (`use_extra_bufts: false`, `extra_bufts_crash`).
    pub fn measure(
        &self,
        model: &Path,
        work: &PeerWorkload,
        limits: PeerLimits,
    ) -> anyhow::Result<(Rates, Value)> {
        let v = match self.run_driver(model, work, limits, true)? {
            Ok(v) => v,
            Err((status, why)) if status.signal().is_some() => {
                tracing::warn!("{why}; measuring again without extra buffer types");
                let mut v = self
                    .run_driver(model, work, limits, false)?
                    .map_err(|(_, why)| anyhow::anyhow!(why))?;
                v["extra_bufts_crash"] = json!(why);
                v
            }
            Err((_, why)) => anyhow::bail!(why),
        };
        let rates = parse_rates(&v)?;
        Ok((rates, v))
    }

    /// One driver run: its JSON line, or how it ended and why it failed.
    fn run_driver(
        &self,
        model: &Path,
        work: &PeerWorkload,
        limits: PeerLimits,
        extra_bufts: bool,
    ) -> anyhow::Result<Result<Value, (ExitStatus, String)>> {
        let job = json!({
            "model": model,
            "threads": work.threads,
            "repeats": work.repeats,
            "decode_steps": work.decode_steps,
            "prefill": {"512": work.prefill512, "2048": work.prefill2048},
            "decode_prompts": work.decode_prompts,
            "use_extra_bufts": extra_bufts,
        });
        let done = run_child(
            self.python("llamacpp_bench.py"),
            &serde_json::to_vec(&job)?,
            Output::Capture,
            limits.run,
        )?;
        let parsed = last_json_line(&done.stdout);
        if !done.status.success() {
            let said = parsed.map(|v| v.to_string()).unwrap_or_default();
            let why = format!(
                "llama.cpp driver failed ({}): {said} {}",
                done.status,
                tail(&done.stderr, 4)
            );
            return Ok(Err((done.status, why)));
        }
        Ok(Ok(parsed?))
    }
}
