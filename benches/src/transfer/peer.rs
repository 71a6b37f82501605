//! The bench's remote peer: the process side (`--peer-listen`: an engine
//! with one segment and a plain TCP ping-pong server) and the bench side
//! (spawning it, reading from it). A leaf below the bench's driver and its
//! security section, which both read from a peer.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use kvfabric_transfer::security::Capability;
use kvfabric_transfer::{
    SegmentId, SharedRegion, TransferConfig, TransferEngine, TransferOp, TransportChoice,
};

use super::args::{config, identity, TransferArgs};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

/// The peer: an engine with one segment and a plain TCP ping-pong server.
pub(super) async fn serve_peer(args: &TransferArgs, listen: &str) -> anyhow::Result<()> {
    let mut registry = prometheus_client::registry::Registry::default();
    let cfg = TransferConfig {
        identity: identity(args, "peer")?,
        ..config(args, TransportChoice::Auto, listen)
    };
    let secured = cfg.identity.is_some();
    let engine = TransferEngine::start(cfg, &mut registry)
        .await
        .context("starting the peer engine")?;
    let region = Arc::new(SharedRegion::create(
        "bench-peer",
        args.segment_bytes as usize,
    )?);
    // SAFETY: nothing else uses the region yet. Fault its pages in up front.
    unsafe { region.slice_mut(0, region.len())? }.fill(3);
    let len = region.len() as u64;
    let segment = engine.register(region);
    // Secured: the bench reads the whole segment on one capability.
    let cap = if secured {
        let c = engine.issue_capability(1, segment, 0, len, Duration::from_secs(3600), "bench");
        hex(&c.encode())
    } else {
        "-".into()
    };
    let pingpong = TcpListener::bind("127.0.0.1:0")?;
    let pingpong_addr = pingpong.local_addr()?;
    std::thread::spawn(move || {
        for conn in pingpong.incoming().flatten() {
            std::thread::spawn(move || serve_pingpong(conn));
        }
    });
    println!(
        "READY {} {} {} {cap}",
        engine.local_addr(),
        segment.0,
        pingpong_addr
    );
    std::io::stdout().flush()?;
    // Serve until the bench closes our stdin.
    tokio::task::spawn_blocking(|| {
        let mut sink = [0u8; 64];
        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
    })
    .await?;
    Ok(())
}

pub(super) const PING_REQUEST: usize = 56;
pub(super) const PING_REPLY: usize = 4096;

fn serve_pingpong(mut conn: TcpStream) {
    let _ = conn.set_nodelay(true);
    let mut req = [0u8; PING_REQUEST];
    let reply = vec![7u8; PING_REPLY];
    while conn.read_exact(&mut req).is_ok() {
        if conn.write_all(&reply).is_err() {
            return;
        }
    }
}

/// The spawned peer process and what it announced; dropping it ends the peer.
pub(super) struct PeerProcess {
    pub(super) child: Child,
    pub(super) addr: String,
    pub(super) segment: SegmentId,
    pub(super) pingpong: String,
    /// Secured peers: the capability READs show.
    pub(super) cap: Option<Capability>,
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start the peer; `secured` = (mode, certificates directory).
pub(super) fn spawn_peer(
    args: &TransferArgs,
    secured: Option<(&str, &std::path::Path)>,
) -> anyhow::Result<PeerProcess> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args(["bench", "transfer", "--peer-listen", "127.0.0.1:0"])
        .args(["--segment-bytes", &args.segment_bytes.to_string()]);
    if let Some((mode, dir)) = secured {
        cmd.args(["--security", mode, "--certs-dir"]).arg(dir);
    }
    if let Some(s) = args.slice_bytes {
        cmd.args(["--slice-bytes", &s.to_string()]);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("spawning the bench peer")?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("peer has no stdout"))?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let parts: Vec<&str> = line.split_whitespace().collect();
    if parts.len() != 5 || parts[0] != "READY" {
        let _ = child.kill();
        bail!("bench peer did not start: {line:?}");
    }
    Ok(PeerProcess {
        addr: parts[1].to_string(),
        segment: SegmentId(parts[2].parse()?),
        pingpong: parts[3].to_string(),
        cap: unhex(parts[4]).and_then(|b| Capability::decode(&b)),
        child,
    })
}

/// Read `op_bytes`-sized ops in batches of `batch_ops` for `dur`; GB/s.
pub(super) async fn read_throughput(
    engine: &TransferEngine,
    peer: &PeerProcess,
    local: SegmentId,
    segment_bytes: u64,
    op_bytes: u64,
    batch_ops: u64,
    dur: Duration,
) -> anyhow::Result<f64> {
    let slots = (segment_bytes / op_bytes).max(1);
    let mut moved = 0u64;
    let mut next = 0u64;
    let batch = |next: &mut u64| -> Vec<TransferOp> {
        (0..batch_ops)
            .map(|_| {
                let at = (*next % slots) * op_bytes;
                *next += 1;
                let op = TransferOp::read(local, at, peer.segment, at, op_bytes);
                match peer.cap {
                    Some(c) => op.with_capability(c),
                    None => op,
                }
            })
            .collect()
    };
    // Warm up: connections, shm mapping, page faults.
    for r in engine.batch(&peer.addr, batch(&mut next)).await {
        r?;
    }
    let started = Instant::now();
    while started.elapsed() < dur {
        for r in engine.batch(&peer.addr, batch(&mut next)).await {
            r?;
            moved += op_bytes;
        }
    }
    Ok(moved as f64 / started.elapsed().as_secs_f64() / 1e9)
}

/// `a / b`, when `b` is a positive figure.
pub(super) fn ratio(a: f64, b: Option<f64>) -> Option<f64> {
    b.filter(|b| *b > 0.0).map(|b| a / b)
}
