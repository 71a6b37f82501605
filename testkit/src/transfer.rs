//! Helpers shared by the transfer integration tests: engines with a test
//! config, regions filled with the deterministic stream, and spawned peers.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use kvfabric_transfer::{SegmentId, SharedRegion, TransferConfig, TransferEngine, TransportChoice};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::testdata;

pub const MIB: u64 = 1 << 20;

pub async fn engine(transport: TransportChoice, timeout_ms: u64) -> TransferEngine {
    let config = TransferConfig {
        transport,
        op_timeout_ms: timeout_ms,
        ..TransferConfig::default()
    };
    let mut registry = prometheus_client::registry::Registry::default();
    TransferEngine::start(config, &mut registry).await.unwrap()
}

/// A region of `len` bytes holding the stream for `seed` (0 = zeroes).
pub fn region(len: u64, seed: u64) -> Arc<SharedRegion> {
    let r = Arc::new(SharedRegion::create("test", len as usize).unwrap());
    if seed != 0 {
        testdata::fill(unsafe { r.slice_mut(0, r.len()).unwrap() }, seed, 0);
    }
    r
}

pub fn bytes(r: &SharedRegion, offset: u64, len: u64) -> &[u8] {
    unsafe { r.slice(offset as usize, len as usize).unwrap() }
}

/// A spawned `kvfabric-transfer-peer` (the transfer crate's fixture binary).
pub struct Peer {
    pub child: Child,
    pub addr: String,
    pub segment: SegmentId,
    pub len: u64,
    pub lines: Lines<BufReader<ChildStdout>>,
}

impl Peer {
    /// Start the peer binary at `bin` (the test's
    /// `env!("CARGO_BIN_EXE_kvfabric-transfer-peer")`) and wait for its READY line.
    pub async fn spawn(bin: &str, args: &[&str]) -> Peer {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("peer ready in time")
            .unwrap()
            .expect("peer printed READY");
        let parts: Vec<&str> = ready.split_whitespace().collect();
        assert_eq!(parts[0], "READY", "{ready}");
        Peer {
            addr: parts[1].to_string(),
            segment: SegmentId(parts[2].parse().unwrap()),
            len: parts[3].parse().unwrap(),
            child,
            lines,
        }
    }

    pub async fn next_line(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(30), self.lines.next_line())
            .await
            .expect("peer line in time")
            .unwrap()
            .expect("peer still running")
    }

    pub fn signal(&self, sig: i32) {
        let pid = self.child.id().expect("peer running") as i32;
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
        if sig == libc::SIGSTOP {
            // Signals land asynchronously: wait until every thread is stopped.
            for _ in 0..200 {
                let states = std::fs::read_dir(format!("/proc/{pid}/task"))
                    .unwrap()
                    .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
                    .all(|stat| matches!(stat.rsplit(')').next().map(str::trim_start), Some(s) if s.starts_with('T') || s.starts_with('t')));
                if states {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            panic!("peer did not stop");
        }
    }
}
