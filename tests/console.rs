//! The browser console, driven in a real headless Chromium (Debian's
//! `chromium` + `chromium-driver`, WebDriver over HTTP): a 3-node cluster on
//! a real etcd under load, the page opened on one node. Checks: no console
//! errors, every node listed, the hit ratio shown matches the node's
//! `/metrics` within a refresh, the plots have points, a killed node turns
//! gone within the membership TTL (+ one page refresh). Saves screenshots
//! under the target dir (`console/*.png`).
//!
//! Skips (with a message) only when chromium or chromedriver is absent;
//! scripts/install-deps.sh installs both, so CI runs it.

mod console_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use console_support::{find_browser, Browser};
use kvfabric_node::cluster::client::{self, CacheClient};
use kvfabric_testkit::procs::node::*;
use kvfabric_testkit::{free_port, EtcdProcess};
use serde_json::Value;

const TTL_MS: u64 = 2000;
/// How often the page refreshes its cluster table (the console's REFRESH_MS).
const PAGE_REFRESH_MS: u64 = 2000;

/// Lookups (half of them of prompts never put: misses), and reads, on every
/// client until `stop`; errors (a killed node) are ignored. The first
/// client also loops over 40 more 64-block prompts (2560 blocks, never
/// put): a working set between a quarter and a half of the RAM tier, so
/// the planner's curve bends.
fn spawn_load(clients: Vec<CacheClient>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut i = 0u32;
        while !stop.load(Ordering::Relaxed) {
            for c in &clients {
                let mut c = c.clone();
                let ks = keys(1 + i % 8, 8);
                let _ = c
                    .lookup(kvfabric_proto::v1::LookupRequest {
                        keys: ks.iter().map(|k| k.as_bytes().to_vec()).collect(),
                        with_holders: false,
                    })
                    .await;
                if i % 8 < 4 {
                    let _ = client::get_block(&mut c, &ks[(i % 8) as usize]).await;
                }
            }
            let mut first = clients[0].clone();
            let _ = first
                .lookup(kvfabric_proto::v1::LookupRequest {
                    keys: keys(1000 + i % 40, 64)
                        .iter()
                        .map(|k| k.as_bytes().to_vec())
                        .collect(),
                    with_holders: false,
                })
                .await;
            i = i.wrapping_add(1);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// (hits, misses) of a node's lookups, read from its `/metrics`.
fn metrics_lookups(http: &str) -> (f64, f64) {
    let text = kvfabric_benches::hosts::http_get(http.parse().expect("addr"), "/metrics")
        .expect("GET /metrics");
    let read = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from /metrics"))
    };
    let hit = read("kvfabric_store_lookup_hit_blocks_total");
    let miss = read("kvfabric_store_lookup_miss_blocks_total");
    (hit, miss)
}

/// Poll `script` in the page until `ok` accepts its result (60 s at most).
async fn wait_page(b: &Browser, what: &str, script: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = b.eval(script).await;
        if ok(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Browser log entries that are errors. The one expected is the planner
/// endpoint's 404 while no planner is built in (the page then says so).
fn errors(log: Vec<Value>) -> Vec<Value> {
    log.into_iter()
        .filter(|e| e["level"] == "SEVERE")
        .filter(|e| {
            let m = e["message"].as_str().unwrap_or("");
            !(e["source"] == "network" && m.contains("/api/v1/capacity") && m.contains("404"))
        })
        .collect()
}

fn save(png: &[u8], name: &str) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    let path = dir.join(name);
    std::fs::write(&path, png).expect("write screenshot");
    eprintln!("console screenshot: {}", path.display());
}

const ROWS: &str = "return [...document.querySelectorAll('#nodes tbody tr')].map(r => [r.dataset.node, r.dataset.state]);";

/// Three nodes on a fresh etcd, history sampled every 500 ms, the planner
/// sampling every key (a curve from a short test's load).
fn start_cluster(etcd: &EtcdProcess, dir: &std::path::Path) -> [NodeProc; 3] {
    let config = dir.join("console.toml");
    std::fs::write(
        &config,
        "[node]\nconsole_interval_ms = 500\nplanner_sample_rate = 1.0\n",
    )
    .unwrap();
    let flags: Vec<String> = [
        "--etcd",
        &etcd.endpoint(),
        "--etcd-prefix",
        "/t-console",
        "--lease-ttl-ms",
        &TTL_MS.to_string(),
        "--config",
        &config.display().to_string(),
    ]
    .map(String::from)
    .to_vec();
    ["a", "b", "c"].map(|id| NodeProc::start(id, dir, &flags, false))
}

/// The hit ratio shown for `node` is its /metrics ratio within a refresh: the
/// page's value comes from a fetch made after `before` was read and before
/// `after`, so it is hit / (hit + miss) for counters between the two reads.
async fn check_hit_ratio(browser: &Browser, node: &NodeProc) {
    let before = metrics_lookups(&node.http);
    let updates = browser
        .eval("return window.kvConsole.clusterUpdates;")
        .await;
    let n0 = updates.as_u64().expect("update counter");
    wait_page(
        browser,
        "two page refreshes",
        "return window.kvConsole.clusterUpdates;",
        |v| v.as_u64().is_some_and(|n| n >= n0 + 2),
    )
    .await;
    let script = format!(
        "const td = document.querySelector('tr[data-node=\"{}\"] td.hit-ratio'); return [td.dataset.value, td.textContent];",
        node.id
    );
    let shown = browser.eval(&script).await;
    let after = metrics_lookups(&node.http);
    let value: f64 = shown[0]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("hit ratio value");
    assert!(
        value > 0.0 && value < 1.0,
        "under this load the ratio is strictly between 0 and 1: {value}"
    );
    let lo = before.0 / (before.0 + after.1);
    let hi = after.0 / (after.0 + before.1);
    assert!(
        value >= lo - 1e-12 && value <= hi + 1e-12,
        "page shows {value}; /metrics (hits, misses) were {before:?} then {after:?}: ratios {lo}..{hi}"
    );
    assert_eq!(shown[1].as_str(), Some(format!("{value:.3}").as_str()));
}

/// The plots have points, one line per node; the top prefixes and the
/// planner panel are filled.
async fn check_panels(browser: &Browser) {
    for series in [
        "hit_ratio",
        "lookup_blocks_per_s",
        "loads_per_s",
        "ram_used_bytes",
        "ram_blocks",
    ] {
        let script = format!(
            "const c = document.getElementById('plot-{series}'); return c && c.querySelector('canvas') ? Number(c.dataset.points) : 0;"
        );
        wait_page(browser, &format!("points in {series}"), &script, |v| {
            v.as_u64().is_some_and(|n| n >= 3)
        })
        .await;
    }
    let lines = browser
        .eval("return window.kvConsole.plots.ram_used_bytes.series.length - 1;")
        .await;
    assert_eq!(lines.as_u64(), Some(3), "one line per node");
    let top = wait_page(
        browser,
        "top prefixes",
        "const p = window.kvConsole.prefixes; return p ? p.prefixes : [];",
        |v| v.as_array().is_some_and(|a| !a.is_empty()),
    )
    .await;
    assert!(
        top[0]["hits"].as_u64().unwrap_or(0) > 0 && top[0]["depth_blocks"] == 8,
        "{top}"
    );
    // Under load the planner gathers its samples and the panel plots the
    // RAM curve (8 points) where it said "too few samples".
    wait_page(
        browser,
        "the planner's curve",
        "const p = document.querySelector('#capacity .plot[data-tier=\"ram\"]'); return [p && p.querySelector('canvas') ? Number(p.dataset.points) : 0, document.getElementById('capacity-note').textContent];",
        |v| v[0].as_u64() == Some(8) && v[1].as_str().is_some_and(|s| !s.contains("too few")),
    )
    .await;
}

/// Before any lookup the planner panel says it has too few samples (N of
/// the API's `min_samples`), not a flat curve.
async fn check_too_few_samples(browser: &Browser, node: &NodeProc) {
    let api: Value = serde_json::from_str(
        &kvfabric_benches::hosts::http_get(node.http.parse().expect("addr"), "/api/v1/capacity")
            .expect("GET /api/v1/capacity"),
    )
    .expect("capacity JSON");
    let min = api["min_samples"].as_u64().expect("min_samples");
    let note = wait_page(
        browser,
        "the planner's note",
        "return document.getElementById('capacity-note').textContent;",
        |v| v.as_str().is_some_and(|s| !s.is_empty()),
    )
    .await;
    let note = note.as_str().unwrap_or("");
    let n: u64 = note
        .strip_prefix("too few samples: ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("planner panel: {note:?}"));
    assert!(
        n < min && note.contains(&format!("{n} of {min} needed")),
        "{note} (min_samples {min})"
    );
    let plots = browser
        .eval("return document.querySelectorAll('#capacity .plot').length;")
        .await;
    assert_eq!(
        plots.as_u64(),
        Some(0),
        "no curve drawn from too few samples"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn console_shows_the_cluster_in_a_real_browser() {
    let Some((chromium, chromedriver)) = find_browser() else {
        eprintln!("SKIPPED console_shows_the_cluster_in_a_real_browser: chromium and chromedriver are not installed (Debian packages chromium, chromium-driver; scripts/install-deps.sh installs them)");
        return;
    };
    let etcd = EtcdProcess::start().expect("etcd");
    let dir = tempfile::tempdir().unwrap();
    let [a, b, mut c] = start_cluster(&etcd, dir.path());
    for n in [&a, &b, &c] {
        wait_members(n, &["a", "b", "c"], Duration::from_secs(15)).await;
    }
    let clients = vec![a.client().await, b.client().await, c.client().await];
    for seed in 1..=4u32 {
        let mut on = clients[seed as usize % 3].clone();
        put_all(&mut on, &keys(seed, 8), false).await;
    }
    let browser = Browser::start(&chromium, &chromedriver, free_port()).await;
    browser.goto(&format!("http://{}/", a.http)).await;
    check_too_few_samples(&browser, &a).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = spawn_load(clients, stop.clone());
    let rows = wait_page(&browser, "three alive nodes", ROWS, |v| {
        v.as_array()
            .is_some_and(|r| r.len() == 3 && r.iter().all(|x| x[1] == "alive"))
    })
    .await;
    let ids: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r[0].as_str())
        .collect();
    assert_eq!(ids, ["a", "b", "c"], "every node listed");
    check_hit_ratio(&browser, &b).await;
    check_panels(&browser).await;
    save(&browser.screenshot().await, "console.png");
    let errs = errors(browser.log().await);
    assert!(errs.is_empty(), "console errors: {errs:?}");

    // A killed node turns gone within the TTL (+ one page refresh).
    c.kill();
    let killed = Instant::now();
    wait_page(&browser, "c gone", ROWS, |v| {
        v.as_array()
            .is_some_and(|r| r.iter().any(|x| x[0] == "c" && x[1] == "gone"))
    })
    .await;
    let took = killed.elapsed();
    assert!(
        took <= Duration::from_millis(TTL_MS + 1000 + PAGE_REFRESH_MS),
        "c shown gone {took:?} after the kill (TTL {TTL_MS} ms)"
    );
    save(&browser.screenshot().await, "console-node-gone.png");
    stop.store(true, Ordering::Relaxed);
    let _ = load.await;
    let errs = errors(browser.log().await);
    assert!(errs.is_empty(), "console errors after the kill: {errs:?}");
}
