//! Child processes of the peers: run one in a process group of its own
//! with a time limit, and read the one JSON line a driver prints.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

use super::workload::Rates;

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
pub(crate) fn tail(text: &str, n: usize) -> String {
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
