//! `kvfabric bench eviction --trace FILE` in real child processes: the same
//! trace file gives the same hit ratios in two processes (and twice in
//! one), and a bad line fails the run naming its line number and reason.

use std::process::Command;

/// A JSON-lines trace: 12 sessions of a shared 8-block prefix and 6 blocks
/// of their own, coming back round-robin 6 times, each turn 1 block longer;
/// every third line a block-key request of another tenant.
fn write_trace(path: &std::path::Path) {
    let mut text = String::new();
    let mut ts = 0u64;
    for turn in 0..6u32 {
        for s in 0..12u32 {
            let mut tokens: Vec<u32> = (0..8 * 16).collect();
            tokens.extend((0..(6 + turn) * 16).map(|i| 10_000 * (s + 1) + i));
            tokens.push(7);
            ts += 10;
            text.push_str(&format!(
                "{{\"tokens\":{tokens:?},\"namespace\":\"a\",\"timestamp\":{ts}}}\n"
            ));
            if s % 3 == 0 {
                text.push_str(&format!(
                    "{{\"blocks\":[\"sys\",\"job-{s}\",{turn}],\"namespace\":\"b\"}}\n"
                ));
            }
        }
    }
    std::fs::write(path, text).unwrap();
}

fn run(trace: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvfabric"))
        .args([
            "bench",
            "eviction",
            "--json",
            "--block-tokens",
            "16",
            "--trace",
        ])
        .arg(trace)
        .output()
        .expect("run kvfabric")
}

#[test]
fn a_trace_file_replays_to_the_same_hit_ratios_in_two_processes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.jsonl");
    write_trace(&path);
    let (a, b) = (run(&path), run(&path));
    for o in [&a, &b] {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert_eq!(a.stdout, b.stdout, "two processes disagree");
    let report: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    let trace = &report["traces"][0];
    assert_eq!(trace["requests"], 72 + 24);
    let caps = trace["capacities"].as_array().unwrap();
    let fractions: Vec<f64> = caps
        .iter()
        .map(|c| c["capacity_fraction"].as_f64().unwrap_or(f64::NAN))
        .collect();
    assert_eq!(
        caps.len(),
        5,
        "5, 10, 25, 50 and 75% of the distinct blocks: {fractions:?}"
    );
    for c in caps {
        let min = c["min_hit_ratio"].as_f64().unwrap();
        for p in ["adaptive", "door", "lirs", "lru", "s3fifo"] {
            let h = c["policies"][p]["hit_ratio"].as_f64().unwrap();
            assert!(h <= min + 1e-12, "{p} beats MIN: {c}");
        }
    }
    // The loop is LRU's worst case; MIN and LIRS keep part of it.
    let half = &caps[3];
    assert!(
        half["min_hit_ratio"].as_f64().unwrap()
            > half["policies"]["lru"]["hit_ratio"].as_f64().unwrap()
    );
}

#[test]
fn a_bad_trace_line_fails_the_run_with_its_line_number() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    std::fs::write(&path, "{\"tokens\":[1,2,3]}\n\n{\"tokens\":[1,\"x\"]}\n").unwrap();
    let o = run(&path);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("line 3") && err.contains("tokens[1] is not a token id"),
        "{err}"
    );
}
