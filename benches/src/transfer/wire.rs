//! `kvfabric bench transfer --wire-links 1,2.5,10`: wire compression on tcp
//! between two hosts of a test bed (network namespaces, each link shaped
//! with tbf: [`crate::hosts`]). At each link speed, READs of f16 KV blocks
//! with `wire_compression` off, auto and always, one after another in the
//! same run, and auto's and always' throughput over off's.
//!
//! The blocks are the engine's own when `--kv-blocks FILE` names a
//! `bench kv --dump-dir` file (`f16.bin`), else the codec's synthetic
//! KV-like f16 sample. Both hosts share this machine's cores: the holder
//! encodes and the reader decodes on the same CPUs, which a pair of real
//! machines would not. Needs root (namespaces, tc).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use kvfabric_transfer::{
    SegmentId, SharedRegion, TransferConfig, TransferEngine, TransferOp, TransportChoice,
    WireCompression,
};
use serde_json::{json, Value};

use super::args::TransferArgs;
use crate::hosts::Hosts;

/// One f16 block of SmolLM2-135M: 64 tokens x 30 layers x (K, V) x 192 values x 2 bytes.
const BLOCK: u64 = 64 * 30 * 2 * 192 * 2;
/// Blocks the holder serves (read round-robin).
const BLOCKS: u64 = 64;
/// Batches run before timing (auto measures the link on its first).
const WARMUP_BATCHES: usize = 3;

/// Run the wire-compression bench on a fresh two-host test bed.
pub fn measure(args: &TransferArgs) -> anyhow::Result<Value> {
    if args.wire_links.iter().any(|&g| g.is_nan() || g <= 0.0) {
        bail!("--wire-links: every speed must be a positive Gbit/s");
    }
    let (data, source) = blocks(args)?;
    let hosts = Hosts::up(2, None)?;
    let result = measure_on(&hosts, args, data, source);
    hosts.shutdown();
    result
}

/// The blocks to serve, and where they came from.
fn blocks(args: &TransferArgs) -> anyhow::Result<(Vec<u8>, String)> {
    let len = (BLOCK * BLOCKS) as usize;
    let Some(path) = &args.kv_blocks else {
        let sample = kvfabric_codec::sample::kv_like(2, len, 1);
        return Ok((
            sample,
            "synthetic KV-like f16 (kvfabric_codec::sample)".into(),
        ));
    };
    let file = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if file.is_empty() {
        bail!("{} is empty", path.display());
    }
    let data = file.iter().copied().cycle().take(len).collect();
    Ok((data, format!("engine f16 blocks from {}", path.display())))
}

/// Run `fut` on host `i` (its sockets live in that host's namespace).
fn on_host<T: Send + 'static>(
    hosts: &Hosts,
    i: usize,
    fut: impl Future<Output = T> + Send + 'static,
) -> anyhow::Result<T> {
    let h = hosts.handle(i);
    h.block_on(h.spawn(fut))
        .map_err(|e| anyhow!("task on host {i}: {e}"))
}

async fn start(wire: WireCompression, listen: String) -> anyhow::Result<Arc<TransferEngine>> {
    let config = TransferConfig {
        listen,
        transport: TransportChoice::Tcp,
        wire_compression: wire,
        ..TransferConfig::default()
    };
    let mut registry = prometheus_client::registry::Registry::default();
    Ok(Arc::new(
        TransferEngine::start(config, &mut registry).await?,
    ))
}

fn measure_on(
    hosts: &Hosts,
    args: &TransferArgs,
    data: Vec<u8>,
    source: String,
) -> anyhow::Result<Value> {
    let listen = format!("{}:0", hosts.ip(1));
    let holder = on_host(hosts, 1, start(WireCompression::Off, listen))??;
    let region = Arc::new(SharedRegion::create("wire-holder", data.len())?);
    // SAFETY: the region is new; nothing reads it before the copy ends.
    unsafe { region.slice_mut(0, data.len())? }.copy_from_slice(&data);
    let segment = holder.register(region);
    let addr = holder.local_addr().to_string();
    let data = Arc::new(data);
    let mut links = Vec::new();
    for &gbit in &args.wire_links {
        for i in 0..2 {
            hosts.bed().host(i).shape(Some(gbit))?;
        }
        let mut modes = serde_json::Map::new();
        for (name, wire) in [
            ("off", WireCompression::Off),
            ("auto", WireCompression::Auto),
            ("always", WireCompression::Always),
        ] {
            let run = Reader {
                listen: format!("{}:0", hosts.ip(0)),
                peer: addr.clone(),
                segment,
                data: data.clone(),
                batch: args.batch_ops.max(1),
                secs: Duration::from_secs(args.seconds),
            };
            modes.insert(name.into(), on_host(hosts, 0, run.measure(wire))??);
        }
        let off = modes["off"]["gbps"].as_f64().unwrap_or(f64::NAN);
        let over = |m: &str| modes[m]["gbps"].as_f64().map(|g| g / off);
        links.push(json!({
            "link_gbit": gbit,
            "off": modes["off"],
            "auto": modes["auto"],
            "always": modes["always"],
            "auto_over_off": over("auto"),
            "always_over_off": over("always"),
        }));
    }
    drop(holder);
    Ok(json!({
        "bench": "wire compression (tcp READ, two test-bed hosts, tbf-shaped links)",
        "blocks": source,
        "block_bytes": BLOCK,
        "batch_ops": args.batch_ops,
        "seconds": args.seconds,
        "links": links,
    }))
}

/// One reader engine's run against the holder.
struct Reader {
    listen: String,
    peer: String,
    segment: SegmentId,
    data: Arc<Vec<u8>>,
    batch: u64,
    secs: Duration,
}

impl Reader {
    /// Read batches of whole blocks for `secs` (after a warm-up) with
    /// `wire`; throughput, the share of bytes that arrived encoded, the
    /// wire bytes per raw byte of those, and whether the last batch landed
    /// bit-exact.
    async fn measure(self, wire: WireCompression) -> anyhow::Result<Value> {
        let engine = start(wire, self.listen.clone()).await?;
        let local_region = Arc::new(SharedRegion::create(
            "wire-reader",
            (BLOCK * self.batch) as usize,
        )?);
        // SAFETY: fault the pages in before timing; nothing else uses it.
        unsafe { local_region.slice_mut(0, local_region.len())? }.fill(0);
        let local = engine.register(local_region.clone());
        let mut next = 0u64;
        let batch = |next: u64| {
            (0..self.batch)
                .map(|i| {
                    let block = (next + i) % BLOCKS;
                    TransferOp::read(local, i * BLOCK, self.segment, block * BLOCK, BLOCK)
                        .with_element_width(2)
                })
                .collect::<Vec<_>>()
        };
        for _ in 0..WARMUP_BATCHES {
            self.run(&engine, batch(next)).await?;
            next += self.batch;
        }
        let before = engine.metrics().wire_totals().read;
        let started = Instant::now();
        let mut moved = 0u64;
        let mut first = next;
        while started.elapsed() < self.secs {
            first = next;
            self.run(&engine, batch(next)).await?;
            next += self.batch;
            moved += BLOCK * self.batch;
        }
        let secs = started.elapsed().as_secs_f64();
        let after = engine.metrics().wire_totals().read;
        let raw = after.raw_bytes - before.raw_bytes;
        let sent = after.wire_bytes - before.wire_bytes;
        let bit_exact = (0..self.batch).all(|i| {
            let at = (((first + i) % BLOCKS) * BLOCK) as usize;
            let want = &self.data[at..at + BLOCK as usize];
            // SAFETY: the batches into the region have completed.
            let got = unsafe { local_region.slice((i * BLOCK) as usize, BLOCK as usize) };
            got.is_ok_and(|g| g == want)
        });
        Ok(json!({
            "gbps": moved as f64 / secs / 1e9,
            "encoded_share": raw as f64 / moved.max(1) as f64,
            "wire_per_raw_encoded": if raw > 0 { Some(sent as f64 / raw as f64) } else { None },
            "bit_exact": bit_exact,
        }))
    }

    async fn run(&self, engine: &TransferEngine, ops: Vec<TransferOp>) -> anyhow::Result<()> {
        for r in engine.batch(&self.peer, ops).await {
            r.context("wire bench READ")?;
        }
        Ok(())
    }
}

/// The report as a table.
pub fn print_table(r: &Value) {
    println!(
        "wire compression: tcp READ of {}-byte f16 blocks, {} per batch, two test-bed hosts",
        r["block_bytes"], r["batch_ops"]
    );
    println!("blocks: {}", r["blocks"].as_str().unwrap_or("?"));
    println!(
        "{:>9} {:>9} {:>9} {:>9} {:>9} {:>11} {:>12}",
        "link Gb/s", "off GB/s", "auto GB/s", "alws GB/s", "auto/off", "auto enc %", "always/off"
    );
    let f = |v: &Value| v.as_f64().map_or("n/a".into(), |x| format!("{x:.3}"));
    for l in r["links"].as_array().into_iter().flatten() {
        let share = l["auto"]["encoded_share"].as_f64().unwrap_or(f64::NAN) * 100.0;
        println!(
            "{:>9} {:>9} {:>9} {:>9} {:>9} {:>11.0} {:>12}",
            f(&l["link_gbit"]),
            f(&l["off"]["gbps"]),
            f(&l["auto"]["gbps"]),
            f(&l["always"]["gbps"]),
            f(&l["auto_over_off"]),
            share,
            f(&l["always_over_off"]),
        );
    }
}
