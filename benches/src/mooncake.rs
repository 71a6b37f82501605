//! Mooncake as a peer of `bench transfer`, `bench store` and `bench cluster`:
//! its CPU build from PyPI (`mooncake-transfer-engine-non-cuda`), in a venv
//! that `scripts/mooncake-env.sh` builds once under ~/.cache/kvfabric.
//!
//! - [`te`]: its Transfer Engine over TCP (`transfer_engine_bench`, target and
//!   initiator on loopback, metadata on an etcd of the run's own), swept over
//!   threads, batch and block size, READ and WRITE at the best configuration.
//! - [`store`]: Mooncake Store (`mooncake_master` and two clients running
//!   `benches/peers/mooncake_store.py`): put, local get, remote get and the
//!   latency of a single-block remote get.
//!
//! Every address a Mooncake process is given is 127.0.0.1 (its tools default
//! to a private-range metadata address), checked before it starts, and every
//! TCP connection its processes hold while measured is checked to be on
//! loopback ([`procs`]). When the venv cannot be had, a bench reports
//! `mooncake: {status: "unavailable", reason}` and the rest of its figures.

pub(crate) mod procs;
pub(crate) mod store;
pub(crate) mod te;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

/// The venv script, shipped in the binary (run with `bash -c`).
const ENV_SCRIPT: &str = include_str!("../../scripts/mooncake-env.sh");

/// The variable naming a venv to use as it is (the bench installs nothing then).
pub const VENV_VAR: &str = "KVFABRIC_MOONCAKE_VENV";

/// Longest the bench waits for the venv's install.
const INSTALL_LIMIT: Duration = Duration::from_secs(600);

/// A Mooncake venv with its tools.
#[derive(Clone, Debug)]
pub(crate) struct Venv {
    pub(crate) dir: PathBuf,
}

impl Venv {
    pub(crate) fn bin(&self, tool: &str) -> PathBuf {
        self.dir.join("bin").join(tool)
    }

    /// The venv: the one `KVFABRIC_MOONCAKE_VENV` names, taken as it is, or
    /// else the default one, installed by the script if it is not yet.
    /// Err: why there is none (the bench reports it and goes on).
    pub(crate) fn locate() -> Result<Venv, String> {
        match std::env::var_os(VENV_VAR) {
            Some(dir) => Venv::at(PathBuf::from(dir)),
            None => Venv::install(),
        }
    }

    /// The venv at `dir` if it has Mooncake's tools; no install.
    pub(crate) fn at(dir: PathBuf) -> Result<Venv, String> {
        let venv = Venv { dir };
        for tool in ["python", "transfer_engine_bench", "mooncake_master"] {
            if !venv.bin(tool).is_file() {
                return Err(format!(
                    "no Mooncake venv at {} ({VENV_VAR}): {} missing; build one with \
                     `{VENV_VAR}={} scripts/mooncake-env.sh`",
                    venv.dir.display(),
                    venv.bin(tool).display(),
                    venv.dir.display()
                ));
            }
        }
        Ok(venv)
    }

    /// Run the venv script (idempotent: a quick check once installed).
    fn install() -> Result<Venv, String> {
        let mut cmd = Command::new("timeout");
        cmd.arg(INSTALL_LIMIT.as_secs().to_string())
            .args(["bash", "-c", ENV_SCRIPT, "mooncake-env.sh"])
            .env_remove(VENV_VAR);
        let out = cmd
            .output()
            .map_err(|e| format!("running scripts/mooncake-env.sh: {e}"))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(format!(
                "scripts/mooncake-env.sh failed ({}): {}",
                out.status,
                procs::tail(&err, 4)
            ));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let dir = stdout
            .lines()
            .last()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .ok_or("scripts/mooncake-env.sh printed no venv path")?;
        Venv::at(PathBuf::from(dir))
    }
}

/// The report of a peer that could not be measured.
pub(crate) fn unavailable(reason: impl std::fmt::Display) -> Value {
    json!({ "status": "unavailable", "reason": reason.to_string() })
}

/// `ours / theirs` when both were measured, else null.
pub(crate) fn ratio(ours: Option<f64>, theirs: Option<f64>) -> Value {
    match (ours, theirs) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() => json!(a / b),
        _ => Value::Null,
    }
}

/// Parse `X` out of `... throughput X GB/s` (transfer_engine_bench's last line).
pub(crate) fn parse_te_throughput(log: &str) -> Option<f64> {
    let line = log.lines().rev().find(|l| l.contains("Test completed"))?;
    let after = line.split("throughput").nth(1)?;
    after.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_venv_without_tools_is_unavailable() {
        let err = Venv::at(PathBuf::from("/nonexistent/kvfabric-mooncake-venv")).unwrap_err();
        assert!(err.contains("no Mooncake venv"), "{err}");
        let v = unavailable(&err);
        assert_eq!(v["status"], "unavailable");
    }

    #[test]
    fn te_throughput_parses() {
        let log =
            "I1206 x] Worker 0 stopped!\nI1206 transfer_engine_bench.cpp:569] Test completed: \
                   duration 2.00, batch count 1433, throughput 0.7501 GB/s\n";
        assert_eq!(parse_te_throughput(log), Some(0.7501));
        assert_eq!(parse_te_throughput("no result"), None);
    }

    #[test]
    fn ratios_need_both_figures() {
        assert_eq!(ratio(Some(3.0), Some(1.5)), json!(2.0));
        assert_eq!(ratio(Some(3.0), None), Value::Null);
        assert_eq!(ratio(Some(3.0), Some(0.0)), Value::Null);
    }
}
