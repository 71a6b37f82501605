//! `kvfabric bench store --metadata-scale`, section "directory_sync": what
//! keeping the cluster directory in step with a large store costs.
//!
//! Two in-process nodes (static peers, tcp); node "a" holds `blocks` small
//! blocks (512 B, one 4 KiB RAM extent each), node "b" owns about half of
//! their directory entries. Each scale runs twice: reconciles on (the
//! configured period, 1 s) and off (a period of an hour: nothing periodic
//! runs). Per run:
//! - idle CPU: the process's user+system time (getrusage) over a few
//!   periods with no load, per period;
//! - load: a getter at a fixed rate of random stored keys and a putter of new
//!   keys at a fixed rate, both scheduled ahead; a request's latency runs
//!   from its scheduled start, so a stall delays every request queued behind
//!   it (no coordinated omission). Reported: get p50/p99, put p99.
//!
//! The figures are ratios of on to off on the same machine in the same run.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use kvfabric_node::cluster::ClusterNode;
use kvfabric_store::{BlockKey, BlockOrder, DType, KvLayout, PutOptions};
use serde::Serialize;
use tokio::sync::oneshot;

/// Settings of the directory-sync bench.
#[derive(Clone, Debug)]
pub struct SyncBenchArgs {
    /// Block counts to measure (each on and off).
    pub scales: Vec<usize>,
    /// Reconcile period of the "on" runs.
    pub reconcile_interval_ms: u64,
    /// Gets per second of the steady load.
    pub get_rate: u64,
    /// Puts per second of the steady load.
    pub put_rate: u64,
    /// Seconds of load per run.
    pub load_secs: u64,
    /// Seconds of idle CPU measurement per run.
    pub idle_secs: u64,
}

impl Default for SyncBenchArgs {
    fn default() -> Self {
        SyncBenchArgs {
            scales: vec![10_000, 1_000_000],
            reconcile_interval_ms: 1000,
            get_rate: 20_000,
            put_rate: 2_000,
            load_secs: 6,
            idle_secs: 5,
        }
    }
}

/// One run: one scale, reconciles on or off.
#[derive(Clone, Debug, Serialize)]
pub struct SyncRun {
    pub reconciles: bool,
    pub get_p50_us: f64,
    pub get_p99_us: f64,
    pub put_p99_us: f64,
    pub gets: usize,
    pub puts: usize,
    /// Process CPU (user + system) per reconcile period, idle.
    pub idle_cpu_ms_per_period: f64,
}

/// On and off at one scale.
#[derive(Clone, Debug, Serialize)]
pub struct SyncScale {
    pub blocks: usize,
    pub on: SyncRun,
    pub off: SyncRun,
    /// get p99 with reconciles on / off (target <= 1.5).
    pub get_p99_ratio: f64,
    /// Idle CPU per period, on minus off: what the periodic sync costs.
    pub sync_cpu_ms_per_period: f64,
}

/// The "directory_sync" section.
#[derive(Clone, Debug, Serialize)]
pub struct SyncReport {
    pub reconcile_interval_ms: u64,
    pub get_rate: u64,
    pub put_rate: u64,
    pub block_bytes: usize,
    pub scales: Vec<SyncScale>,
}

/// 2 layers x K,V x 16 tokens x 1 head x 4 x f16 = 512 B.
fn layout() -> KvLayout {
    KvLayout {
        layers: 2,
        kv_heads: 1,
        head_dim: 4,
        dtype: DType::F16,
        block_tokens: 16,
        order: BlockOrder::LayerKvTokenHead,
    }
}

fn key(tag: u8, i: u64) -> BlockKey {
    let mut k = [tag; 32];
    k[..8].copy_from_slice(&i.to_le_bytes());
    // Spread the keys over the owners: rendezvous hashes the whole key.
    k[8..16].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
    BlockKey(k)
}

/// Process CPU time (user + system) so far.
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn pct_us(lat: &mut [Duration], p: f64) -> f64 {
    if lat.is_empty() {
        return 0.0;
    }
    lat.sort();
    let i = ((lat.len() as f64 - 1.0) * p).round() as usize;
    lat[i].as_secs_f64() * 1e6
}

/// Measure every scale, on and off.
pub fn measure(args: &SyncBenchArgs) -> anyhow::Result<SyncReport> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut scales = Vec::new();
    for &blocks in &args.scales {
        let off = run_one(&rt, args, blocks, false)?;
        let on = run_one(&rt, args, blocks, true)?;
        scales.push(SyncScale {
            blocks,
            get_p99_ratio: on.get_p99_us / off.get_p99_us.max(1e-3),
            sync_cpu_ms_per_period: on.idle_cpu_ms_per_period - off.idle_cpu_ms_per_period,
            on,
            off,
        });
    }
    Ok(SyncReport {
        reconcile_interval_ms: args.reconcile_interval_ms,
        get_rate: args.get_rate,
        put_rate: args.put_rate,
        block_bytes: layout().block_bytes(),
        scales,
    })
}

/// Start "a" (room for `blocks` plus the load's puts) and "b" as one cluster.
async fn start(
    args: &SyncBenchArgs,
    blocks: usize,
    reconciles: bool,
) -> anyhow::Result<(Vec<Arc<ClusterNode>>, Vec<oneshot::Sender<()>>)> {
    let period = if reconciles {
        args.reconcile_interval_ms
    } else {
        3_600_000
    };
    let extra = (args.put_rate * args.load_secs + 4096) as usize;
    let rams = [((blocks + extra) as u64 * 4096) * 5 / 4, 64 << 20];
    let started =
        crate::cluster::start_loopback(&[("a", rams[0]), ("b", rams[1])], Some(period)).await?;
    let (nodes, stops) = started.into_iter().map(|n| (n.node, n.stop)).unzip();
    Ok((nodes, stops))
}

fn run_one(
    rt: &tokio::runtime::Runtime,
    args: &SyncBenchArgs,
    blocks: usize,
    reconciles: bool,
) -> anyhow::Result<SyncRun> {
    let (nodes, stops) = rt.block_on(start(args, blocks, reconciles))?;
    let store = nodes[0].store().clone();
    let l = layout();
    let data = vec![7u8; l.block_bytes()];
    for i in 0..blocks as u64 {
        store.put(key(1, i), l, &data, PutOptions::default())?;
    }
    // Let the announcements of the fill go out (and a first full period pass).
    let settle = Duration::from_millis(args.reconcile_interval_ms * 3 + 1000);
    rt.block_on(async { tokio::time::sleep(settle).await });
    let periods = (args.idle_secs * 1000) as f64 / args.reconcile_interval_ms as f64;
    let cpu0 = cpu_time();
    rt.block_on(async { tokio::time::sleep(Duration::from_secs(args.idle_secs)).await });
    let idle_cpu_ms_per_period = (cpu_time() - cpu0).as_secs_f64() * 1e3 / periods;

    let secs = Duration::from_secs(args.load_secs);
    let getter = {
        let store = store.clone();
        let rate = args.get_rate;
        thread::spawn(move || {
            let mut buf = vec![0u8; l.block_bytes()];
            paced(rate, secs, |i| {
                let k = key(1, i.wrapping_mul(7919) % blocks.max(1) as u64);
                matches!(store.get_into(&k, 0, &mut buf), Ok(Some(_)))
            })
        })
    };
    let putter = {
        let store = store.clone();
        let rate = args.put_rate;
        let data = data.clone();
        thread::spawn(move || {
            paced(rate, secs, |i| {
                store
                    .put(key(2, i), l, &data, PutOptions::default())
                    .is_ok()
            })
        })
    };
    let mut gets = getter
        .join()
        .map_err(|_| anyhow::anyhow!("getter panicked"))??;
    let mut puts = putter
        .join()
        .map_err(|_| anyhow::anyhow!("putter panicked"))??;
    for n in &nodes {
        rt.block_on(n.leave());
    }
    drop((store, nodes));
    for s in stops {
        let _ = s.send(());
    }
    // The servers drop their nodes (and the stores' arenas) as they stop.
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(500)).await });
    Ok(SyncRun {
        reconciles,
        get_p50_us: pct_us(&mut gets, 0.5),
        get_p99_us: pct_us(&mut gets, 0.99),
        put_p99_us: pct_us(&mut puts, 0.99),
        gets: gets.len(),
        puts: puts.len(),
        idle_cpu_ms_per_period,
    })
}

/// Run `op(i)` at `rate` per second for `secs`, each scheduled at its slot;
/// latency from the slot to completion. Fails when an op fails.
fn paced(
    rate: u64,
    secs: Duration,
    mut op: impl FnMut(u64) -> bool,
) -> anyhow::Result<Vec<Duration>> {
    let n = rate * secs.as_secs();
    let mut lat = Vec::with_capacity(n as usize);
    let t0 = Instant::now();
    for i in 0..n {
        let slot = t0 + Duration::from_nanos(i * 1_000_000_000 / rate.max(1));
        let now = Instant::now();
        if slot > now + Duration::from_micros(200) {
            thread::sleep(slot - now);
        }
        anyhow::ensure!(op(i), "operation {i} failed");
        lat.push(Instant::now().saturating_duration_since(slot));
    }
    Ok(lat)
}
