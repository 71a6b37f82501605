//! `kvfabric ctl` against a real 2-node cluster (static peers, loopback):
//! status, watch, top, lookup of a token file, capacity (the planner's
//! curve after real load), pin/unpin, evict, and its errors. Every subcommand's `--json` parses and carries the fields its
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

/// Two nodes with static peers, the planner sampling every key (so a few
/// hundred lookups make a curve), and a token file whose first 4 of 6
/// blocks are stored on A.
struct Cluster {
    dir: tempfile::TempDir,
    a: NodeProc,
    b: NodeProc,
    ks: Vec<kvfabric_store::BlockKey>,
    token_file: String,
    fingerprint: String,
}

impl Cluster {
    async fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("node.toml");
        std::fs::write(&config, "[node]\nplanner_sample_rate = 1.0\n").unwrap();
        let ports: Vec<(u16, u16)> = (0..2).map(|_| (free_port(), free_port())).collect();
        let peers: Vec<String> = ["a", "b"]
            .iter()
            .zip(&ports)
            .map(|(id, (g, t))| format!("{id}=127.0.0.1:{g}=127.0.0.1:{t}"))
            .collect();
        let flags = vec![
            "--peers".to_string(),
            peers.join(","),
            "--config".to_string(),
            config.display().to_string(),
        ];
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
        let fingerprint: String = ModelFingerprint::new(&[7; 32], "llama")
            .0
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Cluster {
            token_file: token_file.display().to_string(),
            dir,
            a,
            b,
            ks,
            fingerprint,
        }
    }

    /// The flags that pick the token file's blocks.
    fn sel(&self) -> Vec<&str> {
        vec![
            "--tokens",
            self.token_file.as_str(),
            "--model-fingerprint",
            self.fingerprint.as_str(),
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
        ]
    }

    /// `ctl <verb> <selection> [--json]` against B.
    fn on_blocks(&self, verb: &str, json: bool) -> String {
        let mut args = vec![verb];
        args.extend(self.sel());
        if json {
            args.push("--json");
        }
        ok(&self.b.grpc, &args)
    }
}

/// The lookup hit ratio `ctl status --json` shows for node `id`.
fn lookup_ratio(status: &serde_json::Value, id: &str) -> f64 {
    status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node_id"] == id)
        .unwrap()["lookup_hit_ratio"]
        .as_f64()
        .unwrap()
}

/// B's client reads A's blocks: `status` shows them served by the holder A
/// (not the reader B) and as tier hits on A; the table has every column.
async fn step_status_served_and_tier_hits(c: &Cluster) {
    read_all_exact(&mut c.b.client().await, &c.ks[..4], &[&c.a, &c.b]).await;
    let addr = c.b.grpc.as_str();
    let status = ok_json(addr, &["status"]).remove(0);
    let nodes = status["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{status}");
    let node = |id: &str| nodes.iter().find(|n| n["node_id"] == id).unwrap().clone();
    let (node_a, node_b) = (node("a"), node("b"));
    assert_eq!(node_a["alive"], true);
    assert_eq!(node_a["tiers"][0]["tier"], "ram");
    assert_eq!(node_a["tiers"][0]["blocks"], 4);
    assert!(node_a["tiers"][0]["capacity_bytes"].as_u64().unwrap() >= 32 << 20);
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
}

/// `lookup` of the token file: 4 of 6 blocks (64 of 96 tokens) cached, all
/// on A; afterwards B's lookup hit ratio is 4/6 and A answered none.
fn step_lookup_a_token_file(c: &Cluster) {
    let r: serde_json::Value = serde_json::from_str(&c.on_blocks("lookup", true)).unwrap();
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
    let table = c.on_blocks("lookup", false);
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
    let status = ok_json(&c.b.grpc, &["status"]).remove(0);
    assert!(
        (lookup_ratio(&status, "b") - 4.0 / 6.0).abs() < 1e-9,
        "{status}"
    );
    assert_eq!(lookup_ratio(&status, "a"), 0.0, "{status}");
}

/// `top`: one frame per refresh, as JSON and as a table with every column.
fn step_top(c: &Cluster) {
    let addr = c.b.grpc.as_str();
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
}

/// `capacity` on a node that answered no lookups says it has too few
/// samples; on B after a few hundred lookups of blocks it holds, both the
/// table and `--json` show the RAM curve (8 points, the current capacity
/// marked), most of those lookups hits at 4x.
async fn step_capacity(c: &Cluster) {
    let idle = ok_json(&c.a.grpc, &["capacity"]).remove(0);
    let min = idle["min_samples"].as_u64().unwrap();
    assert!(min > 0, "{idle}");
    let table = ok(&c.a.grpc, &["capacity"]);
    let few = format!(
        "too few samples: {} of {min} needed",
        idle["sampled_lookups"]
    );
    assert!(table.contains(&few), "{table}");

    // Load on B: 32 blocks stored there, the chain looked up 12 times.
    let ks = keys(77, 32);
    let mut client = c.b.client().await;
    put_all(&mut client, &ks, false).await;
    for _ in 0..12 {
        assert_eq!(lookup(&mut client, &ks).await.0, 32);
    }
    let r = ok_json(&c.b.grpc, &["capacity"]).remove(0);
    assert!(r["sampled_lookups"].as_u64() >= Some(min), "{r}");
    assert_eq!(r["sample_rate"], 1.0, "{r}");
    assert_eq!(r["dropped_samples"], 0, "{r}");
    let ram = &r["tiers"][0];
    assert_eq!(ram["tier"], "ram", "{r}");
    assert_eq!(ram["capacity_bytes"], 32 << 20, "{r}");
    let points = ram["points"].as_array().unwrap();
    assert_eq!(points.len(), 8, "{r}");
    let at = |scale: f64| {
        points.iter().find(|p| p["scale"] == scale).unwrap()["token_hit_ratio"]
            .as_f64()
            .unwrap()
    };
    assert!(at(4.0) > 0.5 && at(4.0) <= 1.0, "{r}");
    let table = ok(&c.b.grpc, &["capacity"]);
    assert!(!table.contains("too few samples"), "{table}");
    assert!(
        table.contains(&format!("{} lookups", r["lookups"])),
        "{table}"
    );
    carries(
        &table,
        ram,
        &[
            ("tier", "tier"),
            ("policy", "policy"),
            ("capacity", "capacity_bytes"),
        ],
    );
    carries(
        &table,
        &points[0],
        &[("scale", "scale"), ("hit ratio", "token_hit_ratio")],
    );
    let now = table.lines().find(|l| l.ends_with("<- now")).unwrap();
    assert!(
        now.contains("1x") && now.contains(&format!("{:.3}", at(1.0))),
        "{table}"
    );
}

/// `pin`, `unpin` and `evict` reach the holder A; counts as JSON and text.
fn step_pin_unpin_evict(c: &Cluster) {
    assert!(
        c.on_blocks("pin", false).contains("pinned 4 "),
        "pin reaches the holder A"
    );
    let one = |verb: &str| -> serde_json::Value {
        serde_json::from_str(c.on_blocks(verb, true).trim()).unwrap()
    };
    assert_eq!(one("pin")["pinned"], 4);
    assert_eq!(one("unpin")["unpinned"], 4);
    assert!(
        c.on_blocks("unpin", false).contains("unpinned 0 "),
        "already unpinned"
    );
    let evicted = one("evict");
    assert_eq!(evicted["evicted"], 4, "{evicted}");
    assert_eq!(evicted["blocks"], 6, "{evicted}");
    assert!(
        c.on_blocks("evict", false).contains("evicted 0 "),
        "already gone"
    );
    let r = one("lookup");
    assert_eq!(r["cached_blocks"], 0, "evicted everywhere: {r}");
}

/// `watch --json`: one line per refresh, each with both nodes.
fn step_watch(c: &Cluster) {
    let watch = ok(
        &c.b.grpc,
        &["watch", "--count", "2", "--interval-ms", "100", "--json"],
    );
    assert_eq!(watch.lines().count(), 2, "{watch}");
    for line in watch.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["nodes"].as_array().unwrap().len(), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_status_lookup_capacity_pin_evict_watch() {
    let c = Cluster::start().await;
    step_status_served_and_tier_hits(&c).await;
    step_lookup_a_token_file(&c);
    step_top(&c);
    step_capacity(&c).await;
    step_pin_unpin_evict(&c);
    step_watch(&c);
    assert!(c.dir.path().exists());
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
