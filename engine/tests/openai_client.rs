//! The engine (real scheduler and reference model) driven by the official
//! `openai` Python client: logprobs top == greedy, `n: 4` from one prefill
//! (metrics), a two-turn tool call streamed and not, `json_schema` answers
//! that validate in 20 of 20 sampled runs (and streamed with `n: 3`),
//! `json_object` answers that parse, `tool_choice: required` arguments that
//! validate against the function's schema, a bad schema refused with a 400,
//! and an unsupported parameter refused by name. The client lives in the venv that
//! scripts/install-deps.sh makes (`$KVFABRIC_OPENAI_PYTHON`, default
//! `~/.cache/kvfabric/openai-venv/bin/python`); the checks are in
//! tests/python/openai_client.py.

use std::path::PathBuf;

fn python() -> PathBuf {
    let p = std::env::var_os("KVFABRIC_OPENAI_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache/kvfabric/openai-venv/bin/python")
        });
    assert!(
        p.exists(),
        "the openai client venv is missing at {}: run scripts/install-deps.sh",
        p.display()
    );
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_client_works_end_to_end() {
    let python = python();
    let server = kvfabric_testkit::engine::server::real_server().await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/openai_client.py");
    let base = format!("http://{}", server.addr);
    let out = tokio::process::Command::new(python)
        .arg(script)
        .arg(&base)
        .arg(kvfabric_testkit::engine::server::MODEL_NAME)
        .output()
        .await
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count(),
        9,
        "{stdout}"
    );
}
