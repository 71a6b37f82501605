//! The `kvfabric` Python package (python/, PyO3 + maturin) against real,
//! secured `kvfabric node` processes with a tenants file: runs
//! python/tests/test_package.py with the interpreter in
//! `KVFABRIC_PACKAGE_PYTHON` (scripts/test.sh builds the wheel into it with
//! scripts/python-build.sh first). The Python side checks the key chain
//! against this one, a put on node a read through node b with every kind of
//! buffer, tenants apart, typed errors for bad input, refused callers and a
//! silent node.

use std::process::Command;
use std::time::Duration;

use kvfabric_tenants::KeyHash;
use kvfabric_testkit::procs::node::*;
use kvfabric_testkit::procs::{certs_init_with, tls_flags};
use kvfabric_testkit::EtcdProcess;

#[test]
fn python_package_against_secured_nodes() {
    let Ok(python) = std::env::var("KVFABRIC_PACKAGE_PYTHON") else {
        eprintln!("KVFABRIC_PACKAGE_PYTHON unset: skipped (scripts/test.sh sets it)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    certs_init_with(&certs, &["--nodes", "a,b", "--tenants", "acme,globex"]);
    let tenants = dir.path().join("tenants.toml");
    let t = |name: &str| {
        format!(
            "[[tenants]]\nname = \"{name}\"\napi_keys = [\"{}\"]\n",
            KeyHash::of(&format!("key-{name}"))
        )
    };
    std::fs::write(&tenants, [t("acme"), t("globex")].concat()).unwrap();
    let etcd = EtcdProcess::start().expect("etcd");
    let nodes: Vec<NodeProc> = ["a", "b"]
        .iter()
        .map(|id| {
            let mut f = vec![
                "--etcd".to_string(),
                etcd.endpoint(),
                "--etcd-prefix".into(),
                "/python".into(),
                "--tenants-file".into(),
                tenants.display().to_string(),
            ];
            f.extend(tls_flags(&certs, id));
            NodeProc::start(id, dir.path(), &f, false)
        })
        .collect();
    let expect: Vec<String> = keys(5, 3).iter().map(|k| k.to_hex()).collect();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/tests/test_package.py");
    let mut child = Command::new(&python)
        .arg(script)
        .env("KVF_NODE_A", &nodes[0].grpc)
        .env("KVF_NODE_B", &nodes[1].grpc)
        .env("KVF_CERTS", &certs)
        .env("KVF_EXPECT_KEYS", expect.join(","))
        .spawn()
        .expect("start python");
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait python") {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("python tests ran past 180 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.success(),
        "python/tests/test_package.py failed ({status}); node a's log:\n{}",
        nodes[0].log()
    );
}
