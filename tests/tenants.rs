//! Tenant isolation across real `kvfabric engine` processes on a real etcd
//! (each engine embeds a fabric node; no local prefix cache, so every reuse
//! goes through the fabric): tenant B sending tenant A's exact prompt gets
//! `cached_tokens` 0 and its engine reads no block, while A on the same
//! engine does get A's blocks; members of a shared namespace hit each
//! other's prefix; `cache_salt` splits one tenant; no key is a 401 with an
//! OpenAI error body; a key removed from the file is refused after one
//! reload; a tenant over its rate limit gets a 429.

use std::path::Path;
use std::time::{Duration, Instant};

use kvfabric_tenants::KeyHash;
use kvfabric_testkit::procs::*;
use kvfabric_testkit::EtcdProcess;
use serde_json::json;

const PROMPT: &str = "You are the build assistant of a large monorepo. The repository has \
services written in Rust and Go, a web front end in TypeScript, and infrastructure as \
Terraform modules. Before answering, read the relevant files, list the commands you \
would run, explain the risks of each change and how to roll it back. Keep answers short, \
cite file paths, never guess at the contents of a file you have not read, and say when \
you are unsure. The user's question follows after the line of dashes. ----------- ";

fn write_tenants(path: &Path, keys: &[(&str, &str)]) {
    let mut text = String::new();
    for (tenant, key) in keys {
        text.push_str(&format!(
            "[[tenants]]\nname = \"{tenant}\"\napi_keys = [\"{}\"]\n",
            KeyHash::of(key)
        ));
        if *tenant == "lim" {
            text.push_str("rate_limit_per_s = 0.01\nrate_burst = 1\n");
        }
    }
    text.push_str("[[shared]]\nname = \"public\"\nmembers = [\"p1\", \"p2\"]\n");
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write tenants file");
    std::fs::rename(&tmp, path).expect("rename tenants file");
}

const ALL: [(&str, &str); 5] = [
    ("a", "key-a"),
    ("b", "key-b"),
    ("p1", "key-p1"),
    ("p2", "key-p2"),
    ("lim", "key-lim"),
];

/// Greedy completion as `key`; (status, cached_tokens).
fn complete(e: &EngineProc, key: Option<&str>, prompt: &str, salt: Option<&str>) -> (u16, u64) {
    let (status, cached, _) = complete_full(e, key, prompt, salt);
    (status, cached)
}

/// Greedy completion as `key`; (status, cached_tokens, prompt_tokens).
fn complete_full(
    e: &EngineProc,
    key: Option<&str>,
    prompt: &str,
    salt: Option<&str>,
) -> (u16, u64, u64) {
    let mut body = json!({"model": "smollm2", "prompt": prompt, "max_tokens": 1, "temperature": 0});
    if let Some(s) = salt {
        body["cache_salt"] = json!(s);
    }
    let (status, v) = http_with_key(&e.addr, "POST", "/v1/completions", Some(&body), key)
        .unwrap_or_else(|err| panic!("engine {}: {err}\n{}", e.name, e.log()));
    if status == 200 {
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        (status, cached, prompt_tokens)
    } else {
        assert!(v["error"]["message"].is_string(), "{v}");
        (status, 0, 0)
    }
}

/// Wait until `e` has saved at least `n` blocks into the fabric.
fn wait_saved(e: &EngineProc, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&e.addr, "kvfabric_connector_saved_blocks") < n {
        assert!(
            Instant::now() < deadline,
            "saves never finished\n{}",
            e.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn tenants_are_isolated_shared_namespaces_shared_and_keys_enforced() {
    let etcd = EtcdProcess::start().expect("etcd");
    let dir = tempfile::tempdir().expect("dir");
    let tenants = dir.path().join("tenants.toml");
    write_tenants(&tenants, &ALL);
    let flags = vec![
        "--prefix-cache".to_string(),
        "false".into(),
        "--etcd".into(),
        etcd.endpoint(),
        "--etcd-prefix".into(),
        "/t-tenants".into(),
        "--tenants-file".into(),
        tenants.display().to_string(),
    ];
    let e1 = EngineProc::start("e1", dir.path(), &flags);
    let e2 = EngineProc::start("e2", dir.path(), &flags);

    // No key, a wrong key: 401 with an OpenAI error.
    let body = json!({"model": "smollm2", "prompt": "hi", "max_tokens": 1});
    for key in [None, Some("nope")] {
        let (status, v) =
            http_with_key(&e1.addr, "POST", "/v1/completions", Some(&body), key).expect("http");
        assert_eq!(status, 401, "{v}");
        assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }

    // A computes the prompt on e1; its blocks are saved into the fabric.
    // About 320 tokens: 5 full blocks of 64.
    let prompt = PROMPT.repeat(3);
    let (status, cached, prompt_tokens) = complete_full(&e1, Some("key-a"), &prompt, None);
    assert_eq!((status, cached), (200, 0));
    let blocks = (prompt_tokens / 64) as f64;
    assert!(blocks >= 2.0, "the prompt spans {prompt_tokens} tokens");
    wait_saved(&e1, blocks);

    // B sends A's exact prompt on e2: nothing cached, no block read.
    let (status, cached) = complete(&e2, Some("key-b"), &prompt, None);
    assert_eq!((status, cached), (200, 0), "B hit A's prefix");
    assert_eq!(
        metric(&e2.addr, "kvfabric_connector_loaded_blocks"),
        0.0,
        "e2 read a block for B"
    );
    // A with a cache_salt: its own namespace split, nothing cached either.
    let (status, cached) = complete(&e2, Some("key-a"), &prompt, Some("conversation-7"));
    assert_eq!(
        (status, cached),
        (200, 0),
        "a salted request hit the unsalted prefix"
    );
    assert_eq!(metric(&e2.addr, "kvfabric_connector_loaded_blocks"), 0.0);
    // A itself on e2: A's blocks come from the fabric.
    let (status, cached) = complete(&e2, Some("key-a"), &prompt, None);
    assert_eq!(status, 200);
    assert!(cached >= 64, "A reused {cached} tokens of its own prefix");
    assert!(metric(&e2.addr, "kvfabric_connector_loaded_blocks") >= 1.0);

    // A shared namespace: p1 computes on e1, p2 hits it on e2.
    let shared_prompt = format!("Public system prompt v2. {prompt}");
    let before = metric(&e1.addr, "kvfabric_connector_saved_blocks");
    let (status, cached, prompt_tokens) = complete_full(&e1, Some("key-p1"), &shared_prompt, None);
    assert_eq!((status, cached), (200, 0));
    wait_saved(&e1, before + (prompt_tokens / 64) as f64);
    let (status, cached) = complete(&e2, Some("key-p2"), &shared_prompt, None);
    assert_eq!(status, 200);
    assert!(
        cached >= 64,
        "p2 reused {cached} tokens of the shared prefix"
    );
    // ... which is not A's namespace.
    assert_eq!(complete(&e2, Some("key-b"), &shared_prompt, None), (200, 0));

    // Per-tenant metrics: A's cached tokens are counted under A.
    assert!(
        metric(
            &e2.addr,
            "kvfabric_tenant_cached_tokens_total{tenant=\"a\"}"
        ) >= 64.0
    );

    // Over the rate limit: 429.
    assert_eq!(complete(&e1, Some("key-lim"), "hi", None).0, 200);
    assert_eq!(complete(&e1, Some("key-lim"), "hi", None).0, 429);

    // Revoke B's key: refused within one reload (1 s period) plus slack.
    let without_b: Vec<_> = ALL.iter().copied().filter(|(t, _)| *t != "b").collect();
    write_tenants(&tenants, &without_b);
    let revoked = Instant::now();
    while complete(&e1, Some("key-b"), "hi", None).0 != 401 {
        assert!(
            revoked.elapsed() < Duration::from_secs(4),
            "revoked key still accepted\n{}",
            e1.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(complete(&e1, Some("key-a"), "hi", None).0, 200);
}
