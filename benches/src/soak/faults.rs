//! The soak's faults: a seeded schedule, each fault injected and healed on
//! the running cluster, and the time each took to recover.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::cluster::{wait_healthy, wait_port, SoakCluster};
use crate::agentic::trace::SplitMix64;

/// One kind of fault; engine targets are 0..3 (hosts 1..=3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL of an engine (and its embedded node), then its restart.
    Kill(usize),
    /// etcd stopped (SIGKILL), then started on the same data.
    Etcd,
    /// The engine host's link down (a partition), then up.
    Partition(usize),
    /// The engine host's link throttled to 100 Mbit/s, then restored.
    Throttle(usize),
    /// The engine's disk tier filesystem filled, then freed.
    DiskFull(usize),
    /// One bit flipped in the engine's disk tier data file (not healed: the
    /// checksum must catch it when the block is read).
    BitFlip(usize),
}

/// Every kind, so a schedule shows each at least once.
const KINDS: usize = 6;

impl Fault {
    fn of_kind(kind: usize, target: usize) -> Fault {
        match kind % KINDS {
            0 => Fault::Kill(target),
            1 => Fault::Etcd,
            2 => Fault::Partition(target),
            3 => Fault::Throttle(target),
            4 => Fault::DiskFull(target),
            _ => Fault::BitFlip(target),
        }
    }

    /// The engine it hits, if any.
    pub fn target(&self) -> Option<usize> {
        match *self {
            Fault::Etcd => None,
            Fault::Kill(t)
            | Fault::Partition(t)
            | Fault::Throttle(t)
            | Fault::DiskFull(t)
            | Fault::BitFlip(t) => Some(t),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Fault::Kill(_) => "kill -9 + restart",
            Fault::Etcd => "etcd stop + start",
            Fault::Partition(_) => "link down + up",
            Fault::Throttle(_) => "link throttled to 100 Mbit/s",
            Fault::DiskFull(_) => "disk tier filesystem full",
            Fault::BitFlip(_) => "bit flip in a disk block",
        }
    }
}

/// Faults to inject, one round after another: each round is one fault or
/// (one round in four) two at once on different targets. The kinds cycle
/// in a seeded order so every kind comes early.
pub fn schedule(seed: u64, rounds: usize) -> Vec<Vec<Fault>> {
    let mut rng = SplitMix64::new(seed ^ 0x50a4);
    let mut order: Vec<usize> = (0..KINDS).collect();
    for i in (1..KINDS).rev() {
        order.swap(i, rng.below(i + 1));
    }
    (0..rounds)
        .map(|r| {
            let first = Fault::of_kind(order[r % KINDS], rng.below(3));
            let mut round = vec![first];
            if r >= KINDS && rng.below(4) == 0 {
                let other = (first.target().unwrap_or(0) + 1 + rng.below(2)) % 3;
                let kind = (order[r % KINDS] + 1 + rng.below(KINDS - 1)) % KINDS;
                let second = Fault::of_kind(kind, other);
                if second != Fault::Etcd || first != Fault::Etcd {
                    round.push(second);
                }
            }
            round
        })
        .collect()
}

/// Inject `f`. Returns what heal needs to undo (a filler file).
pub fn inject(c: &mut SoakCluster, f: Fault, rng: &mut SplitMix64) -> anyhow::Result<()> {
    match f {
        Fault::Kill(t) => c.engines[t].kill(),
        Fault::Etcd => c.etcd.kill(),
        Fault::Partition(t) => c.bed.host(t + 1).link_down()?,
        Fault::Throttle(t) => c.bed.host(t + 1).shape(Some(0.1))?,
        Fault::DiskFull(t) => fill(&c.disks[t].dir)?,
        Fault::BitFlip(t) => flip_bit(&c.disks[t].dir.join("tier.data"), rng)?,
    }
    Ok(())
}

/// Undo `f` and wait until what it hit serves again: the time that took.
pub fn heal(c: &mut SoakCluster, f: Fault, link_gbit: Option<f64>) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let limit = Duration::from_secs(90);
    match f {
        Fault::Kill(t) => {
            c.engines[t].restart()?;
            wait_healthy(&mut c.engines[t], limit)?;
        }
        Fault::Etcd => {
            c.etcd.restart()?;
            wait_port(
                std::net::SocketAddr::from((c.bed.host(0).ip(), 2379)),
                limit,
            )?;
        }
        Fault::Partition(t) => {
            c.bed.host(t + 1).link_up()?;
            wait_healthy(&mut c.engines[t], limit)?;
        }
        Fault::Throttle(t) => c.bed.host(t + 1).shape(link_gbit)?,
        Fault::DiskFull(t) => {
            let _ = std::fs::remove_file(c.disks[t].dir.join("filler"));
        }
        Fault::BitFlip(_) => {}
    }
    Ok(started.elapsed())
}

/// Fill the filesystem of `dir` until it refuses more.
fn fill(dir: &std::path::Path) -> anyhow::Result<()> {
    let mut f = std::fs::File::create(dir.join("filler"))?;
    let chunk = vec![0u8; 1 << 20];
    loop {
        match f.write(&chunk) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Flip one bit at a random offset of the written part of `file` (blocks
/// are placed from the start of the data file).
fn flip_bit(file: &std::path::Path, rng: &mut SplitMix64) -> anyhow::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)?;
    let len = f.metadata()?.len().min(8 << 20);
    anyhow::ensure!(len > 0, "empty disk tier file {}", file.display());
    let at = rng.next_u64() % len;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at)?;
    b[0] ^= 1 << rng.below(8);
    f.write_all_at(&b, at)?;
    Ok(())
}

/// One fault's line in the report.
pub fn fault_json(
    f: Fault,
    at: Duration,
    held: Duration,
    recover: &anyhow::Result<Duration>,
) -> Value {
    json!({
        "fault": f.name(),
        "target": f.target().map(|t| format!("e{}", t + 1)),
        "at_s": at.as_secs_f64(),
        "held_s": held.as_secs_f64(),
        "recover_ms": recover.as_ref().ok().map(|d| d.as_secs_f64() * 1e3),
        "recover_error": recover.as_ref().err().map(|e| e.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_comes_in_the_first_rounds_and_the_schedule_is_seeded() {
        let s = schedule(7, 6);
        let names: std::collections::BTreeSet<_> = s.iter().map(|r| r[0].name()).collect();
        assert_eq!(names.len(), KINDS);
        assert_eq!(schedule(7, 20), schedule(7, 20));
        assert_ne!(schedule(7, 20), schedule(8, 20));
    }
}
