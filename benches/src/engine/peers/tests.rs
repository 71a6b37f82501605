//! The child runner's time limit and the drivers' JSON parsing.

use super::child::{last_json_line, parse_rates, run_child, Output};
use super::*;
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

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
    std::fs::set_permissions(&python, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
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
