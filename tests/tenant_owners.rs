//! Owners of the blocks engines save: real `kvfabric engine`
//! processes whose tenants send prompts through the OpenAI API.
//!
//! * Embedded node: the blocks an engine saves count to the request's
//!   tenant in its node's tier shares (`kvfabric_tenant_tier_bytes`), and a
//!   tenant filling the RAM tier loses its own blocks, not another tenant's
//!   under its share: that tenant's prompt is still served whole from the
//!   fabric.
//! * Remote connector: an engine with `[connector] node_api_key` (a trusted
//!   tenant's key) saves into a `kvfabric node` with a tenants file, each
//!   block counted to the request's tenant; without a key, or with one the
//!   node does not know, the connector's error names the setting.

use std::path::Path;
use std::time::{Duration, Instant};

use kvfabric_connector::{ApiKey, ConnectorConfig, ConnectorError, RemoteConnector};
use kvfabric_tenants::KeyHash;
use kvfabric_testkit::metrics::metric_sum;
use kvfabric_testkit::procs::*;
use kvfabric_testkit::{eventually, free_port};
use serde_json::json;

const PROMPT: &str = "You are the build assistant of a large monorepo. The repository has \
services written in Rust and Go, a web front end in TypeScript, and infrastructure as \
Terraform modules. Before answering, read the relevant files, list the commands you \
would run, explain the risks of each change and how to roll it back. Keep answers short, \
cite file paths, never guess at the contents of a file you have not read, and say when \
you are unsure. The user's question follows after the line of dashes. ----------- ";

/// Tenants a and b (API users) and `engines` (trusted: remote connectors).
fn write_tenants(path: &Path) {
    let mut text = String::new();
    for (tenant, key) in [("a", "key-a"), ("b", "key-b")] {
        text.push_str(&format!(
            "[[tenants]]\nname = \"{tenant}\"\napi_keys = [\"{}\"]\n",
            KeyHash::of(key)
        ));
    }
    text.push_str(&format!(
        "[[tenants]]\nname = \"engines\"\ntrusted = true\napi_keys = [\"{}\"]\n",
        KeyHash::of("key-engines")
    ));
    std::fs::write(path, text).expect("tenants file");
}

/// Greedy one-token completion as `key`: (cached_tokens, prompt_tokens).
fn complete(e: &EngineProc, key: &str, prompt: &str) -> (u64, u64) {
    let body = json!({"model": "smollm2", "prompt": prompt, "max_tokens": 1, "temperature": 0});
    let (status, v) = http_with_key(&e.addr, "POST", "/v1/completions", Some(&body), Some(key))
        .unwrap_or_else(|err| panic!("engine {}: {err}\n{}", e.name, e.log()));
    assert_eq!(status, 200, "{v}\n{}", e.log());
    let usage = &v["usage"];
    (
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        usage["prompt_tokens"].as_u64().unwrap_or(0),
    )
}

/// Wait until `e` has finished `n` saves (stored or not).
fn wait_saves(e: &EngineProc, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let done = |m: &str| metric(&e.addr, m);
    while done("kvfabric_connector_saved_blocks_total")
        + done("kvfabric_connector_save_failed_blocks_total")
        + done("kvfabric_connector_save_skipped_blocks_total")
        < n
    {
        assert!(Instant::now() < deadline, "saves never ended\n{}", e.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `tenant`'s bytes in the RAM tier of the node whose HTTP is `http`.
fn ram_bytes(http: &str, tenant: &str) -> f64 {
    let text = get_ok_as(http, "/metrics", Some("key-engines")).expect("node metrics");
    metric_sum(
        &text,
        "kvfabric_tenant_tier_bytes",
        &[("tenant", tenant), ("tier", "Ram")],
    )
}

#[test]
fn engine_saved_blocks_count_to_their_tenant_and_keep_its_share() {
    let dir = tempfile::tempdir().expect("dir");
    let tenants = dir.path().join("tenants.toml");
    write_tenants(&tenants);
    // LRU: without owners, the oldest blocks (b's) would go first.
    let config = dir.path().join("kv.toml");
    std::fs::write(&config, "[node]\neviction = \"lru\"\n").expect("config");
    let node_http = format!("127.0.0.1:{}", free_port());
    // A 24 MiB RAM tier holds 17 blocks of the reference model (1.4 MiB);
    // three owners (a, b, engines) split it: 8 MiB each, 5 blocks.
    let e = EngineOptions::new("e", dir.path())
        .config(&config)
        .node_http(&node_http)
        .memory("128MiB", "24MiB")
        .args(&[
            "--prefix-cache",
            "false",
            "--tenants-file",
            &tenants.display().to_string(),
        ])
        .start();

    // b: one prompt of 5 full blocks.
    let b_prompt = PROMPT.repeat(3);
    let (cached, prompt_tokens) = complete(&e, "key-b", &b_prompt);
    assert_eq!(cached, 0);
    let b_blocks = prompt_tokens / 64;
    // A prompt's last token is always computed: blocks before it are reused.
    let b_reusable = (prompt_tokens - 1) / 64;
    assert!(b_blocks >= 4, "b's prompt spans {prompt_tokens} tokens");
    wait_saves(&e, b_blocks as f64);
    let b_bytes = ram_bytes(&node_http, "b");
    assert!(
        b_bytes >= (b_blocks * 1_400_000) as f64,
        "b's saved blocks are not counted to b: {b_bytes} bytes\n{}",
        e.log()
    );
    assert_eq!(ram_bytes(&node_http, "default"), 0.0, "saved unowned");

    // a: six prompts of 5 blocks, about twice the tier.
    let mut saves = b_blocks;
    for i in 0..6 {
        let (_, tokens) = complete(&e, "key-a", &format!("Session {i}. {b_prompt}"));
        saves += tokens / 64;
        wait_saves(&e, saves as f64);
    }
    assert!(ram_bytes(&node_http, "a") > 0.0);
    assert_eq!(
        ram_bytes(&node_http, "b"),
        b_bytes,
        "b (under its share) lost blocks to a\n{}",
        e.log()
    );
    // b's prompt is still served whole from the fabric.
    let (cached, _) = complete(&e, "key-b", &b_prompt);
    assert_eq!(
        cached,
        b_reusable * 64,
        "b's prefix was evicted\n{}",
        e.log()
    );
}

/// An engine in remote mode on `node`, with `node_api_key` = `key`.
fn remote_engine(
    name: &str,
    dir: &Path,
    node: &NodeProc,
    tenants: &Path,
    key: Option<&str>,
) -> EngineProc {
    let config = dir.join(format!("{name}.toml"));
    let text = key.map_or(String::new(), |k| {
        format!("[connector]\nnode_api_key = \"{k}\"\n")
    });
    std::fs::write(&config, text).expect("config");
    EngineOptions::new(name, dir)
        .config(&config)
        .args(&[
            "--fabric",
            "remote",
            "--fabric-node",
            &node.grpc,
            "--tenants-file",
            &tenants.display().to_string(),
        ])
        .start()
}

/// Wait until `name`'s log says `what` (all of its parts).
async fn log_says(dir: &Path, name: &str, what: &[&str]) {
    let path = dir.join(format!("{name}.log"));
    eventually(
        &format!("{name} to log {what:?}"),
        Duration::from_secs(20),
        || async {
            let log = std::fs::read_to_string(&path).unwrap_or_default();
            what.iter().all(|w| log.contains(w)).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_connectors_send_their_key_and_their_tenants_own_the_blocks() {
    let dir = tempfile::tempdir().expect("dir");
    let tenants = dir.path().join("tenants.toml");
    write_tenants(&tenants);
    let flags = vec!["--tenants-file".to_string(), tenants.display().to_string()];
    let node = NodeProc::start("n", dir.path(), &flags, false);

    // The typed error, from the check an engine runs at start.
    let check = |key: Option<&str>| {
        let cfg = ConnectorConfig {
            node_api_key: key.map(ApiKey::new),
            ..ConnectorConfig::default()
        };
        let addr = node.grpc.clone();
        async move { RemoteConnector::check_node(&addr, &cfg, None).await }
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let id = loop {
        match check(Some("key-engines")).await {
            Ok(id) => break id,
            Err(e) if Instant::now() > deadline => panic!("{e}\n{}", node.log()),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert_eq!(id, "n");
    for (key, sent) in [(None, "no API key"), (Some("key-x"), "does not know")] {
        match check(key).await {
            Err(e @ ConnectorError::NodeApiKey { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(sent), "{msg}");
                assert!(msg.contains("[connector] node_api_key"), "{msg}");
                assert!(msg.contains("KVFABRIC_NODE_API_KEY"), "{msg}");
            }
            other => panic!("key {key:?}: {other:?}"),
        }
    }

    // With the key: a's and b's saved blocks count to a and b on the node.
    let e = remote_engine("e", dir.path(), &node, &tenants, Some("key-engines"));
    let prompt = PROMPT.repeat(3);
    let (_, tokens) = complete(&e, "key-a", &prompt);
    let (a_blocks, a_reusable) = (tokens / 64, (tokens - 1) / 64);
    wait_saves(&e, a_blocks as f64);
    let (_, tokens) = complete(&e, "key-b", &format!("Another user. {prompt}"));
    wait_saves(&e, (a_blocks + tokens / 64) as f64);
    assert_eq!(
        metric(&e.addr, "kvfabric_connector_save_failed_blocks_total"),
        0.0,
        "{}",
        e.log()
    );
    for t in ["a", "b"] {
        let bytes = ram_bytes(&node.http, t);
        assert!(
            bytes >= (4 * 1_400_000) as f64,
            "{t}: {bytes}\n{}",
            node.log()
        );
    }
    assert_eq!(
        ram_bytes(&node.http, "engines"),
        0.0,
        "counted to the engine's key"
    );
    // ... and reuse through the node works with the key.
    let (cached, _) = complete(&e, "key-a", &prompt);
    assert_eq!(cached, a_reusable * 64, "{}", e.log());
    drop(e);

    // Without a key, or with a wrong one: the engine says which setting.
    let bare = remote_engine("bare", dir.path(), &node, &tenants, None);
    let wrong = remote_engine("wrong", dir.path(), &node, &tenants, Some("key-x"));
    let setting = ["node_api_key", "KVFABRIC_NODE_API_KEY"];
    log_says(
        dir.path(),
        "bare",
        &[&["no API key"][..], &setting].concat(),
    )
    .await;
    log_says(
        dir.path(),
        "wrong",
        &[&["does not know"][..], &setting].concat(),
    )
    .await;
    // Its saves fail (counted), and say why too.
    complete(&bare, "key-a", &format!("Third user. {prompt}"));
    wait_saves(&bare, 4.0);
    assert!(metric(&bare.addr, "kvfabric_connector_save_failed_blocks_total") >= 4.0);
    drop((bare, wrong, node));
}
