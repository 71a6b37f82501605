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

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};

/// Pinned llama-cpp-python (the version the reference figures used).
pub const LLAMA_CPP_PYTHON_VERSION: &str = "0.3.36";
/// Pinned PyPI gguf (the converter; same as the engine's oracle venv).
pub const GGUF_VERSION: &str = "0.19.0";

const VENV_SCRIPT: &str = include_str!("../../peers/llamacpp_venv.sh");
const BENCH_SCRIPT: &str = include_str!("../../peers/llamacpp_bench.py");
const F32_SCRIPT: &str = include_str!("../../peers/gguf_to_f32.py");

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

/// A finished child process: exit status and what it wrote.
pub(crate) struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// How a child's output is handled.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// Capture stdout and stderr (returned in [`Finished`]).
    Capture,
    /// Pass both through to our stderr (progress of a long build); stdout of
    /// the bench stays clean for `--json`.
    ToStderr,
}

/// Run `cmd` (in a process group of its own) with `stdin` fed to it, killing
/// the whole group when `timeout` passes. Errors only when it cannot start or
/// ran out of time; a non-zero exit is returned in [`Finished::status`].
pub(crate) fn run_child(
    mut cmd: Command,
    stdin: &[u8],
    output: Output,
    timeout: Duration,
) -> anyhow::Result<Finished> {
    cmd.process_group(0).stdin(Stdio::piped());
    match output {
        Output::Capture => {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        Output::ToStderr => {
            use std::os::fd::AsFd;
            let err = std::io::stderr().as_fd().try_clone_to_owned()?;
            cmd.stdout(Stdio::from(err)).stderr(Stdio::inherit());
        }
    }
    let program = format!("{:?}", cmd.get_program());
    let mut child = cmd.spawn().with_context(|| format!("starting {program}"))?;
    let mut input = child.stdin.take();
    let data = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        if let Some(pipe) = input.as_mut() {
            // A child that exits without reading is reported by its status.
            let _ = pipe.write_all(&data);
        }
    });
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                let mut bytes = Vec::new();
                let _ = p.read_to_end(&mut bytes);
                text = String::from_utf8_lossy(&bytes).into_owned();
            }
            text
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            // The child leads its own group: end it and whatever it started.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("{program} ran past its {}s limit", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = feeder.join();
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    Ok(Finished {
        status,
        stdout,
        stderr,
    })
}

/// The last `n` lines of `text`, for failure reasons.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// The last line of stdout parsed as JSON (the scripts print one line; any
/// chatter from libraries comes before it).
pub(crate) fn last_json_line(stdout: &str) -> anyhow::Result<Value> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or_else(|| anyhow::anyhow!("no output"))?;
    serde_json::from_str(line).with_context(|| format!("not JSON: {line}"))
}

/// The four rates from a driver's JSON line (an `{"error": ..}` line or a
/// missing/non-positive rate is an error naming the cause).
pub(crate) fn parse_rates(v: &Value) -> anyhow::Result<Rates> {
    if let Some(e) = v.get("error") {
        anyhow::bail!("driver reported: {e}");
    }
    let rate = |k: &str| -> anyhow::Result<f64> {
        let x = v
            .get(k)
            .and_then(Value::as_f64)
            .ok_or_else(|| anyhow::anyhow!("driver output lacks {k}"))?;
        anyhow::ensure!(x.is_finite() && x > 0.0, "driver gave {k} = {x}");
        Ok(x)
    };
    Ok(Rates {
        prefill512: rate("prefill512_tps")?,
        prefill2048: rate("prefill2048_tps")?,
        decode1: rate("decode1_tps")?,
        decode8: rate("decode8_tps")?,
    })
}

/// A built llama.cpp venv: its Python imports llama_cpp and gguf.
pub struct LlamaCppVenv {
    python: PathBuf,
    scripts: tempfile::TempDir,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_past_its_limit_is_killed_and_reported() {
        let mut cmd = Command::new("bash");
        cmd.args(["-c", "sleep 30 & sleep 30"]);
        let started = Instant::now();
        let err = run_child(cmd, b"", Output::Capture, Duration::from_millis(300))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("past its"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_child_gets_its_stdin_and_its_output_is_captured() {
        let mut cmd = Command::new("bash");
        cmd.args(["-c", "cat; echo oops >&2; exit 3"]);
        let done = run_child(
            cmd,
            b"{\"a\":1}\n",
            Output::Capture,
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(done.status.code(), Some(3));
        assert_eq!(last_json_line(&done.stdout).unwrap(), json!({"a": 1}));
        assert_eq!(done.stderr.trim(), "oops");
    }

    #[test]
    fn driver_output_parses_only_when_every_rate_is_positive() {
        let good = json!({"prefill512_tps": 1.0, "prefill2048_tps": 2.0,
                          "decode1_tps": 3.0, "decode8_tps": 4.0});
        let r = parse_rates(&good).unwrap();
        assert_eq!((r.prefill512, r.decode8), (1.0, 4.0));
        let mut missing = good.clone();
        missing.as_object_mut().unwrap().remove("decode8_tps");
        assert!(parse_rates(&missing).is_err());
        let mut zero = good.clone();
        zero["decode1_tps"] = json!(0.0);
        assert!(parse_rates(&zero).is_err());
        let err = parse_rates(&json!({"error": "llama_decode returned 1"})).unwrap_err();
        assert!(err.to_string().contains("llama_decode returned 1"));
        assert!(last_json_line("log line\nnot json").is_err());
        assert!(last_json_line("").is_err());
    }

    /// The smallest workload: one token everywhere.
    fn one_token_workload() -> PeerWorkload {
        PeerWorkload {
            threads: 1,
            repeats: 1,
            decode_steps: 1,
            prefill512: vec![1],
            prefill2048: vec![1],
            decode_prompts: vec![vec![1]],
        }
    }

    /// A driver that dies on a signal with extra buffer types is run again
    /// without them, and the report says so; one that fails without a
    /// signal is not retried.
    #[test]
    fn a_driver_crash_with_extra_buffer_types_is_retried_without_them() {
        let dir = tempfile::tempdir().unwrap();
        let python = dir.path().join("python");
        std::fs::write(
            &python,
            "#!/bin/bash\njob=$(cat)\n\
             case \"$job\" in *'\"use_extra_bufts\":true'*) kill -SEGV $$ ;; esac\n\
             [ -e \"$(dirname \"$0\")/fail\" ] && { echo '{\"error\":\"no\"}'; exit 2; }\n\
             echo '{\"prefill512_tps\":1,\"prefill2048_tps\":2,\"decode1_tps\":3,\"decode8_tps\":4,\"use_extra_bufts\":false}'\n",
        )
        .unwrap();
        std::fs::set_permissions(&python, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let venv = LlamaCppVenv {
            python,
            scripts: tempfile::tempdir().unwrap(),
        };
        let work = one_token_workload();
        let limits = PeerLimits {
            build: Duration::from_secs(10),
            run: Duration::from_secs(10),
        };
        let (rates, details) = venv.measure(Path::new("m.gguf"), &work, limits).unwrap();
        assert_eq!(rates.decode8, 4.0);
        assert_eq!(details["use_extra_bufts"], json!(false));
        let crash = details["extra_bufts_crash"].as_str().unwrap_or_default();
        assert!(crash.contains("SIGSEGV"), "{details}");
        std::fs::write(dir.path().join("fail"), "").unwrap();
        let err = venv
            .measure(Path::new("m.gguf"), &work, limits)
            .unwrap_err();
        assert!(err.to_string().contains("exit status: 2"), "{err}");
    }

    #[test]
    fn a_built_venv_is_reused_not_rebuilt() {
        let dir = default_venv();
        let marker = dir.join(".kvfabric-ready");
        let Ok(before) = std::fs::metadata(&marker).and_then(|m| m.modified()) else {
            eprintln!("skipping: no built llama.cpp venv at {}", dir.display());
            return;
        };
        // A rebuild takes minutes: the short limit makes one fail fast.
        let limits = PeerLimits {
            build: Duration::from_secs(60),
            run: Duration::from_secs(60),
        };
        let venv = LlamaCppVenv::ensure(&dir, limits).unwrap();
        let after = std::fs::metadata(&marker)
            .and_then(|m| m.modified())
            .unwrap();
        assert_eq!(before, after, "the venv was rebuilt");
        assert!(venv.scripts.path().join("llamacpp_bench.py").exists());
    }

    #[test]
    fn the_f32_conversion_is_made_once_and_recorded_with_its_sha256() {
        let dir = default_venv();
        let model = kvfabric_engine::model::reference_model_path();
        if !dir.join(".kvfabric-ready").exists() || !model.exists() {
            eprintln!("skipping: needs the built llama.cpp venv and the reference model");
            return;
        }
        let limits = PeerLimits {
            build: Duration::from_secs(60),
            run: Duration::from_secs(300),
        };
        let venv = LlamaCppVenv::ensure(&dir, limits).unwrap();
        let (path, _) = venv.f32_model(&model, limits).unwrap();
        let (again, record) = venv.f32_model(&model, limits).unwrap();
        assert_eq!(path, again);
        assert_eq!(record["converted"], json!(false), "{record}");
        let sidecar = std::fs::read_to_string(format!("{}.sha256", path.display())).unwrap();
        let sidecar: Value = serde_json::from_str(&sidecar).unwrap();
        assert_eq!(sidecar["sha256"], record["sha256"]);
        assert_eq!(record["sha256"].as_str().map(str::len), Some(64));
        // F32 weights: several times the packed Q4_1 file.
        let (f32_len, q_len) = (
            std::fs::metadata(&path).unwrap().len(),
            std::fs::metadata(&model).unwrap().len(),
        );
        assert!(f32_len > 4 * q_len, "{f32_len} vs {q_len}");
    }

    #[test]
    fn a_venv_that_cannot_be_built_is_a_reason_not_a_failure() {
        // A venv path under a regular file can never be created: no network needed.
        let file = tempfile::NamedTempFile::new().unwrap();
        let venv = file.path().join("venv");
        let limits = PeerLimits {
            build: Duration::from_secs(120),
            run: Duration::from_secs(60),
        };
        let work = one_token_workload();
        let (native, f32) = llamacpp(&venv, Path::new("/nonexistent.gguf"), &work, limits);
        for outcome in [native, f32] {
            match outcome {
                PeerOutcome::Unavailable(why) => assert!(why.contains("venv"), "{why}"),
                PeerOutcome::Measured { .. } => panic!("measured without a venv"),
            }
        }
    }
}
