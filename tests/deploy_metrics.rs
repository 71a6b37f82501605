//! The operations files name only metrics that exist: every `kvfabric_*`
//! metric in deploy/grafana/kvfabric.json and deploy/prometheus/alerts.yml
//! is exported by a live process. One real `kvfabric engine` (the reference
//! model, `KVFABRIC_MODEL_PATH`) with its embedded fabric node on a real
//! etcd: engine metrics (`kvfabric_engine_*`, `kvfabric_connector_*`) must be
//! in the engine's `/metrics`, every other one in the node's `/metrics`.
//! (`promtool check rules` checks the rules' syntax: scripts/test.sh.)

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kvfabric_testkit::procs::{get_ok, http, EngineOptions};
use kvfabric_testkit::{free_port, EtcdProcess};

/// Every `kvfabric_...` metric name in `text`.
fn referenced(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("kvfabric_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        // Not the tail of a longer identifier (e.g. a label value).
        let before = rest[..i].chars().last();
        // Nor a prefix in prose ("kvfabric_*").
        let name = &tail[..end];
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') && !name.ends_with('_') {
            out.insert(name.to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// The series names a `/metrics` text declares: its samples, and for each
/// `# TYPE` family the names its samples will have (`_total` of a counter,
/// `_bucket`/`_sum`/`_count` of a histogram), so a family with no labelled
/// series yet (no checksum failure so far) still counts as existing.
fn declared(metrics: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in metrics.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let mut it = t.split_whitespace();
            let (Some(name), Some(kind)) = (it.next(), it.next()) else {
                continue;
            };
            out.insert(name.to_string());
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[],
            };
            for s in suffixes {
                out.insert(format!("{name}{s}"));
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            out.insert(line[..end].to_string());
        }
    }
    out
}

/// Every `label="value"` / `label=~"a|b"` matcher in `text` (JSON-escaped
/// quotes too), as (label, value) per alternative; values with a Grafana
/// variable (`$`) or a regex beyond plain alternatives are skipped.
fn matchers(text: &str) -> BTreeSet<(String, String)> {
    let text = text.replace("\\\"", "\"");
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("=\"").chain(text.match_indices("=~\"")) {
        let label: String = text[..i]
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let start = text[i..].find('"').map(|q| i + q + 1).unwrap_or(text.len());
        let Some(len) = text[start..].find('"') else {
            continue;
        };
        let value = &text[start..start + len];
        let plain = value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '|');
        if label.is_empty() || matches!(label.as_str(), "job" | "instance") || !plain {
            continue;
        }
        for alt in value.split('|') {
            out.insert((label.clone(), alt.to_string()));
        }
    }
    out
}

#[test]
fn referenced_names_are_parsed() {
    let r = referenced(
        r#"rate(kvfabric_store_hits_total{tier="ram"}[5m]) / x_kvfabric_no, kvfabric_*"#,
    );
    assert_eq!(
        r.into_iter().collect::<Vec<_>>(),
        ["kvfabric_store_hits_total"]
    );
    let d =
        declared("# TYPE kvfabric_a counter\n# TYPE kvfabric_h histogram\nkvfabric_g{t=\"x\"} 1\n");
    for n in ["kvfabric_a_total", "kvfabric_h_bucket", "kvfabric_g"] {
        assert!(d.contains(n), "{n}: {d:?}");
    }
    assert!(!d.contains("kvfabric_a_bucket"));
    let m = matchers(r#"x{direction=~\"Read|ServedWrite\",instance=~\"$instance\"} y{tier="Ram"}"#);
    let want: BTreeSet<(String, String)> = [
        ("direction", "Read"),
        ("direction", "ServedWrite"),
        ("tier", "Ram"),
    ]
    .iter()
    .map(|(l, v)| (l.to_string(), v.to_string()))
    .collect();
    assert_eq!(m, want);
}

#[test]
fn every_metric_of_the_dashboard_and_alerts_exists_on_a_live_node_and_engine() {
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |p: &str| std::fs::read_to_string(format!("{root}/{p}")).expect(p);
    let dashboard = read("deploy/grafana/kvfabric.json");
    serde_json::from_str::<serde_json::Value>(&dashboard).expect("dashboard is JSON");
    let wanted: BTreeSet<String> = referenced(&dashboard)
        .into_iter()
        .chain(referenced(&read("deploy/prometheus/alerts.yml")))
        .collect();
    assert!(wanted.len() > 20, "{wanted:?}");

    let etcd = EtcdProcess::start().expect("etcd");
    let dir = tempfile::tempdir().unwrap();
    let node = format!("127.0.0.1:{}", free_port());
    let proc = EngineOptions::new("ops", dir.path())
        .memory("64MiB", "64MiB")
        .node_http(&node)
        .args(&["--etcd", &etcd.endpoint(), "--etcd-prefix", "/t-deploy"])
        .start();
    let engine = proc.addr.clone();
    // One request, so the per-request series have samples too.
    let body = serde_json::json!({"model": "smollm2", "prompt": "Hello there", "max_tokens": 2});
    let (status, v) = http(&engine, "POST", "/v1/completions", Some(&body)).unwrap();
    assert_eq!(status, 200, "{v}");

    // True gauges: with the request finished, nothing runs or waits.
    let gauge = |name: &str| {
        let text = get_ok(&engine, "/metrics").unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
    };
    let idle = Instant::now();
    while gauge("kvfabric_engine_running_requests") != Some(0.0) {
        assert!(
            idle.elapsed() < Duration::from_secs(5),
            "running_requests stays {:?} after the last request finished",
            gauge("kvfabric_engine_running_requests")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(gauge("kvfabric_engine_waiting_requests"), Some(0.0));

    let engine_text = get_ok(&engine, "/metrics").unwrap();
    let node_text = get_ok(&node, "/metrics").unwrap();
    // Label values the files match on are values the processes export
    // (they are PascalCase: direction="ServedRead", tier="Ram").
    let both = format!("{engine_text}{node_text}");
    let files = format!("{dashboard}{}", read("deploy/prometheus/alerts.yml"));
    let unknown: Vec<_> = matchers(&files)
        .into_iter()
        .filter(|(l, v)| !both.contains(&format!("{l}=\"{v}\"")))
        .collect();
    assert!(
        unknown.is_empty(),
        "label values never exported: {unknown:?}"
    );
    let engine_has = declared(&engine_text);
    let node_has = declared(&node_text);
    let missing: Vec<&String> = wanted
        .iter()
        .filter(|m| {
            let engine_side =
                m.starts_with("kvfabric_engine_") || m.starts_with("kvfabric_connector_");
            !(if engine_side { &engine_has } else { &node_has }).contains(*m)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "named in deploy/ but not exported: {missing:?}\nengine: {engine_has:?}\nnode: {node_has:?}"
    );
}
