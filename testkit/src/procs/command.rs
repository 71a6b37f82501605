//! The `kvfabric` binary of this build and how the harness starts it: a
//! clean environment, a log level, and the tail of a process log for
//! failure messages.

use std::path::PathBuf;
use std::process::Command;

/// The `kvfabric` binary of this build: `target/<profile>/kvfabric`, beside
/// the `deps/` folder that holds the running test executable (cargo builds a
/// package's binaries before its integration tests run).
pub fn kvfabric_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("kvfabric"))
        .expect("the test executable sits in target/<profile>/deps");
    assert!(
        bin.exists(),
        "{} not found: run the test through `cargo test` in the workspace root",
        bin.display()
    );
    bin
}

/// `kvfabric` with no `KVFABRIC_*` variable of the test's environment (a
/// child reads its settings from its flags only) and `KVFABRIC_LOG=log`.
pub fn kvfabric_command(log: &str) -> Command {
    let mut cmd = Command::new(kvfabric_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("KVFABRIC_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("KVFABRIC_LOG", log);
    cmd
}

/// The last 40 lines of a process log (for failure messages).
pub fn log_tail(path: &std::path::Path) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let tail: Vec<&str> = s.lines().rev().take(40).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// `--tls-cert/--tls-key/--tls-ca` for `name`'s files in `dir` (as
/// [`certs_init`] writes them).
pub fn tls_flags(dir: &std::path::Path, name: &str) -> Vec<String> {
    let p = |f: String| dir.join(f).display().to_string();
    vec![
        "--tls-cert".into(),
        p(format!("{name}.crt")),
        "--tls-key".into(),
        p(format!("{name}.key")),
        "--tls-ca".into(),
        p("ca.crt".into()),
    ]
}

/// The identity `name`'s files in `dir` (as [`certs_init`] writes them)
/// load to, in `authenticate` mode.
pub fn identity(
    dir: &std::path::Path,
    name: &str,
) -> std::sync::Arc<kvfabric_transfer::security::NodeIdentity> {
    use kvfabric_transfer::security::{NodeIdentity, SecurityMode};
    let read = |f: String| std::fs::read(dir.join(f)).expect("cert file");
    std::sync::Arc::new(
        NodeIdentity::from_pem(
            SecurityMode::Authenticate,
            read(format!("{name}.crt")),
            read(format!("{name}.key")),
            read("ca.crt".into()),
        )
        .expect("identity loads"),
    )
}

/// `kvfabric certs init DIR --nodes NODES`: a cluster CA and one certificate
/// per name, made by the CLI (what a user runs); panics with its stderr if it fails.
pub fn certs_init(dir: &std::path::Path, nodes: &str) {
    certs_init_with(dir, &["--nodes", nodes]);
}

/// `kvfabric certs init DIR ARGS..` (e.g. `--nodes a,b --tools ops --tenants
/// acme`); panics with its stderr if it fails.
pub fn certs_init_with(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new(kvfabric_bin())
        .args(["certs", "init", &dir.display().to_string()])
        .args(args)
        .output()
        .expect("run kvfabric certs init");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
