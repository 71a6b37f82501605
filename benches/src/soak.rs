//! `kvfabric bench soak`: the cluster under steady agentic load while
//! faults hit it, one after another and sometimes two at once.
//!
//! Four hosts of a network-namespace test bed ([`kvfabric_testbed`]): host 0
//! runs etcd, the router (random routing, so turns move between engines and
//! reuse goes through the fabric) and a reference engine with no cache at
//! all; hosts 1..=3 run one `kvfabric engine` each (embedded node, disk tier
//! on a small tmpfs). `--sessions` driver threads inside host 0 send
//! multi-turn sessions through the router, every answer also asked of the
//! reference engine and compared. After `--warmup-s`, a seeded schedule
//! ([`faults`]) injects a fault every `--fault-every-s` seconds, holds it
//! `--hold-s` seconds and heals it.
//!
//! Reported: requests sent, failed (every retry failed) and retried, outputs
//! different from the no-cache answer, answers not compared (the reference
//! failed) and turns cut at the end (still running [`DRAIN_LIMIT`] after
//! it: with the last round's heal and the end's fd settling,
//! [`SETTLE_LIMIT`], this bounds the wall time past `--minutes`), the time
//! of a router answer and of a no-cache reference answer, when each phase
//! ended, the token hit ratio per 30 s, RSS and open fds of every process
//! after warm-up and at the end, and every fault with the time it took to
//! recover. `pass` is: no failed request, no unverified answer, no
//! different output, no process (not restarted) whose RSS grew > 10%, and
//! no process that breaks the fd rule ([`growth`]: fds sampled every fault
//! round and at the end, split into pooled TCP connections, each pool
//! bounded by the config at the end, and the rest, which may not grow; no
//! connection to a dead peer at the end). Each process's TCP connections by
//! peer and state are reported at warm-up and at the end
//! ([`kvfabric_testbed::tcp_summary`]).

pub mod client;
pub mod cluster;
pub mod faults;
pub mod growth;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use kvfabric_testbed::{ProcStats, Testbed};
use serde_json::{json, Value};

use crate::agentic::trace::SplitMix64;
use cluster::{Sizes, SoakCluster};
use growth::{Bounds, FdSample};

/// The longest the end waits for the fd rule to hold after the load stopped.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// The longest the drivers' last turns may run past the end: what bounds
/// the wall time after it (a turn is a router answer and a no-cache
/// reference answer, each retried; under load one reference prefill alone
/// took tens of seconds).
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// Arguments of `kvfabric bench soak`.
#[derive(clap::Args, Debug, Clone)]
pub struct SoakArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// GGUF model (default: the fetched SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Length of the run, minutes (warm-up included).
    #[arg(long, default_value_t = 15.0)]
    pub minutes: f64,
    /// Concurrent sessions (driver threads).
    #[arg(long, default_value_t = 2)]
    pub sessions: usize,
    /// Turns per session before it starts over as a new session.
    #[arg(long, default_value_t = 5)]
    pub turns: usize,
    /// Tokens per answer (greedy).
    #[arg(long, default_value_t = 12)]
    pub answer_tokens: usize,
    /// Seed of the fault schedule and the sessions' text.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Rate of each host's link, Gbit/s (tbf; none = veth speed).
    #[arg(long)]
    pub link_gbit: Option<f64>,
    /// Seconds of load before the first fault (RSS and fds are taken then).
    #[arg(long, default_value_t = 30)]
    pub warmup_s: u64,
    /// Seconds from one fault round to the next.
    #[arg(long, default_value_t = 20)]
    pub fault_every_s: u64,
    /// Seconds a fault is held before it is healed.
    #[arg(long, default_value_t = 5)]
    pub hold_s: u64,
    /// Size of each engine's disk tier tmpfs, MiB (the data file takes
    /// half, at least 64 MiB: one largest block).
    #[arg(long, default_value_t = 256)]
    pub disk_mib: u64,
}

/// One request of the load.
#[derive(Debug, Clone)]
struct Record {
    at: Duration,
    ok: bool,
    /// Still running [`DRAIN_LIMIT`] after the end: cut, not failed.
    cut: bool,
    retries: u32,
    differs: bool,
    prompt_tokens: u64,
    cached_tokens: u64,
    /// Milliseconds of the router's answer and of the reference's.
    ms: [f64; 2],
    error: Option<String>,
}

/// Run the bench and print its report.
pub fn run(args: &SoakArgs) -> anyhow::Result<()> {
    crate::print_report(args.json, &measure(args)?, |r| {
        println!("{}", serde_json::to_string_pretty(r).unwrap_or_default());
    })
}

/// Run the bench and return the report (what `--json` prints).
pub fn measure(args: &SoakArgs) -> anyhow::Result<Value> {
    anyhow::ensure!(args.minutes > 0.0, "--minutes must be > 0");
    anyhow::ensure!(
        args.sessions > 0 && args.turns > 0,
        "--sessions and --turns must be > 0"
    );
    let model = crate::model_file(&args.model)?;
    let t0 = Instant::now();
    let bed = Testbed::up(4, args.link_gbit).context("test bed (needs root)")?;
    let h0 = bed.host(0).clone();
    let args = args.clone();
    // Everything below runs inside host 0 (the router, etcd and the
    // reference are there; engine hosts are reached over the bridge).
    h0.spawn(move || {
        let sizes = Sizes {
            disk_mib: args.disk_mib,
            // A tight idle cap (the default is 32) so the end-of-run pool
            // bound has teeth: two batches' worth of connections_per_peer.
            transfer_per_peer: 2 * kvfabric_node::cluster::ClusterConfig::default()
                .transfer_connections_per_peer,
        };
        let mut c = SoakCluster::start(bed, &model, &sizes)?;
        let up_s = t0.elapsed().as_secs_f64();
        let mut report = soak(&args, &mut c);
        if let Ok(r) = report.as_mut() {
            r["wall_s"]["cluster_up_s"] = json!(up_s);
        }
        if report.is_err() {
            for p in c.procs() {
                eprintln!("--- {} ---\n{}", p.name(), p.log_tail(20));
            }
        }
        report
    })
    .join()
    .map_err(|_| anyhow!("soak thread panicked"))??
}

fn soak(args: &SoakArgs, c: &mut SoakCluster) -> anyhow::Result<Value> {
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(args.minutes * 60.0);
    let records = Arc::new(Mutex::new(Vec::<Record>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let drivers: Vec<_> = (0..args.sessions)
        .map(|s| {
            let load = Load {
                router: c.router_addr(),
                reference: c.reference_addr(),
                started,
                cut_at: end + DRAIN_LIMIT,
            };
            let (records, stop, args) = (records.clone(), stop.clone(), args.clone());
            std::thread::spawn(move || drive(s, &args, load, &stop, &records))
        })
        .collect();
    sleep_until((started + Duration::from_secs(args.warmup_s)).min(end));
    let bounds = c.fd_bounds(args.sessions);
    let before = proc_stats(c);
    let mut samples: Vec<Vec<FdSample>> = c.procs().map(|_| Vec::new()).collect();
    sample_fds(c, started, &bounds, &mut samples);
    let starts_before: Vec<u32> = c.procs().map(|p| p.starts()).collect();
    let mut rng = SplitMix64::new(args.seed);
    let every = Duration::from_secs(args.fault_every_s.max(args.hold_s + 1));
    let room = Duration::from_secs(args.hold_s + 10);
    let mut fault_lines = Vec::new();
    for round in faults::schedule(args.seed, 1000) {
        let round_start = Instant::now();
        if round_start + room > end {
            break;
        }
        if !fault_lines.is_empty() {
            sample_fds(c, started, &bounds, &mut samples);
        }
        for &f in &round {
            faults::inject(c, f, &mut rng)?;
        }
        std::thread::sleep(Duration::from_secs(args.hold_s));
        let held = round_start.elapsed();
        for &f in &round {
            let recover = faults::heal(c, f, args.link_gbit);
            fault_lines.push(faults::fault_json(f, round_start - started, held, &recover));
        }
        sleep_until((round_start + every).min(end));
    }
    sleep_until(end);
    let faults_done = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    for d in drivers {
        d.join().map_err(|_| anyhow!("a driver thread panicked"))?;
    }
    let drained = started.elapsed();
    // Quiet: saves and pool returns of the last requests end.
    let settle = settle_fds(c, started, &bounds, &mut samples, SETTLE_LIMIT);
    let after = proc_stats(c);
    let restarted: Vec<bool> = c
        .procs()
        .zip(&starts_before)
        .map(|(p, s)| p.starts() != *s)
        .collect();
    let records = records
        .lock()
        .map_err(|_| anyhow!("records poisoned"))?
        .clone();
    Ok(report(
        args,
        &records,
        &fault_lines,
        c,
        &Measured {
            before,
            after,
            restarted,
            samples,
            bounds,
            wall: json!({
                "faults_done_s": faults_done.as_secs_f64(),
                "drained_s": drained.as_secs_f64(),
                "fds_settled_in_s": settle.as_secs_f64(),
            }),
        },
    ))
}

/// Every process's fd count and TCP connections now, with its incarnation.
fn sample_fds(c: &SoakCluster, started: Instant, bounds: &Bounds, samples: &mut [Vec<FdSample>]) {
    let at_s = started.elapsed().as_secs_f64();
    let now: Vec<_> = c
        .procs()
        .map(|p| {
            let sockets = p
                .pid()
                .map(kvfabric_testbed::tcp_sockets)
                .unwrap_or_default();
            (p.stats(), p.starts(), sockets)
        })
        .collect();
    let socks: Vec<_> = now.iter().map(|(_, _, s)| s.clone()).collect();
    let live = growth::live(&socks);
    for ((stats, starts, sockets), out) in now.iter().zip(samples.iter_mut()) {
        if let Some(st) = stats {
            out.push(growth::sample(
                at_s, *starts, st.fds, sockets, &live, bounds,
            ));
        }
    }
}

/// After the load stopped: sample every second until every process passes
/// the fd rule (batches and saves of the last requests end, keep-alive
/// connections close) or `limit` passed; the last sample stays. Returns
/// how long it took.
fn settle_fds(
    c: &SoakCluster,
    started: Instant,
    bounds: &Bounds,
    samples: &mut [Vec<FdSample>],
    limit: Duration,
) -> Duration {
    let t0 = Instant::now();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let lens: Vec<usize> = samples.iter().map(Vec::len).collect();
        sample_fds(c, started, bounds, samples);
        let pass = samples
            .iter()
            .all(|s| growth::judge(s, bounds)["grew"] == false);
        if pass || t0.elapsed() >= limit {
            return t0.elapsed();
        }
        for (s, n) in samples.iter_mut().zip(lens) {
            s.truncate(n);
        }
    }
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// RSS and fds of every process, with the fds by kind and its TCP
/// connections by peer and state.
type Stats = (Option<ProcStats>, Value, Value);

fn proc_stats(c: &SoakCluster) -> Vec<Stats> {
    c.procs()
        .map(|p| {
            let kinds = p.pid().map(kvfabric_testbed::fd_kinds).unwrap_or_default();
            let tcp = p
                .pid()
                .map(kvfabric_testbed::tcp_summary)
                .unwrap_or_default();
            (p.stats(), json!(kinds), json!(tcp))
        })
        .collect()
}

/// What the report judges processes by.
struct Measured {
    before: Vec<Stats>,
    after: Vec<Stats>,
    restarted: Vec<bool>,
    samples: Vec<Vec<FdSample>>,
    bounds: Bounds,
    /// When the phases after the load's end ended (seconds since the start).
    wall: Value,
}

/// Where a driver sends its load, and until when.
#[derive(Clone, Copy)]
struct Load {
    router: std::net::SocketAddr,
    reference: std::net::SocketAddr,
    started: Instant,
    /// A turn still running here is cut (the end plus [`DRAIN_LIMIT`]).
    cut_at: Instant,
}

/// One session after another until `stop`: each turn through the router
/// (retried), the same prompt on the reference, answers compared.
fn drive(s: usize, args: &SoakArgs, load: Load, stop: &AtomicBool, records: &Mutex<Vec<Record>>) {
    let mut session = s;
    while !stop.load(Ordering::SeqCst) {
        let mut history = session_prompt(args.seed, session);
        for _ in 0..args.turns {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let tokens = args.answer_tokens;
            let t0 = Instant::now();
            let got = client::complete(
                load.router,
                &history,
                tokens,
                (8, Duration::from_secs(1)),
                load.cut_at,
            );
            let t1 = Instant::now();
            let want = client::complete(
                load.reference,
                &history,
                tokens,
                (3, Duration::from_secs(1)),
                load.cut_at,
            );
            let ms = [t1 - t0, t1.elapsed()].map(|d| d.as_secs_f64() * 1e3);
            let mut rec = match (&got, &want) {
                (Ok(g), Ok(w)) => Record {
                    at: load.started.elapsed(),
                    ok: true,
                    cut: false,
                    retries: g.retries,
                    differs: g.text != w.text,
                    prompt_tokens: g.prompt_tokens,
                    cached_tokens: g.cached_tokens,
                    ms,
                    error: None,
                },
                (g, w) => Record {
                    at: load.started.elapsed(),
                    ok: g.is_ok(),
                    cut: false,
                    retries: g.as_ref().map_or(8, |a| a.retries),
                    differs: false,
                    prompt_tokens: 0,
                    cached_tokens: 0,
                    ms,
                    error: Some(format!(
                        "router: {:?} reference: {:?}",
                        g.as_ref().err(),
                        w.as_ref().err()
                    )),
                },
            };
            // Not finished by the drain limit: cut by the bench, not failed.
            rec.cut = rec.error.is_some() && Instant::now() >= load.cut_at;
            let answer = got.map(|a| a.text).unwrap_or_default();
            if let Ok(mut r) = records.lock() {
                r.push(rec);
            }
            history.push_str(&answer);
            history.push_str("\nUser: good, now the next step of the plan.\nAssistant:");
        }
        session += args.sessions;
    }
}

const SYSTEM: &str = "You are a careful coding agent. You can call these tools: \
read_file(path) returns the text of a file; write_file(path, text) replaces a file; \
run(command) runs a shell command and returns its output and exit status; \
search(query) searches the repository and returns matching lines with paths. \
Always explain what you are about to do, call one tool at a time, and check each \
result before the next step. Never invent file contents; read them first. ";

const TOPICS: [&str; 8] = [
    "the cache eviction code",
    "the HTTP router",
    "the disk tier",
    "the transfer engine",
    "the tokenizer",
    "the scheduler",
    "the metrics endpoint",
    "the config loader",
];

/// The first prompt of session `n`: the shared system prompt, then its own task.
fn session_prompt(seed: u64, n: usize) -> String {
    let mut rng = SplitMix64::new(seed.wrapping_mul(31).wrapping_add(n as u64));
    let topic = TOPICS[rng.below(TOPICS.len())];
    format!(
        "{}\nSession {n}. User: read {topic} and list three risks in it, file by file.\nAssistant:",
        SYSTEM.repeat(3)
    )
}

fn report(
    args: &SoakArgs,
    records: &[Record],
    faults: &[Value],
    c: &SoakCluster,
    m: &Measured,
) -> Value {
    let (before, after, restarted) = (&m.before, &m.after, &m.restarted);
    let failed = records.iter().filter(|r| !r.ok && !r.cut).count();
    let cut = records.iter().filter(|r| r.cut).count();
    // The router answered but the reference did not: not compared.
    let unverified = records
        .iter()
        .filter(|r| r.ok && !r.cut && r.error.is_some())
        .count();
    let differing = records.iter().filter(|r| r.differs).count();
    let ms = |i: usize| {
        let mut v: Vec<f64> = records
            .iter()
            .filter(|r| r.error.is_none())
            .map(|r| r.ms[i])
            .collect();
        v.sort_by(f64::total_cmp);
        json!({"p50": v.get(v.len() / 2), "max": v.last()})
    };
    let retried = records.iter().filter(|r| r.ok && r.retries > 0).count();
    let mut buckets: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
    for r in records.iter().filter(|r| r.ok) {
        let b = buckets.entry(r.at.as_secs() / 30 * 30).or_default();
        b.0 += r.cached_tokens;
        b.1 += r.prompt_tokens;
    }
    let hit: Vec<Value> = buckets
        .iter()
        .map(|(t, (cached, prompt))| json!({"from_s": t, "hit_ratio": *cached as f64 / (*prompt).max(1) as f64, "prompt_tokens": prompt}))
        .collect();
    let mut grew = Vec::new();
    let procs: Vec<Value> = c
        .procs()
        .enumerate()
        .map(|(i, p)| {
            let (b, a) = (before[i].0, after[i].0);
            let rss_growth = match (b, a) {
                (Some(b), Some(a)) => a.rss_bytes as f64 / b.rss_bytes.max(1) as f64 - 1.0,
                _ => 0.0,
            };
            let fd_growth = match (b, a) {
                (Some(b), Some(a)) => a.fds as i64 - b.fds as i64,
                _ => 0,
            };
            let fds_judged = growth::judge(&m.samples[i], &m.bounds);
            if (!restarted[i] && rss_growth > 0.10) || fds_judged["grew"] == true {
                grew.push(p.name().to_string());
            }
            json!({
                "name": p.name(),
                "restarted": restarted[i],
                "start": b.map(|s| json!({"rss_bytes": s.rss_bytes, "fds": s.fds})),
                "end": a.map(|s| json!({"rss_bytes": s.rss_bytes, "fds": s.fds})),
                "rss_growth": rss_growth,
                "fd_growth": fd_growth,
                "fds_by_kind": {"start": before[i].1, "end": after[i].1},
                "tcp": {"start": before[i].2, "end": after[i].2},
                "fds_after_warmup": fds_judged,
            })
        })
        .collect();
    let errors: Vec<&str> = records
        .iter()
        .filter_map(|r| r.error.as_deref())
        .take(10)
        .collect();
    json!({
        "minutes": args.minutes,
        "sessions": args.sessions,
        "seed": args.seed,
        "link_gbit": args.link_gbit,
        "requests_sent": records.len(),
        "requests_failed": failed,
        "requests_unverified": unverified,
        "requests_cut_at_end": cut,
        "turn_ms": {"router": ms(0), "no_cache_reference": ms(1)},
        "requests_retried": retried,
        "outputs_differing_from_no_cache": differing,
        "hit_ratio_over_time": hit,
        "processes": procs,
        "processes_grown": grew,
        "fd_bounds": {
            "transfer_per_peer": m.bounds.transfer_per_peer,
            "http_per_peer": m.bounds.http_per_peer,
        },
        "wall_s": m.wall,
        "faults": faults,
        "errors": errors,
        "pass": failed == 0 && unverified == 0 && differing == 0 && grew.is_empty() && !records.is_empty(),
    })
}
