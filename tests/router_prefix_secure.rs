//! The prefix router's KV event subscriptions in a secured cluster: with
//! `--tls-cert/--tls-key/--tls-ca` (`[cluster.security]`, loaded as
//! `kvfabric ctl` loads it) the router follows the prefill engine's secured
//! node and indexes the blocks it saves; without a certificate the node
//! refuses the subscription, and the router still serves (least-loaded
//! picks, no index).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvfabric_testkit::procs::{certs_init, http, log_tail, metric, tls_flags, EngineOptions};
use kvfabric_testkit::{free_port, EtcdProcess};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_kvfabric");

struct Router {
    addr: String,
    log: std::path::PathBuf,
    child: Child,
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn router(dir: &Path, name: &str, args: &[String]) -> Router {
    let addr = format!("127.0.0.1:{}", free_port());
    let log = dir.join(format!("{name}.log"));
    let child = Command::new(BIN)
        .args(["router", "--listen", &addr])
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start kvfabric router");
    Router { addr, log, child }
}

fn wait_for(what: &str, log: &Path, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "timed out: {what}\n{}",
            log_tail(log)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn prefix_subscriptions_present_the_clusters_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    certs_init(&certs, "pre,dec,router");
    let etcd = EtcdProcess::start().expect("etcd");
    let pre_grpc = format!("127.0.0.1:{}", free_port());
    let engine = |name: &str, role: &str, grpc: Option<&str>| {
        let mut a = vec![
            "--etcd".to_string(),
            etcd.endpoint(),
            "--role".into(),
            role.into(),
        ];
        a.extend(["--etcd-prefix".into(), "/sec-prefix".into()]);
        a.extend(["--transfer-transport".into(), "tcp".into()]);
        a.extend(tls_flags(&certs, name));
        let mut o = EngineOptions::new(name, dir.path()).args(&a);
        if let Some(g) = grpc {
            o = o.grpc_listen(g);
        }
        o.start()
    };
    let pre = engine("pre", "prefill", Some(&pre_grpc));
    let dec = engine("dec", "decode", None);
    let pre_url = format!("http://{}", pre.addr);
    let args = |tls: bool| {
        let mut a = vec![
            "--prefill".to_string(),
            pre_url.clone(),
            "--decode".into(),
            format!("http://{}", dec.addr),
            "--policy".into(),
            "prefix".into(),
            "--engine-nodes".into(),
            format!("{pre_url}={pre_grpc}"),
        ];
        if tls {
            a.extend(tls_flags(&certs, "router"));
        }
        a
    };
    let secured = router(dir.path(), "secured", &args(true));
    let plain = router(dir.path(), "plain", &args(false));
    wait_for("the secured router follows the node", &secured.log, || {
        metric(&secured.addr, "kvfabric_router_kv_event_streams") == 1.0
    });
    wait_for(
        "the router without a certificate is refused",
        &plain.log,
        || metric(&plain.addr, "kvfabric_router_kv_event_resyncs_total") >= 2.0,
    );
    assert_eq!(metric(&plain.addr, "kvfabric_router_kv_event_streams"), 0.0);

    let prompt = "Secured nodes tell a router what they hold. ".repeat(24);
    let body = json!({"model": "smollm2", "prompt": prompt, "max_tokens": 4, "temperature": 0});
    let (status, v) = http(&secured.addr, "POST", "/v1/completions", Some(&body)).unwrap();
    assert_eq!(status, 200, "{v}\n{}", log_tail(&secured.log));
    let blocks = v["usage"]["prompt_tokens"].as_u64().expect("usage") / 64;
    assert!(blocks >= 3, "{v}");
    wait_for("the saved blocks indexed over TLS", &secured.log, || {
        metric(&secured.addr, "kvfabric_router_kv_events_total") >= blocks as f64
    });
    assert_eq!(
        metric(&secured.addr, "kvfabric_router_prefix_picks_total"),
        1.0
    );
    // The same body through the router without a certificate: still served.
    let (status, w) = http(&plain.addr, "POST", "/v1/completions", Some(&body)).unwrap();
    assert_eq!(status, 200, "{w}\n{}", log_tail(&plain.log));
    assert_eq!(w["choices"][0]["text"], v["choices"][0]["text"]);
    assert_eq!(metric(&plain.addr, "kvfabric_router_kv_events_total"), 0.0);
}
