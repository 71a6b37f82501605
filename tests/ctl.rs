//! `kvfabric ctl` against a real 2-node cluster (static peers, loopback):
//! status, watch, top, lookup of a token file, pin/unpin, evict, and its
//! errors. Every subcommand's `--json` parses and carries the fields its
//! table shows; the ratios keep one meaning each (lookup hit ratio of the
//! lookups a node answered, blocks served to peers, tier hits).

use std::process::Command;
use std::time::Duration;

use kvfabric_store::ModelFingerprint;
use kvfabric_testkit::free_port;
use kvfabric_testkit::procs::node::*;

fn ctl(addr: &str, args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvfabric"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVFABRIC_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .args(["ctl", "--addr", addr, "--timeout-ms", "3000"])
        .args(args)
        .output()
        .expect("run kvfabric ctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(addr: &str, args: &[&str]) -> String {
    let (success, out, err) = ctl(addr, args);
    assert!(success, "ctl {args:?} failed: {err}");
    out
}

/// `ctl <args> --json`, parsed (one object per line).
fn ok_json(addr: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let mut a = args.to_vec();
    a.push("--json");
    let out = ok(addr, &a);
    out.lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("ctl {args:?} --json: {e}: {l}"))
        })
        .collect()
}

/// Each column a table shows, and the JSON key that carries it: the
/// header must be in the table and the key in `obj`.
fn carries(table: &str, obj: &serde_json::Value, columns: &[(&str, &str)]) {
    for (header, key) in columns {
        assert!(table.contains(header), "table lacks {header:?}:\n{table}");
        assert!(
            obj.get(key).is_some(),
            "JSON lacks {key:?} (column {header:?}): {obj}"
        );
    }
}

const NODE_COLUMNS: &[(&str, &str)] = &[
    ("node", "node_id"),
    ("alive", "alive"),
    ("grpc", "grpc_addr"),
    ("lookup hit", "lookup_hit_ratio"),
    ("served", "served_blocks"),
];
const TIER_COLUMNS: &[(&str, &str)] = &[
    ("tier", "tier"),
    ("capacity", "capacity_bytes"),
    ("used", "used_bytes"),
    ("blocks", "blocks"),
    ("tier hits", "hits"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_status_lookup_pin_evict_watch() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<(u16, u16)> = (0..2).map(|_| (free_port(), free_port())).collect();
    let peers: Vec<String> = ["a", "b"]
        .iter()
        .zip(&ports)
        .map(|(id, (g, t))| format!("{id}=127.0.0.1:{g}=127.0.0.1:{t}"))
        .collect();
    let flags = vec!["--peers".to_string(), peers.join(",")];
    let a = NodeProc::start_on("a", dir.path(), &flags, false, ports[0].0, ports[0].1);
    let b = NodeProc::start_on("b", dir.path(), &flags, false, ports[1].0, ports[1].1);
    wait_members(&b, &["a", "b"], Duration::from_secs(15)).await;
    wait_members(&a, &["a", "b"], Duration::from_secs(15)).await;

    // A 6-block prompt, the first 4 blocks stored on A.
    let seed = 40;
    let ks = keys(seed, 6);
    put_all(&mut a.client().await, &ks[..4], false).await;
    let tokens: Vec<String> = (0..(6 * 16) as u32)
        .map(|t| t.wrapping_mul(31).wrapping_add(seed).to_string())
        .collect();
    let token_file = dir.path().join("prompt.tokens");
    std::fs::write(&token_file, tokens.join(" ")).unwrap();
    let fp: String = ModelFingerprint::new(&[7; 32], "llama")
        .0
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let tf = token_file.display().to_string();
    let sel = [
        "--tokens",
        tf.as_str(),
        "--model-fingerprint",
        fp.as_str(),
        "--namespace",
        "cluster-test",
        "--layers",
        "2",
        "--kv-heads",
        "2",
        "--head-dim",
        "16",
        "--dtype",
        "f16",
        "--block-tokens",
        "16",
    ];
    let addr = b.grpc.as_str();

    // B's client reads A's blocks: A serves them to its peer B.
    read_all_exact(&mut b.client().await, &ks[..4], &[&a, &b]).await;

    let status = ok_json(addr, &["status"]).remove(0);
    let nodes = status["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{status}");
    let node = |id: &str| nodes.iter().find(|n| n["node_id"] == id).unwrap().clone();
    let (node_a, node_b) = (node("a"), node("b"));
    assert_eq!(node_a["alive"], true);
    assert_eq!(node_a["tiers"][0]["tier"], "ram");
    assert_eq!(node_a["tiers"][0]["blocks"], 4);
    assert!(node_a["tiers"][0]["capacity_bytes"].as_u64().unwrap() >= 32 << 20);
    // Served to peers: the holder A, not the reader B.
    assert!(node_a["served_blocks"].as_u64().unwrap() >= 4, "{status}");
    assert_eq!(node_b["served_blocks"], 0, "{status}");
    assert!(
        node_a["tiers"][0]["hits"].as_u64().unwrap() >= 4,
        "{status}"
    );
    let table = ok(addr, &["status"]);
    carries(&table, &node_a, NODE_COLUMNS);
    carries(&table, &node_a["tiers"][0], TIER_COLUMNS);
    assert!(table.contains("ram"), "{table}");

    let lookup = |json: bool| {
        let mut args = vec!["lookup"];
        args.extend(sel);
        if json {
            args.push("--json");
        }
        ok(addr, &args)
    };
    let r: serde_json::Value = serde_json::from_str(&lookup(true)).unwrap();
    assert_eq!(r["blocks"], 6, "{r}");
    assert_eq!(r["cached_blocks"], 4, "{r}");
    assert_eq!(r["cached_tokens"], 64, "{r}");
    assert_eq!(r["tokens"], 96, "{r}");
    assert!(
        r["holders"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["node"] == "a"),
        "{r}"
    );
    let table = lookup(false);
    assert!(table.contains("cached: 64 of 96 tokens"), "{table}");
    carries(
        &table,
        &r["holders"][0],
        &[
            ("block", "block"),
            ("key", "key"),
            ("node", "node"),
            ("tier", "tier"),
            ("size", "size"),
        ],
    );
    // The lookups B answered: 4 of 6 blocks found (A answered none).
    let status = ok_json(addr, &["status"]).remove(0);
    let ratio = |id: &str| {
        status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["node_id"] == id)
            .unwrap()["lookup_hit_ratio"]
            .as_f64()
            .unwrap()
    };
    assert!((ratio("b") - 4.0 / 6.0).abs() < 1e-9, "{status}");
    assert_eq!(ratio("a"), 0.0, "{status}");

    let frames = ok_json(addr, &["top", "--count", "2", "--interval-ms", "100"]);
    assert_eq!(frames.len(), 2);
    let top_a = frames[1]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node_id"] == "a")
        .unwrap()
        .clone();
    let top = ok(addr, &["top", "--count", "2", "--interval-ms", "100"]);
    assert_eq!(top.matches("kvfabric top").count(), 2, "{top}");
    carries(
        &top,
        &top_a,
        &[
            ("node", "node_id"),
            ("alive", "alive"),
            ("lookup hit", "lookup_hit_ratio"),
            ("served", "served_blocks"),
            ("in GB/s", "in_gbps"),
            ("out GB/s", "out_gbps"),
        ],
    );
    carries(
        &top,
        &top_a["tiers"][0],
        &[
            ("tier", "tier"),
            ("used", "used_bytes"),
            ("used", "capacity_bytes"),
            ("blocks", "blocks"),
        ],
    );

    let mut args = vec!["pin"];
    args.extend(sel);
    assert!(
        ok(addr, &args).contains("pinned 4 "),
        "pin reaches the holder A"
    );
    assert_eq!(ok_json(addr, &args)[0]["pinned"], 4);
    let mut args = vec!["unpin"];
    args.extend(sel);
    assert_eq!(ok_json(addr, &args)[0]["unpinned"], 4);
    assert!(ok(addr, &args).contains("unpinned 0 "), "already unpinned");
    let mut args = vec!["evict"];
    args.extend(sel);
    let evicted = ok_json(addr, &args).remove(0);
    assert_eq!(evicted["evicted"], 4, "{evicted}");
    assert_eq!(evicted["blocks"], 6, "{evicted}");
    assert!(ok(addr, &args).contains("evicted 0 "), "already gone");
    let r: serde_json::Value = serde_json::from_str(&lookup(true)).unwrap();
    assert_eq!(r["cached_blocks"], 0, "evicted everywhere: {r}");

    let watch = ok(
        addr,
        &["watch", "--count", "2", "--interval-ms", "100", "--json"],
    );
    assert_eq!(watch.lines().count(), 2, "{watch}");
    for line in watch.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["nodes"].as_array().unwrap().len(), 2);
    }
    drop(a);
}

#[test]
fn ctl_errors_are_reported_not_panics() {
    let dead = format!("127.0.0.1:{}", free_port());
    let (success, _, err) = ctl(&dead, &["status"]);
    assert!(!success);
    assert!(err.contains("cannot reach a node"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let (success, _, err) = ctl(&dead, &["lookup", "--prompt", "hello"]);
    assert!(!success);
    assert!(!err.contains("panicked"), "{err}");
}

/// A node with a tenants file: ctl without a key is refused with the
/// reason, with a trusted tenant's `--api-key` it works.
#[test]
fn ctl_needs_an_api_key_on_a_node_with_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        format!(
            "[[tenants]]\nname = \"ops\"\ntrusted = true\napi_keys = [\"{}\"]\n",
            kvfabric_tenants::KeyHash::of("key-ops")
        ),
    )
    .unwrap();
    let flags = vec!["--tenants-file".to_string(), tenants.display().to_string()];
    let n = NodeProc::start("t", dir.path(), &flags, false);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !ctl(&n.grpc, &["--api-key", "key-ops", "status"]).0 {
        assert!(std::time::Instant::now() < deadline, "node never answered");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (success, _, err) = ctl(&n.grpc, &["status"]);
    assert!(!success, "status without a key succeeded");
    assert!(err.contains("Missing API key"), "{err}");
    let (success, _, err) = ctl(&n.grpc, &["--api-key", "wrong", "status"]);
    assert!(!success);
    assert!(err.contains("Incorrect API key"), "{err}");
    let out = ok(&n.grpc, &["--api-key", "key-ops", "status"]);
    assert!(out.contains('t'), "{out}");
}
