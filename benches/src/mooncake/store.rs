//! Mooncake Store on loopback: `mooncake_master` (its own HTTP metadata
//! server on, every address 127.0.0.1) and two clients running the shipped
//! driver `benches/peers/mooncake_store.py` in the venv's Python. The holder
//! mounts the segment, puts the blocks into it and gets them back (local
//! get); the reader, with no segment of its own, gets them from the holder's
//! (remote get) and then one block at a time (single-block latency).

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};

use super::procs::{check_connections, check_rpc_line, connections, wait_log, wait_port, Peer};
use super::Venv;

const DRIVER: &str = include_str!("../../peers/mooncake_store.py");

/// What the Mooncake Store run moves.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StoreJob {
    pub blocks: usize,
    pub block_bytes: usize,
    pub threads: usize,
    /// Keys per `batch_put_from` / `batch_get_into` call.
    pub batch: usize,
    /// Best of this many rounds for each throughput.
    pub rounds: usize,
    /// Single-block gets timed for the latency.
    pub latency_iters: usize,
}

/// The clients' environment: without it their transfer engine's RPC takes
/// the first non-loopback interface's address (and the other client
/// connects there), with it the RPC is advertised on 127.0.0.1.
const CLIENT_ENV: [(&str, &str); 1] = [("MC_TCP_BIND_ADDRESS", "127.0.0.1")];

fn port() -> anyhow::Result<u16> {
    Ok(kvfabric_testbed::ports::free_loopback_port()?)
}

/// `mooncake_master` with its HTTP metadata server, every address 127.0.0.1,
/// once both ports accept: it, its RPC port and its metadata port.
fn start_master(venv: &Venv, dir: &Path, limit: Duration) -> anyhow::Result<(Peer, u16, u16)> {
    let (rpc, metrics, http) = (port()?, port()?, port()?);
    let args = vec![
        "-rpc_address=127.0.0.1".to_string(),
        format!("-rpc_port={rpc}"),
        "-metrics_host=127.0.0.1".into(),
        format!("-metrics_port={metrics}"),
        "-enable_http_metadata_server=true".into(),
        "-http_metadata_server_host=127.0.0.1".into(),
        format!("-http_metadata_server_port={http}"),
        "-enable_metric_reporting=false".into(),
    ];
    let log = dir.join("master.log");
    let mut master = Peer::start(
        "mooncake_master",
        &venv.bin("mooncake_master"),
        &args,
        &[],
        limit,
        &log,
    )?;
    wait_port(&mut master, rpc, Duration::from_secs(20)).context("mooncake_master")?;
    wait_port(&mut master, http, Duration::from_secs(20)).context("its metadata server")?;
    Ok((master, rpc, http))
}

/// Run it: the report's object (`status: "ok"`, GB/s and us).
pub(crate) fn measure(venv: &Venv, job: &StoreJob) -> anyhow::Result<Value> {
    let dir = tempfile::Builder::new()
        .prefix("kvfabric-mooncake-store-")
        .tempdir()?;
    let script = dir.path().join("mooncake_store.py");
    std::fs::write(&script, DRIVER)?;
    let limit = Duration::from_secs(300);
    let (master, rpc, http) = start_master(venv, dir.path(), limit)?;
    let base = json!({
        "hostname": "127.0.0.1",
        "metadata": format!("http://127.0.0.1:{http}/metadata"),
        "master": format!("127.0.0.1:{rpc}"),
        "blocks": job.blocks,
        "block_bytes": job.block_bytes,
        "threads": job.threads,
        "batch": job.batch,
        "rounds": job.rounds,
        "latency_iters": job.latency_iters,
    });
    let python = venv.bin("python");
    let script_arg = vec![script.to_string_lossy().into_owned()];
    let client = |role: &str, extra: Value| -> anyhow::Result<(Peer, String)> {
        let mut j = base.clone();
        j["role"] = json!(role);
        if let (Some(o), Value::Object(e)) = (j.as_object_mut(), extra) {
            o.extend(e);
        }
        let line = j.to_string();
        super::procs::check_loopback_args(role, [&line])?;
        let log = dir.path().join(format!("{role}.log"));
        let mut p = Peer::start(
            &format!("mooncake store {role}"),
            &python,
            &script_arg,
            &CLIENT_ENV,
            limit,
            &log,
        )?;
        p.send_line(&line)?;
        Ok((p, line))
    };
    let (mut holder, _) = client("holder", json!({}))?;
    let held =
        wait_log(&mut holder, "\"role\": \"holder\"", limit).context("the Mooncake holder")?;
    let held: Value = serde_json::from_str(held.trim()).context("the holder's JSON line")?;
    let groups = [master.pgid(), holder.pgid()];
    let (reader, _) = client("reader", json!({ "keys_prefix": held["keys_prefix"] }))?;
    // While the reader runs: every connection of the three is on loopback.
    std::thread::sleep(Duration::from_millis(1500));
    let mut conns = connections(&[groups[0], groups[1], reader.pgid()]);
    let out = reader.wait(limit).context("the Mooncake reader")?;
    conns.extend(connections(&groups));
    let checked = check_connections("mooncake store", &conns)?;
    let read = out
        .lines()
        .rev()
        .find(|l| l.contains("\"role\": \"reader\""))
        .context("the reader printed no JSON line")?;
    let read: Value = serde_json::from_str(read.trim())?;
    check_rpc_line(&holder.log())?;
    check_rpc_line(&out)?;
    drop(holder);
    drop(master);
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    Ok(json!({
        "status": "ok",
        "venv": venv.dir,
        "metadata": "mooncake_master http",
        "protocol": "tcp",
        "blocks": job.blocks,
        "block_bytes": job.block_bytes,
        "threads": job.threads,
        "batch": job.batch,
        "put_gbps": f(&held, "put_gbps"),
        "local_get_gbps": f(&held, "local_get_gbps"),
        "remote_get_gbps": f(&read, "remote_get_gbps"),
        "single_get_p50_us": f(&read, "single_get_p50_us"),
        "single_get_p99_us": f(&read, "single_get_p99_us"),
        "loopback_connections_checked": checked,
    }))
}

/// The Mooncake Store report for a bench: measured, or why not.
pub(crate) fn report(job: &StoreJob) -> Value {
    match Venv::locate() {
        Ok(venv) => measure(&venv, job).unwrap_or_else(|e| {
            json!({
                "status": "failed",
                "reason": format!("{e:#}"),
            })
        }),
        Err(why) => super::unavailable(why),
    }
}
