//! `kvfabric bench transfer`: the transfer engine between two processes on
//! loopback, each figure a ratio against a real peer measured in the same run:
//! tcp 4 MiB READ throughput vs `iperf3` single stream, 4 KiB READ round trip
//! vs a plain TCP ping-pong (56-byte request, 4 KiB reply: the READ's own wire
//! pattern), shm 4 MiB READ throughput vs single-thread memcpy, and an op-size
//! sweep per transport. The remote peer is this same executable started with
//! `bench transfer --peer-listen ADDR` (hidden flag).
//!
//! With `--security authenticate|encrypt` the tcp throughput is measured
//! again between two engines in that mode (certificates made for the run,
//! a peer of its own, READs showing the peer's capability) and reported as
//! a ratio to the `none` figure of the same run.
//!
//! Bandwidths are in GB/s (1e9 bytes/s); iperf3's bits are converted.
//!
//! With `--wire-links 1,2.5,10` it measures wire compression instead, over
//! shaped links between two test-bed hosts ([`wire`]).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use kvfabric_transfer::security::SecurityMode;
use kvfabric_transfer::{
    SegmentId, SharedRegion, TransferEngine, TransferOp, Transport, TransportChoice,
};
use serde_json::{json, Value};

mod args;
mod peer;
mod security;
mod wire;

use args::config;
pub use args::TransferArgs;
use peer::{ratio, read_throughput, serve_peer, spawn_peer, PeerProcess, PING_REPLY, PING_REQUEST};

/// Run the bench (or, with `--peer-listen`, serve as its peer until stdin closes).
pub fn run(args: &TransferArgs) -> anyhow::Result<()> {
    let args = args.clone();
    if !args.wire_links.is_empty() {
        let report = wire::measure(&args)?;
        return crate::print_report(args.json, &report, wire::print_table);
    }
    crate::on_own_runtime(move |rt| match args.peer_listen.clone() {
        Some(addr) => rt.block_on(serve_peer(&args, &addr)),
        None => {
            let json = args.json;
            let report = crate::on_worker(rt, async move { measure(&args).await })?;
            crate::print_report(json, &report, print_table)
        }
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn small_latency(
    engine: &TransferEngine,
    peer: &PeerProcess,
    local: SegmentId,
    iters: usize,
) -> anyhow::Result<(f64, f64)> {
    let op = || vec![TransferOp::read(local, 0, peer.segment, 0, 4096)];
    for _ in 0..200 {
        engine.batch(&peer.addr, op()).await[0].clone()?;
    }
    let mut us = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        engine.batch(&peer.addr, op()).await[0].clone()?;
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    us.sort_by(f64::total_cmp);
    Ok((percentile(&us, 0.5), percentile(&us, 0.99)))
}

fn pingpong_latency(addr: &str, iters: usize) -> anyhow::Result<(f64, f64)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let req = [1u8; PING_REQUEST];
    let mut reply = vec![0u8; PING_REPLY];
    for _ in 0..200 {
        s.write_all(&req)?;
        s.read_exact(&mut reply)?;
    }
    let mut us = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        s.write_all(&req)?;
        s.read_exact(&mut reply)?;
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    us.sort_by(f64::total_cmp);
    Ok((percentile(&us, 0.5), percentile(&us, 0.99)))
}

/// iperf3 single stream on loopback, GB/s; None when iperf3 is not installed.
fn iperf3(seconds: u64) -> anyhow::Result<Option<f64>> {
    let port = kvfabric_testbed::ports::free_loopback_port()?.to_string();
    let server = Command::new("iperf3")
        .args(["-s", "-1", "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut server) = server else {
        return Ok(None);
    };
    let mut out = None;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let o = Command::new("iperf3")
            .args([
                "-c",
                "127.0.0.1",
                "-p",
                &port,
                "-J",
                "-t",
                &seconds.to_string(),
            ])
            .output()?;
        if o.status.success() {
            out = Some(o.stdout);
            break;
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let out = out.ok_or_else(|| anyhow!("iperf3 client never connected"))?;
    let v: Value = serde_json::from_slice(&out)?;
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| anyhow!("iperf3 JSON has no end.sum_received.bits_per_second"))?;
    Ok(Some(bps / 8.0 / 1e9))
}

/// Single-thread memcpy of `op_bytes` chunks across two `len`-byte buffers; GB/s.
fn memcpy_bandwidth(len: usize, op_bytes: usize, dur: Duration) -> f64 {
    let src = vec![1u8; len];
    let mut dst = vec![0u8; len];
    // Fault every page in before timing (calloc'd pages are mapped lazily).
    dst.fill(2);
    let chunks = (len / op_bytes).max(1);
    let mut moved = 0u64;
    let mut i = 0;
    let started = Instant::now();
    while started.elapsed() < dur {
        let at = (i % chunks) * op_bytes;
        dst[at..at + op_bytes].copy_from_slice(&src[at..at + op_bytes]);
        std::hint::black_box(&mut dst);
        moved += op_bytes as u64;
        i += 1;
    }
    moved as f64 / started.elapsed().as_secs_f64() / 1e9
}

async fn measure(args: &TransferArgs) -> anyhow::Result<Value> {
    if args.op_bytes == 0 || args.op_bytes > args.segment_bytes {
        bail!("--op-bytes must be in 1..=--segment-bytes");
    }
    let peer = spawn_peer(args, None)?;
    let mut registry = prometheus_client::registry::Registry::default();
    let tcp = TransferEngine::start(
        config(args, TransportChoice::Tcp, "127.0.0.1:0"),
        &mut registry,
    )
    .await?;
    let mut registry = prometheus_client::registry::Registry::default();
    let shm = TransferEngine::start(
        config(args, TransportChoice::Auto, "127.0.0.1:0"),
        &mut registry,
    )
    .await?;
    let region = Arc::new(SharedRegion::create(
        "bench-local",
        args.segment_bytes as usize,
    )?);
    // SAFETY: nothing else uses the region yet. Fault its pages in before timing.
    unsafe { region.slice_mut(0, region.len())? }.fill(1);
    let tcp_local = tcp.register(region.clone());
    let shm_local = shm.register(region);
    let secs = Duration::from_secs(args.seconds);
    let seg = args.segment_bytes;

    let iperf3_gbps = iperf3(args.seconds)?;
    let tcp_read = || {
        let (op, batch) = (args.op_bytes, args.batch_ops);
        read_throughput(&tcp, &peer, tcp_local, seg, op, batch, secs)
    };
    let none = security::costed(peer.child.id(), tcp_read()).await?;
    let tcp_gbps = none.gbps;
    let security = match SecurityMode::parse(&args.security)? {
        SecurityMode::None => json!({ "mode": "none" }),
        mode => {
            let secured = security::secured_throughput(args, mode).await?;
            // The plain pair again: the ratio is to the mean of before and after.
            let after = security::costed(peer.child.id(), tcp_read()).await?;
            security::report(mode, &[&none, &after], &secured, secs)?
        }
    };
    let (small_p50_us, small_p99_us) =
        small_latency(&tcp, &peer, tcp_local, args.small_iters).await?;
    let (pingpong_p50_us, pingpong_p99_us) = pingpong_latency(&peer.pingpong, args.small_iters)?;
    let shm_gbps = read_throughput(
        &shm,
        &peer,
        shm_local,
        seg,
        args.op_bytes,
        args.batch_ops,
        secs,
    )
    .await?;
    // The same-host peer must have been reached over shm, chosen automatically.
    if shm.transport_for(&peer.addr) != Some(Transport::Shm) {
        bail!("shm was not chosen for a same-host peer");
    }
    let memcpy_gbps = memcpy_bandwidth(seg as usize, args.op_bytes as usize, secs);
    let mc_args = args.clone();
    let mooncake = tokio::task::spawn_blocking(move || mooncake_te(&mc_args)).await?;

    let mut sweep = serde_json::Map::new();
    for &size in &args.sweep {
        if size == 0 || size > seg {
            continue;
        }
        let ops = ((16u64 << 20) / size).clamp(1, 4096);
        let dur = Duration::from_millis(args.sweep_ms);
        let t = read_throughput(&tcp, &peer, tcp_local, seg, size, ops, dur).await?;
        let s = read_throughput(&shm, &peer, shm_local, seg, size, ops, dur).await?;
        sweep.insert(size.to_string(), json!({ "tcp": t, "shm": s }));
    }
    Ok(json!({
        "op_bytes": args.op_bytes,
        "batch_ops": args.batch_ops,
        "tcp_gbps": tcp_gbps,
        "iperf3_gbps": iperf3_gbps,
        "tcp_ratio": ratio(tcp_gbps, iperf3_gbps),
        "small_p50_us": small_p50_us,
        "small_p99_us": small_p99_us,
        "pingpong_p50_us": pingpong_p50_us,
        "pingpong_p99_us": pingpong_p99_us,
        "small_ratio": ratio(small_p50_us, Some(pingpong_p50_us)),
        "small_p99_ratio": ratio(small_p99_us, Some(pingpong_p99_us)),
        "shm_gbps": shm_gbps,
        "memcpy_gbps": memcpy_gbps,
        "shm_ratio": ratio(shm_gbps, Some(memcpy_gbps)),
        "sweep": sweep,
        "security": security,
        "mooncake_tcp_gbps": mooncake["read_gbps"],
        "mooncake_tcp_write_gbps": mooncake["write_gbps"],
        "tcp_vs_mooncake": crate::mooncake::ratio(Some(tcp_gbps), mooncake["read_gbps"].as_f64()),
        "mooncake": mooncake,
    }))
}

/// Mooncake's Transfer Engine over tcp on loopback, best of its sweep
/// (`mooncake` of the report: status ok with its figures, or why not).
fn mooncake_te(args: &TransferArgs) -> Value {
    use crate::mooncake::{te, unavailable, Venv};
    if args.no_mooncake {
        return unavailable("left out (--no-mooncake)");
    }
    let venv = match Venv::locate() {
        Ok(v) => v,
        Err(why) => return unavailable(why),
    };
    let sweep = te::TeSweep {
        threads: args.mooncake_threads.clone(),
        batch: args.mooncake_batch.clone(),
        block: args.mooncake_blocks.clone(),
        sweep_secs: args.mooncake_sweep_secs.max(1),
        secs: args.seconds.max(1),
        buffer_bytes: 1 << 30,
    };
    te::measure(&venv, &sweep)
        .unwrap_or_else(|e| json!({ "status": "failed", "reason": format!("{e:#}") }))
}

fn print_table(r: &Value) {
    let f = |k: &str| {
        r[k].as_f64()
            .map_or("n/a".to_string(), |v| format!("{v:.2}"))
    };
    println!("transfer bench (loopback, two processes; GB/s = 1e9 bytes/s)");
    println!(
        "{:<34} {:>10} {:>12} {:>8}",
        "measure", "engine", "reference", "ratio"
    );
    println!(
        "{:<34} {:>10} {:>12} {:>8}",
        "tcp 4 MiB READ GB/s vs iperf3",
        f("tcp_gbps"),
        f("iperf3_gbps"),
        f("tcp_ratio")
    );
    println!(
        "{:<34} {:>10} {:>12} {:>8}",
        "4 KiB READ p50 us vs ping-pong",
        f("small_p50_us"),
        f("pingpong_p50_us"),
        f("small_ratio")
    );
    println!(
        "{:<34} {:>10} {:>12} {:>8}",
        "4 KiB READ p99 us vs ping-pong",
        f("small_p99_us"),
        f("pingpong_p99_us"),
        f("small_p99_ratio")
    );
    println!(
        "{:<34} {:>10} {:>12} {:>8}",
        "shm 4 MiB READ GB/s vs memcpy",
        f("shm_gbps"),
        f("memcpy_gbps"),
        f("shm_ratio")
    );
    let sec = &r["security"];
    if let Some(gbps) = sec["tcp_gbps"].as_f64() {
        let mode = sec["mode"].as_str().unwrap_or("?");
        let ratio = sec["tcp_ratio_to_none"].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:<34} {:>10.2} {:>12} {:>8.2}",
            format!("tcp 4 MiB READ GB/s, {mode} vs none"),
            gbps,
            f("tcp_gbps"),
            ratio
        );
        let g = |k: &str| sec[k].as_f64().map_or("n/a".into(), |v| format!("{v:.2}"));
        println!(
            "{:<34} {:>10} {:>12} {:>8}",
            "  cpu ns/byte, secured over none",
            "",
            "",
            g("cpu_ns_per_byte_over_none")
        );
        println!(
            "{:<34} {:>10} {:>12} {:>8}",
            "  bound (one primitive pass a side)",
            "",
            "",
            g("bound_ratio")
        );
    }
    let mc = &r["mooncake"];
    match mc["read_gbps"].as_f64() {
        Some(read) => println!(
            "{:<34} {:>10} {:>12.2} {:>8}   (Mooncake WRITE {:.2}; best of its sweep: {})",
            "tcp READ GB/s vs Mooncake TE tcp",
            f("tcp_gbps"),
            read,
            f("tcp_vs_mooncake"),
            mc["write_gbps"].as_f64().unwrap_or(f64::NAN),
            mc["best"]
        ),
        None => println!(
            "Mooncake TE: {} ({})",
            mc["status"].as_str().unwrap_or("?"),
            mc["reason"].as_str().unwrap_or("")
        ),
    }
    println!();
    println!("{:>10} {:>10} {:>10}", "op bytes", "tcp GB/s", "shm GB/s");
    if let Some(sweep) = r["sweep"].as_object() {
        let mut rows: Vec<_> = sweep.iter().collect();
        rows.sort_by_key(|(k, _)| k.parse::<u64>().unwrap_or(0));
        for (size, v) in rows {
            let g = |t: &str| v[t].as_f64().map_or("n/a".into(), |x| format!("{x:.2}"));
            println!("{:>10} {:>10} {:>10}", size, g("tcp"), g("shm"));
        }
    }
}
