//! Mooncake's Transfer Engine over TCP on loopback: its own
//! `transfer_engine_bench`, a target holding a buffer and an initiator that
//! READs (or WRITEs) it, the segment metadata on an etcd started for the run
//! on loopback ports. A sweep of threads x batch x block size finds its best
//! READ configuration; READ and WRITE are then measured there for the
//! headline's seconds.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context};
use serde_json::{json, Value};

use super::procs::{check_connections, check_rpc_line, connections, wait_log, wait_port, Peer};
use super::{parse_te_throughput, Venv};

/// The Mooncake TE sweep and runs.
#[derive(Clone, Debug)]
pub(crate) struct TeSweep {
    pub threads: Vec<u32>,
    pub batch: Vec<u32>,
    pub block: Vec<u64>,
    /// Seconds per sweep point (its tool takes whole seconds).
    pub sweep_secs: u64,
    /// Seconds of the READ and WRITE runs at the best configuration.
    pub secs: u64,
    /// The target's buffer (configurations that need more are skipped).
    pub buffer_bytes: u64,
}

fn port() -> anyhow::Result<u16> {
    Ok(kvfabric_testbed::ports::free_loopback_port()?)
}

/// etcd on two loopback ports, data in `dir`, bounded by `limit` (not the
/// testbed's `EtcdProcess`: that one is killed on drop only, this one also
/// by `timeout` if the bench itself is killed).
fn start_etcd(dir: &Path, limit: Duration) -> anyhow::Result<(Peer, String)> {
    let (client, peer) = (port()?, port()?);
    let c = format!("http://127.0.0.1:{client}");
    let p = format!("http://127.0.0.1:{peer}");
    let args = vec![
        "--name=kvfabric-bench".to_string(),
        format!("--data-dir={}", dir.join("etcd").display()),
        format!("--listen-client-urls={c}"),
        format!("--advertise-client-urls={c}"),
        format!("--listen-peer-urls={p}"),
        format!("--initial-advertise-peer-urls={p}"),
        format!("--initial-cluster=kvfabric-bench={p}"),
    ];
    let mut etcd = Peer::start(
        "etcd",
        Path::new("etcd"),
        &args,
        &[],
        limit,
        &dir.join("etcd.log"),
    )?;
    wait_port(&mut etcd, client, Duration::from_secs(20)).context("etcd on loopback")?;
    Ok((etcd, format!("127.0.0.1:{client}")))
}

/// The environment of every TE process: its RPC on the loopback name it is given.
const TE_ENV: [(&str, &str); 2] = [
    ("MC_LEGACY_RPC_PORT_BINDING", "1"),
    ("MC_TCP_BIND_ADDRESS", "127.0.0.1"),
];

struct Rig {
    venv: Venv,
    dir: tempfile::TempDir,
    _etcd: Peer,
    target: Peer,
    metadata: String,
    target_name: String,
    /// Established connections seen while the initiators ran (all loopback).
    checked: usize,
    buffer_bytes: u64,
}

impl Rig {
    fn start(venv: &Venv, sweep: &TeSweep, limit: Duration) -> anyhow::Result<Rig> {
        let dir = tempfile::Builder::new()
            .prefix("kvfabric-mooncake-te-")
            .tempdir()?;
        let (etcd, metadata) = start_etcd(dir.path(), limit)?;
        let target_name = format!("127.0.0.1:{}", port()?);
        let args = vec![
            "--mode=target".to_string(),
            "--protocol=tcp".into(),
            format!("--metadata_server={metadata}"),
            format!("--local_server_name={target_name}"),
            format!("--buffer_size={}", sweep.buffer_bytes),
        ];
        let log = dir.path().join("target.log");
        let bench = venv.bin("transfer_engine_bench");
        let mut target = Peer::start("mooncake TE target", &bench, &args, &TE_ENV, limit, &log)?;
        wait_log(&mut target, "numa node num", Duration::from_secs(30))
            .context("the Mooncake TE target did not start")?;
        check_rpc_line(&target.log())?;
        Ok(Rig {
            venv: venv.clone(),
            dir,
            _etcd: etcd,
            target,
            metadata,
            target_name,
            checked: 0,
            buffer_bytes: sweep.buffer_bytes,
        })
    }

    /// One initiator run: GB/s.
    fn run(
        &mut self,
        op: &str,
        threads: u32,
        batch: u32,
        block: u64,
        secs: u64,
    ) -> anyhow::Result<f64> {
        let args = vec![
            "--mode=initiator".to_string(),
            "--protocol=tcp".into(),
            format!("--metadata_server={}", self.metadata),
            format!("--local_server_name=127.0.0.1:{}", port()?),
            format!("--segment_id={}", self.target_name),
            format!("--buffer_size={}", self.buffer_bytes),
            format!("--duration={secs}"),
            format!("--threads={threads}"),
            format!("--batch_size={batch}"),
            format!("--block_size={block}"),
            format!("--operation={op}"),
            "--report_unit=GB".into(),
            "--report_precision=4".into(),
        ];
        let log = self.dir.path().join("initiator.log");
        let bench = self.venv.bin("transfer_engine_bench");
        let limit = Duration::from_secs(secs + 30);
        let init = Peer::start("mooncake TE initiator", &bench, &args, &TE_ENV, limit, &log)?;
        // Mid-run: every connection of both sides is on loopback.
        std::thread::sleep(Duration::from_millis(500 + secs * 500));
        let conns = connections(&[init.pgid(), self.target.pgid()]);
        self.checked += check_connections("mooncake TE", &conns)?;
        let out = init.wait(limit)?;
        check_rpc_line(&out)?;
        parse_te_throughput(&out).ok_or_else(|| {
            anyhow!(
                "transfer_engine_bench printed no throughput: {}",
                super::procs::tail(&out, 4)
            )
        })
    }
}

/// The sweep, then READ and WRITE at its best point: the report's object.
pub(crate) fn measure(venv: &Venv, sweep: &TeSweep) -> anyhow::Result<Value> {
    let points: Vec<(u32, u32, u64)> = sweep
        .threads
        .iter()
        .flat_map(|&t| {
            sweep
                .batch
                .iter()
                .flat_map(move |&b| sweep.block.iter().map(move |&k| (t, b, k)))
        })
        .filter(|&(t, b, k)| u64::from(t * b) * k <= sweep.buffer_bytes)
        .collect();
    anyhow::ensure!(
        !points.is_empty(),
        "no Mooncake TE configuration fits the buffer"
    );
    let runs = points.len() as u64 * (sweep.sweep_secs + 3) + 2 * (sweep.secs + 3);
    let mut rig = Rig::start(venv, sweep, Duration::from_secs(runs + 60))?;
    let mut rows = Vec::new();
    let mut best = (0.0f64, points[0]);
    for &(t, b, k) in &points {
        let row = match rig.run("read", t, b, k, sweep.sweep_secs) {
            Ok(gbps) => {
                if gbps > best.0 {
                    best = (gbps, (t, b, k));
                }
                json!({ "threads": t, "batch": b, "block_bytes": k, "read_gbps": gbps })
            }
            Err(e) => json!({ "threads": t, "batch": b, "block_bytes": k, "error": e.to_string() }),
        };
        rows.push(row);
    }
    anyhow::ensure!(
        best.0 > 0.0,
        "every Mooncake TE configuration failed: {rows:?}"
    );
    let (t, b, k) = best.1;
    let read = rig.run("read", t, b, k, sweep.secs)?.max(best.0);
    let write = rig.run("write", t, b, k, sweep.secs)?;
    Ok(json!({
        "status": "ok",
        "venv": rig.venv.dir,
        "metadata": "etcd",
        "protocol": "tcp",
        "best": { "threads": t, "batch": b, "block_bytes": k },
        "read_gbps": read,
        "write_gbps": write,
        "sweep": rows,
        "loopback_connections_checked": rig.checked,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A two-point sweep, READ and WRITE at the best: every figure there and
    /// positive, connections seen and all on loopback. Without a venv to be
    /// had, the reason (as the bench reports it).
    #[test]
    fn te_sweep_reports_its_best_configuration() {
        let venv = match Venv::locate() {
            Ok(v) => v,
            Err(why) => {
                assert!(!why.is_empty());
                return;
            }
        };
        let sweep = TeSweep {
            threads: vec![2],
            batch: vec![16],
            block: vec![65536, 1 << 20],
            sweep_secs: 1,
            secs: 1,
            buffer_bytes: 64 << 20,
        };
        let r = measure(&venv, &sweep).unwrap();
        assert_eq!(r["status"], "ok");
        assert_eq!(r["sweep"].as_array().unwrap().len(), 2, "{r}");
        for k in ["read_gbps", "write_gbps"] {
            assert!(r[k].as_f64().unwrap() > 0.0, "{k} in {r}");
        }
        assert!(
            r["loopback_connections_checked"].as_u64().unwrap() > 0,
            "{r}"
        );
    }
}
