//! The vLLM connector (`kvfabric.vllm.KvfabricConnector`, issue 46) against
//! real vLLM CPU servers and a two-node kvfabric cluster of this build's
//! `kvfabric node`: tests/vllm/test_units.py checks the connector's two
//! sides against an embedded node, then tests/vllm/test_connector.py runs
//! the cases (reuse across vLLM processes, cache_salt and tenant isolation,
//! a corrupt block and a holder killed during a load both recomputed with
//! the same text).
//!
//! Needs the vLLM CPU venv with this workspace's wheel installed:
//! `$KVFABRIC_VLLM_PYTHON` (scripts/test.sh sets it: scripts/vllm-env.sh,
//! then scripts/python-build.sh into that venv). The model is
//! `$KVFABRIC_VLLM_MODEL`, else scripts/vllm-model.sh converts it (cached).
//! Skipped, saying so, only when `$KVFABRIC_VLLM_PYTHON` is unset.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The whole run: two vLLM starts (~1 min), a third for the tenant case, five cases.
const LIMIT: Duration = Duration::from_secs(600);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The HF model directory: `$KVFABRIC_VLLM_MODEL` or scripts/vllm-model.sh's.
fn model_dir(python: &Path) -> PathBuf {
    if let Some(dir) = std::env::var_os("KVFABRIC_VLLM_MODEL") {
        return PathBuf::from(dir);
    }
    let venv = python
        .parent()
        .and_then(Path::parent)
        .expect("KVFABRIC_VLLM_PYTHON is <venv>/bin/python");
    let out = Command::new("bash")
        .arg(repo().join("scripts/vllm-model.sh"))
        .env("KVFABRIC_VLLM_VENV", venv)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/vllm-model.sh");
    assert!(out.status.success(), "scripts/vllm-model.sh failed");
    let dir = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(
        dir.lines()
            .last()
            .expect("vllm-model.sh prints the directory")
            .trim(),
    )
}

#[test]
fn vllm_servers_share_prefixes_through_kvfabric_and_recompute_bad_loads() {
    let Some(python) = std::env::var_os("KVFABRIC_VLLM_PYTHON").map(PathBuf::from) else {
        eprintln!(
            "skipped: KVFABRIC_VLLM_PYTHON is unset (scripts/test.sh sets it to the vLLM venv \
             of scripts/vllm-env.sh, with this workspace's wheel installed by scripts/python-build.sh)"
        );
        return;
    };
    let probe = Command::new(&python)
        .args(["-c", "import vllm, kvfabric.vllm"])
        .output()
        .expect("run KVFABRIC_VLLM_PYTHON");
    assert!(
        probe.status.success(),
        "{} cannot import vllm and kvfabric.vllm (run scripts/vllm-env.sh, then \
         scripts/python-build.sh <that venv>): {}",
        python.display(),
        String::from_utf8_lossy(&probe.stderr)
    );
    // The connector's two sides against an embedded node (seconds).
    let units = Command::new(&python)
        .arg(repo().join("tests/vllm/test_units.py"))
        .status()
        .expect("run tests/vllm/test_units.py");
    assert!(units.success(), "tests/vllm/test_units.py failed");
    let model = model_dir(&python);
    let workdir = std::env::temp_dir().join(format!("kvfabric-vllm-{}", std::process::id()));
    let mut child = Command::new(&python)
        .arg(repo().join("tests/vllm/test_connector.py"))
        .arg("--kvfabric")
        .arg(env!("CARGO_BIN_EXE_kvfabric"))
        .arg("--model")
        .arg(&model)
        .arg("--python")
        .arg(&python)
        .arg("--workdir")
        .arg(&workdir)
        .spawn()
        .expect("start tests/vllm/test_connector.py");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for test_connector.py") {
            break status;
        }
        if started.elapsed() > LIMIT {
            // On SIGTERM it exits through its handler, which kills the
            // nodes and vLLM servers it started.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            std::thread::sleep(Duration::from_secs(10));
            let _ = child.kill();
            panic!(
                "test_connector.py ran past {LIMIT:?} (logs in {})",
                workdir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        status.success(),
        "test_connector.py failed ({status}); logs in {}",
        workdir.display()
    );
    let _ = std::fs::remove_dir_all(&workdir);
}
