//! A standalone transfer peer for multi-process tests: registers one segment
//! filled with the deterministic test stream, prints `READY <addr> <segment>
//! <len>`, and serves until its stdin closes (or it is killed). A notification
//! `verify <seed>` makes it check its segment against that stream and print
//! `VERIFY OK` or `VERIFY BAD <offset>`.
//!
//! Usage: kvfabric-transfer-peer [--listen ADDR] [--size BYTES] [--seed N]
//!        [--corrupt N] [--transport auto|tcp|shm|rdma] [--timeout-ms MS]

use std::io::Write;
use std::sync::Arc;

use kvfabric_transfer::{SharedRegion, TransferConfig, TransferEngine, TransportChoice};
use tokio::io::AsyncReadExt;

// The test kit's stream, compiled in: a binary cannot take the kit as a
// dev-dependency, and the test checks the bytes against the same file.
#[path = "../../../testkit/src/testdata.rs"]
#[allow(dead_code)]
mod testdata;

fn main() {
    if let Err(e) = real_main() {
        eprintln!("kvfabric-transfer-peer: {e}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<(), String> {
    let mut config = TransferConfig::default();
    let mut size: usize = 1 << 20;
    let mut seed: u64 = 1;
    let mut corrupt: u32 = 0;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--listen" => config.listen = value.clone(),
            "--size" => size = value.parse().map_err(|e| bad(&e))?,
            "--seed" => seed = value.parse().map_err(|e| bad(&e))?,
            "--corrupt" => corrupt = value.parse().map_err(|e| bad(&e))?,
            "--timeout-ms" => config.op_timeout_ms = value.parse().map_err(|e| bad(&e))?,
            "--transport" => {
                config.transport = match value.as_str() {
                    "auto" => TransportChoice::Auto,
                    "tcp" => TransportChoice::Tcp,
                    "shm" => TransportChoice::Shm,
                    "rdma" => TransportChoice::Rdma,
                    _ => return Err(bad(&"expected auto, tcp, shm or rdma")),
                }
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let mut registry = prometheus_client::registry::Registry::default();
        let engine = TransferEngine::start(config, &mut registry).await.map_err(|e| e.to_string())?;
        let region = Arc::new(SharedRegion::create("peer", size).map_err(|e| e.to_string())?);
        // SAFETY: nobody else has the region yet.
        testdata::fill(unsafe { region.slice_mut(0, region.len()) }.map_err(|e| e.to_string())?, seed, 0);
        let segment = engine.register(region.clone());
        engine.inject_payload_corruption(corrupt);
        let mut notes = engine.notifications();
        println!("READY {} {} {}", engine.local_addr(), segment.0, region.len());
        let _ = std::io::stdout().flush();
        let mut stdin = tokio::io::stdin();
        let mut sink = [0u8; 64];
        loop {
            tokio::select! {
                n = stdin.read(&mut sink) => if !matches!(n, Ok(k) if k > 0) { return Ok(()) },
                note = notes.recv() => {
                    let Ok(note) = note else { continue };
                    let text = String::from_utf8_lossy(&note.payload).into_owned();
                    if let Some(s) = text.strip_prefix("verify ") {
                        let s: u64 = s.trim().parse().map_err(|e| format!("bad verify seed: {e}"))?;
                        // SAFETY: the test writes nothing while it waits for the verdict.
                        let data = unsafe { region.slice(0, region.len()) }.map_err(|e| e.to_string())?;
                        match testdata::first_mismatch(data, s, 0) {
                            None => println!("VERIFY OK"),
                            Some(at) => println!("VERIFY BAD {at}"),
                        }
                    } else {
                        println!("NOTE {text}");
                    }
                    let _ = std::io::stdout().flush();
                }
            }
        }
    })
}
