//! A node killed in the middle of a multi-turn run: real `kvfabric engine`
//! processes (each embedding a fabric node) on a real etcd. Turns move
//! between engines (no session routing), so later turns load earlier turns'
//! blocks from whichever node computed them. One engine is SIGKILLed halfway;
//! no request fails and every answer stays bitwise the no-cache answer
//! (lookups or reads that hit the dead node fall back to recomputing).

use std::time::Duration;

use kvfabric_testkit::procs::*;
use kvfabric_testkit::EtcdProcess;

const SYSTEM: &str = "You are a careful coding agent. You can call these tools: \
read_file(path) returns the text of a file; write_file(path, text) replaces a file; \
run(command) runs a shell command and returns its output and exit status; \
search(query) searches the repository and returns matching lines with paths. \
Always explain what you are about to do, call one tool at a time, and check each \
result before the next step. Never invent file contents; read them first. ";

/// What happens to engine e3 (and its node) after turn 1.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Fault {
    /// SIGKILL: connections refused at once.
    Kill,
    /// SIGSTOP: connections hang; lookups and reads run into their timeouts.
    Stall,
}

#[test]
fn node_killed_mid_run_loses_no_request_and_changes_no_output() {
    let failed = multi_turn_with(Fault::Kill);
    // The first turn after the kill starts at once, well inside e3's 2 s
    // lease: the directory still names e3 as a holder, so reads of its
    // blocks fail and are recomputed.
    assert!(
        failed > 0.0,
        "the dead node's blocks were never read: failover not exercised"
    );
}

/// A stalled node (late, not dead) must not stall anybody else: lookups
/// and reads that wait on it time out and the blocks are recomputed.
#[test]
fn node_stalled_mid_run_delays_no_request_beyond_the_timeouts() {
    multi_turn_with(Fault::Stall);
}

/// Two sessions x 4 turns over e1..e3 with `fault` hitting e3 after turn 1;
/// every answer must equal the no-cache answer. Returns the block reads
/// that failed over to recompute.
fn multi_turn_with(fault: Fault) -> f64 {
    // Seven engine processes at once would be too many for a 2-core machine.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let etcd = EtcdProcess::start().expect("etcd");
    let dir = tempfile::tempdir().unwrap();
    // No local prefix cache: every reuse goes through the fabric.
    let fabric = |_: &str| {
        vec![
            "--prefix-cache".to_string(),
            "false".into(),
            "--etcd".into(),
            etcd.endpoint(),
            "--etcd-prefix".into(),
            format!("/t-failover-{fault:?}"),
            "--lease-ttl-ms".into(),
            "2000".into(),
        ]
    };
    // The reference: no fabric, no prefix cache, everything computed.
    let plain = EngineProc::start(
        "plain",
        dir.path(),
        &[
            "--fabric".into(),
            "off".into(),
            "--prefix-cache".into(),
            "false".into(),
        ],
    );
    let mut engines: Vec<EngineProc> = ["e1", "e2", "e3"]
        .iter()
        .map(|n| EngineProc::start(n, dir.path(), &fabric(n)))
        .collect();
    std::thread::sleep(Duration::from_millis(1500)); // membership settles (etcd watch)

    let system = SYSTEM.repeat(3);
    let mut histories: Vec<String> = (0..2)
        .map(|s| format!("{system}\nSession {s}. User: list the files in src/ and summarise main.rs.\nAssistant:"))
        .collect();
    let mut reused = 0u64;
    for turn in 0..4 {
        if turn == 2 {
            // e3 computed and holds blocks of earlier turns; it dies without
            // a goodbye, or stops answering.
            match fault {
                Fault::Kill => engines[2].kill(),
                Fault::Stall => engines[2].signal("STOP"),
            }
        }
        let alive = if turn >= 2 { 2 } else { 3 };
        for (s, history) in histories.iter_mut().enumerate() {
            let e = &engines[(s + turn + 2) % alive];
            let started = std::time::Instant::now();
            let (got, cached) = e.complete(history, 12);
            // Lookup (0.5 s) and read (3 s) timeouts bound the wait on e3.
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "turn {turn} session {s}: {:?}",
                started.elapsed()
            );
            let (want, _) = plain.complete(history, 12);
            assert_eq!(
                got, want,
                "turn {turn} session {s} on {}: output differs from no-cache",
                e.name
            );
            if turn > 0 {
                reused += cached;
            }
            history.push_str(&got);
            history.push_str(&format!(
                "\nUser: now do step {} of the plan.\nAssistant:",
                turn + 2
            ));
        }
    }
    assert!(
        reused > 0,
        "later turns reused earlier turns' blocks through the fabric"
    );
    let failed: f64 = engines[..2]
        .iter()
        .map(|e| metric(&e.addr, "kvfabric_connector_load_failed_blocks_total"))
        .sum();
    eprintln!("{fault:?}: reused {reused} tokens; {failed} block reads failed over to recompute");
    if fault == Fault::Stall {
        engines[2].signal("CONT");
    }
    failed
}
