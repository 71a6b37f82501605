//! The `kvfabric` binary as a user runs it: help texts and config layering
//! (defaults < file < env < flags), in real child processes.

use std::process::Command;

fn kvfabric() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvfabric"));
    // Start from a clean environment for the variables under test.
    for (k, _) in std::env::vars() {
        if k.starts_with("KVFABRIC_") {
            c.env_remove(k);
        }
    }
    c
}

fn stdout(c: &mut Command) -> String {
    let out = c.output().expect("run kvfabric");
    assert!(
        out.status.success(),
        "kvfabric failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

#[test]
fn help_lists_subcommands_and_flags() {
    let top = stdout(kvfabric().arg("--help"));
    assert!(top.contains("model"), "{top}");
    assert!(top.contains("--config"), "{top}");
    let fetch = stdout(kvfabric().args(["model", "fetch", "--help"]));
    for flag in ["--cache-dir", "--python", "KVFABRIC_CACHE_DIR"] {
        assert!(
            fetch.contains(flag),
            "model fetch --help lacks {flag}: {fetch}"
        );
    }
}

#[test]
fn model_path_follows_file_env_flag_precedence() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("kv.toml");
    std::fs::write(&cfg, "[model]\ncache_dir = \"/from/file\"\n").unwrap();

    let p = stdout(kvfabric().args(["model", "path"]).env("HOME", "/home/u"));
    assert_eq!(
        p.trim(),
        "/home/u/.cache/kvfabric/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    );

    let p = stdout(kvfabric().arg("--config").arg(&cfg).args(["model", "path"]));
    assert!(p.starts_with("/from/file/"), "{p}");

    let p = stdout(
        kvfabric()
            .arg("--config")
            .arg(&cfg)
            .args(["model", "path"])
            .env("KVFABRIC_CACHE_DIR", "/from/env"),
    );
    assert!(p.starts_with("/from/env/"), "{p}");

    let p = stdout(
        kvfabric()
            .arg("--config")
            .arg(&cfg)
            .args(["model", "path", "--cache-dir", "/from/flag"])
            .env("KVFABRIC_CACHE_DIR", "/from/env"),
    );
    assert!(p.starts_with("/from/flag/"), "{p}");
}

#[test]
fn unknown_config_keys_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("kv.toml");
    std::fs::write(&cfg, "[model]\ncache_dri = \"/typo\"\n").unwrap();
    let out = kvfabric()
        .arg("--config")
        .arg(&cfg)
        .args(["model", "path"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cache_dri"), "{err}");
}
