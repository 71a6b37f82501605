//! Clients of a secured cluster, end to end: certificates made by
//! `kvfabric certs init`, real etcd, real `kvfabric node` / `kvfabric engine`
//! processes in `authenticate` mode. `kvfabric ctl` works with a certificate
//! given as flags, env or config file, and without one fails at once naming
//! the missing settings (with one, against a plaintext node, the extra ones); an engine's remote connector reuses prefixes through
//! secured nodes bit-exact, and without a certificate says what is missing;
//! the router routes two hops between engines whose fabric nodes are secured.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use kvfabric_connector::{ConnectorConfig, RemoteConnector};
use kvfabric_node::cluster::client;
use kvfabric_testkit::fabric::*;
use kvfabric_testkit::free_port;
use kvfabric_testkit::procs::node::{alive, NodeProc};
use kvfabric_testkit::procs::{certs_init, identity};
use kvfabric_testkit::procs::{http, metric, tls_flags, EngineOptions};
use kvfabric_testkit::{eventually, EtcdProcess};
use kvfabric_transfer::security::NodeIdentity;

const BIN: &str = env!("CARGO_BIN_EXE_kvfabric");

/// Secured `kvfabric node`s `ids` on one etcd prefix (tcp transfers).
fn secured_nodes(etcd: &EtcdProcess, dir: &Path, certs: &Path, ids: &[&str]) -> Vec<NodeProc> {
    ids.iter()
        .map(|id| {
            let mut f = vec![
                "--etcd".into(),
                etcd.endpoint(),
                "--etcd-prefix".into(),
                "/sec-clients".into(),
                "--transfer-transport".into(),
                "tcp".into(),
            ];
            f.extend(tls_flags(certs, id));
            NodeProc::start(id, dir, &f, false)
        })
        .collect()
}

/// `kvfabric [pre..] ctl --addr ADDR <args>` with `env`, nothing else of
/// ours in the environment, killed after 30 s (so a hang shows as rc 124).
fn ctl(pre: &[String], addr: &str, args: &[String], env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.arg("30").arg(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("KVFABRIC_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)))
        .args(pre)
        .args(["ctl", "--addr", addr, "--timeout-ms", "3000"])
        .args(args)
        .output()
        .expect("run kvfabric ctl")
}

/// The node ids `ctl status --json` printed.
fn status_nodes(out: &Output) -> Vec<String> {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ctl status failed: {err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ctl status --json");
    let mut ids: Vec<String> = v["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["node_id"].as_str().unwrap_or("").to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_talks_to_a_secured_node_with_a_certificate_and_names_it_without() {
    let dir = tempfile::tempdir().unwrap();
    let (certs, rogue) = (dir.path().join("certs"), dir.path().join("rogue"));
    certs_init(&certs, "a,b,ops");
    certs_init(&rogue, "ops");
    let etcd = EtcdProcess::start().expect("etcd");
    let nodes = secured_nodes(&etcd, dir.path(), &certs, &["a", "b"]);
    let addr = nodes[0].grpc.clone();
    let status = |mut a: Vec<String>| {
        a.extend(["status".into(), "--json".into()]);
        a
    };
    let (ids, _) = eventually(
        "ctl with flags to list both nodes",
        Duration::from_secs(20),
        || async {
            let out = ctl(&[], &addr, &status(tls_flags(&certs, "ops")), &[]);
            let ids = out.status.success().then(|| status_nodes(&out))?;
            (ids.len() == 2).then_some(ids)
        },
    )
    .await;
    assert_eq!(ids, ["a", "b"]);

    // The same keys from the environment and from the config file.
    let f = |n: &str| certs.join(n).display().to_string();
    let env = [
        ("KVFABRIC_TLS_CERT", f("ops.crt")),
        ("KVFABRIC_TLS_KEY", f("ops.key")),
        ("KVFABRIC_TLS_CA", f("ca.crt")),
    ];
    assert_eq!(status_nodes(&ctl(&[], &addr, &status(vec![]), &env)), ids);
    let config = dir.path().join("ctl.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster.security]\ncert = {:?}\nkey = {:?}\nca = {:?}\n",
            f("ops.crt"),
            f("ops.key"),
            f("ca.crt")
        ),
    )
    .unwrap();
    let pre = ["--config".to_string(), config.display().to_string()];
    assert_eq!(status_nodes(&ctl(&pre, &addr, &status(vec![]), &[])), ids);

    // No certificate: refused at once, naming the settings.
    let out = ctl(&[], &addr, &status(vec![]), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "fails, does not hang: {err}");
    for want in [
        "requires mutual TLS",
        "--tls-cert",
        "KVFABRIC_TLS_CERT",
        "[cluster.security]",
    ] {
        assert!(err.contains(want), "error names {want:?}: {err}");
    }
    // Another CA's certificate: refused too (not told to add one).
    let out = ctl(&[], &addr, &status(tls_flags(&rogue, "ops")), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "fails, does not hang: {err}");
    assert!(!err.contains("requires mutual TLS"), "{err}");

    // A certificate given for a node in mode none: the extra setting is named.
    let plain = NodeProc::start("plain", dir.path(), &[], false);
    let _ = plain.client().await; // up
    let out = ctl(&[], &plain.grpc, &status(tls_flags(&certs, "ops")), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "fails, does not hang: {err}");
    assert!(
        err.contains("does not speak TLS") && err.contains("remove --tls-cert"),
        "{err}"
    );
    assert_eq!(
        status_nodes(&ctl(&[], &plain.grpc, &status(vec![]), &[])),
        ["plain"]
    );
    drop(nodes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_connectors_reuse_through_secured_nodes_and_say_when_they_lack_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    certs_init(&certs, "a,b,e1,e2,e3");
    let etcd = EtcdProcess::start().expect("etcd");
    let nodes = secured_nodes(&etcd, dir.path(), &certs, &["a", "b"]);
    let ops = identity(&certs, "e1");
    for n in &nodes {
        eventually(
            &format!("{} to see a and b", n.id),
            Duration::from_secs(20),
            || async {
                let mut c = client::connect_with(&n.grpc, Duration::from_secs(2), Some(&ops))
                    .await
                    .ok()?;
                (alive(&mut c).await == ["a", "b"]).then_some(())
            },
        )
        .await;
    }
    let remote = |addr: &str, id: Option<Arc<NodeIdentity>>| {
        let cfg = ConnectorConfig {
            mode: "remote".into(),
            ..ConnectorConfig::default()
        };
        Some(RemoteConnector::connect_fn(addr.to_string(), cfg, id))
    };
    let cfg = engine_config();
    let e1 = engine_with(remote(&nodes[0].grpc, Some(identity(&certs, "e1"))), &cfg);
    let e2 = engine_with(remote(&nodes[1].grpc, Some(identity(&certs, "e2"))), &cfg);
    let prompt = tokens(31, 320);
    let mut longer = prompt.clone();
    longer.extend(tokens(32, 20));
    let cold = generate(&e2.handle, &longer, 4, b"cold").await;
    assert_eq!(cold.usage.cached_tokens, 0);
    generate(&e1.handle, &prompt, 1, b"").await;
    let c1 = e1.connector.as_ref().expect("connector");
    assert!(
        c1.flush(Duration::from_secs(30)),
        "engine 1's saves finished"
    );
    assert_eq!(c1.stats().saved_blocks, 5, "saved over TLS to node a");
    let warm = generate(&e2.handle, &longer, 4, b"").await;
    assert_eq!(warm.usage.cached_tokens, 320, "loaded over TLS via node b");
    assert_eq!(warm.tokens, cold.tokens);
    for (w, c) in warm.logits.iter().zip(&cold.logits) {
        assert!(same_bits(w, c), "logits differ from the cold run");
    }
    drop((e1, e2));

    // `kvfabric engine --fabric remote`: the certificate comes from the same
    // `--tls-*` flags as a node's; without it the engine says what is missing.
    let engine = |name: &str, node: &NodeProc, tls: Vec<String>| {
        let mut a = vec!["--fabric".to_string(), "remote".into()];
        a.extend(["--fabric-node".into(), node.grpc.clone()]);
        a.extend(tls);
        EngineOptions::new(name, dir.path()).args(&a).start()
    };
    let bare = engine("bare", &nodes[0], vec![]);
    let secured = engine("e3", &nodes[0], tls_flags(&certs, "e3"));
    eventually(
        "the bare engine to log the missing certificate",
        Duration::from_secs(20),
        || async {
            let log = std::fs::read_to_string(dir.path().join("bare.log")).unwrap_or_default();
            (log.contains("requires mutual TLS") && log.contains("--tls-cert")).then_some(())
        },
    )
    .await;
    secured.complete(
        &"The quick brown fox jumps over the lazy dog. ".repeat(20),
        1,
    );
    eventually(
        "the secured engine's saves",
        Duration::from_secs(30),
        || async {
            (metric(&secured.addr, "kvfabric_connector_saved_blocks_total") >= 1.0).then_some(())
        },
    )
    .await;
    let log = std::fs::read_to_string(dir.path().join("e3.log")).unwrap_or_default();
    assert!(!log.contains("requires mutual TLS"), "{log}");
    drop((bare, secured, nodes));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_routes_two_hops_between_engines_of_a_secured_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    certs_init(&certs, "pre,dec");
    let etcd = EtcdProcess::start().expect("etcd");
    let engine = |name: &str, role: &str| {
        let mut a = vec![
            "--etcd".to_string(),
            etcd.endpoint(),
            "--role".into(),
            role.into(),
        ];
        a.extend(["--etcd-prefix".into(), "/sec-router".into()]);
        a.extend(["--transfer-transport".into(), "tcp".into()]);
        a.extend(tls_flags(&certs, name));
        EngineOptions::new(name, dir.path()).args(&a).start()
    };
    let (pre, dec) = (engine("pre", "prefill"), engine("dec", "decode"));
    let listen = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.path().join("router.log")).unwrap();
    let mut router = Command::new(BIN)
        .args(["router", "--listen", &listen])
        .args(["--prefill", &format!("http://{}", pre.addr)])
        .args(["--decode", &format!("http://{}", dec.addr)])
        .stderr(log)
        .spawn()
        .expect("start kvfabric router");
    let prompt = "Secured clusters route like any other. ".repeat(24);
    let body = serde_json::json!({
        "model": "smollm2", "prompt": prompt, "max_tokens": 8, "temperature": 0,
    });
    let (v, _) = eventually("the router to answer", Duration::from_secs(30), || async {
        match http(&listen, "POST", "/v1/completions", Some(&body)) {
            Ok((200, v)) => Some(v),
            _ => None,
        }
    })
    .await;
    let _ = router.kill();
    let _ = router.wait();
    let routed = v["choices"][0]["text"].as_str().expect("text").to_string();
    // A prefill-role engine answers one token: the routed answer's first.
    let (first, _) = pre.complete(&prompt, 8);
    assert!(
        routed.len() > first.len() && routed.starts_with(&first),
        "{routed:?} continues the prefill engine's {first:?}"
    );
    let loaded = metric(&dec.addr, "kvfabric_connector_loaded_blocks_total");
    assert!(
        loaded >= 1.0,
        "decode loaded the prefill engine's blocks over TLS: {loaded}"
    );
}
