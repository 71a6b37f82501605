//! `kvfabric bench soak --minutes 3`: three engine hosts, a router and etcd
//! under agentic load while a seeded schedule injects every kind of fault
//! (kill -9 + restart, etcd stop/start, partition, 100 Mbit/s throttle, disk
//! tier filesystem full, bit flip on disk). No request may fail, no answer
//! may differ from the no-cache answer, and no process that was not
//! restarted may grow its RSS by more than 10%, and no process's fd count
//! may keep growing after warm-up (sampled every fault round; see
//! `benches/src/soak/growth.rs`). Needs root (network namespaces, tmpfs); skips with `SKIPPED:`
//! where namespaces cannot be made.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kvfabric_testbed::Testbed;

// fd rule: pool-aware (benches/src/soak/growth.rs). Each
// process's fds are split into its pooled TCP connections (transfer pools
// per peer and direction, HTTP pools) and the rest: the rest may not grow
// after warm-up; at the end, after the load stopped, every pool holds at
// most the idle bound its config gives (transfer_idle_connections_per_peer per
// peer and direction) and no process holds a connection whose other end is
// gone (a killed peer's old incarnation). A pool that fills late (a run
// whose pool grew by one fd at the end, under load 66) passes; a leak of one
// fd or one connection per round fails.
#[test]
fn three_minute_soak_loses_no_request_and_changes_no_output() {
    // Probe: the soak makes its own test bed.
    if Testbed::up_or_skip(1, None).is_none() {
        return;
    }
    let model = kvfabric_engine::model::reference_model_path();
    assert!(
        model.exists(),
        "reference model not found at {}",
        model.display()
    );
    let dir = tempfile::tempdir().expect("dir");
    let out_path = dir.path().join("soak.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvfabric"))
        .args([
            "bench",
            "soak",
            "--json",
            "--minutes",
            "3",
            "--sessions",
            "2",
        ])
        .arg("--model")
        .arg(&model)
        .stdout(std::fs::File::create(&out_path).expect("out"))
        .stderr(Stdio::inherit())
        .spawn()
        .expect("kvfabric bench soak");
    let deadline = Instant::now() + Duration::from_secs(540);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the 3-minute soak did not end within 9 minutes");
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let text = std::fs::read_to_string(&out_path).expect("report");
    // The whole report goes to a file that outlives the test; the output
    // gets one short line per broken rule. A CI log keeps only a window of
    // the output: the whole report (12 KB) in every message would push the
    // reason out of it, leaving a failed soak with no reason in the log.
    let kept = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("soak-report.json");
    let _ = std::fs::write(&kept, &text);
    assert!(
        status.success(),
        "soak failed: {status}; report: {}",
        kept.display()
    );
    let r: serde_json::Value = serde_json::from_str(text.trim()).expect("JSON report");
    let broken = broken_rules(&r);
    eprintln!(
        "soak: sent {} failed {} unverified {} cut {} differing {} retried {}; turn ms {}; errors {}; full report: {}",
        r["requests_sent"],
        r["requests_failed"],
        r["requests_unverified"],
        r["requests_cut_at_end"],
        r["outputs_differing_from_no_cache"],
        r["requests_retried"],
        r["turn_ms"],
        r["errors"].to_string().chars().take(600).collect::<String>(),
        kept.display()
    );
    assert!(
        broken.is_empty(),
        "soak broke {} rule(s):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// Every rule of the soak the report breaks, one short line each.
fn broken_rules(r: &serde_json::Value) -> Vec<String> {
    let mut broken = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            broken.push(what);
        }
    };
    let n = |k: &str| r[k].as_u64();
    // Traffic ran through the faults: every session got past its second
    // turn (so reuse was exercised), and requests started in at least three
    // of the run's 30-second windows. Not a throughput floor: on a loaded
    // machine a turn (router + no-cache reference) took 26 s and the run
    // sent 14 requests, all verified, which a floor of 20 would fail.
    let sessions = n("sessions").unwrap_or(0);
    let sent = n("requests_sent").unwrap_or(0);
    check(
        sent >= 3 * sessions,
        format!("requests_sent {sent} < 3 x {sessions} sessions"),
    );
    let windows = r["hit_ratio_over_time"].as_array().map_or(0, |w| w.len());
    check(
        windows >= 3,
        format!("requests started in {windows} 30-s windows (< 3)"),
    );
    for k in [
        "requests_failed",
        "requests_unverified",
        "outputs_differing_from_no_cache",
    ] {
        check(n(k) == Some(0), format!("{k} = {}", r[k]));
    }
    // At most each driver's last turn, still running a minute after the end.
    let cut = n("requests_cut_at_end");
    check(
        cut.is_some_and(|c| c <= 2),
        format!("requests_cut_at_end = {cut:?} (> 2)"),
    );
    let faults = r["faults"].as_array().cloned().unwrap_or_default();
    let kinds: std::collections::BTreeSet<&str> =
        faults.iter().filter_map(|f| f["fault"].as_str()).collect();
    if kinds.len() != 6 {
        broken.push(format!("not every kind of fault ran: {kinds:?}"));
    }
    for f in faults.iter().filter(|f| !f["recover_error"].is_null()) {
        broken.push(format!("a fault did not recover: {f}"));
    }
    if r["processes_grown"] != serde_json::json!([]) {
        broken.push(format!(
            "RSS > +10% or fds kept growing after warm-up: {}",
            grown_summary(r)
        ));
    }
    broken
}

/// For each grown process: its RSS growth and its fd verdict, without the
/// samples.
fn grown_summary(r: &serde_json::Value) -> String {
    let grown = &r["processes_grown"];
    r["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| grown.as_array().is_some_and(|g| g.contains(&p["name"])))
        .map(|p| {
            let mut fds = p["fds_after_warmup"].clone();
            if let Some(o) = fds.as_object_mut() {
                o.remove("samples");
            }
            format!(
                "{} (restarted {}, rss_growth {}, fds {})",
                p["name"], p["restarted"], p["rss_growth"], fds
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}
