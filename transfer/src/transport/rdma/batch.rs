//! Running a batch over rdma links (feature `rdma`).
//!
//! 1. One pipelined range round trip on a link's control connection
//!    (`control.rs`): the owner refuses bad ranges before a byte
//!    moves and answers each segment's rkey (and, for checksummed READs, the
//!    checksum of the range). Ops whose local or remote segment has no NIC
//!    registration are handed back (`None` slots) to run over tcp.
//! 2. One RDMA READ/WRITE work request per slice (`slice_bytes`), sprayed over
//!    the batch's queue pairs, at most [`WINDOW`] posted per queue pair;
//!    completions are awaited (no spinning) with the op timeout.
//! 3. Checksums verified after arrival: a READ's locally against the owner's,
//!    a WRITE's by a second range round trip that asks the owner for the
//!    checksum of what landed.
//!
//! A failed work request or a timeout fails every unfinished op and breaks
//! the links (their queue pairs are destroyed, so nothing lands later); no op
//! is reported successful unless all of its bytes arrived.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::control::{ranges, RangeReply};
use super::link::{RdmaLink, RdmaPeer};
use super::nic::Nic;
use super::verbs::{RdmaMemory, RdmaOp};
use crate::checksum::checksum;
use crate::core::{connections_for, lock, Inner, OpResult, PreparedOp};
use crate::error::ConnectionFault;
use crate::metrics::{DirectionLabel, TransportLabel};
use crate::segment::RdmaKey;
use crate::transport::contract::BatchTransport;
use crate::transport::idle::IdleLimits;
use crate::{OpKind, SharedRegion, TransferError};

/// Work requests kept posted per queue pair (below its send queue depth).
const WINDOW: usize = 128;
/// Largest slice one work request carries.
const MAX_SLICE: u64 = 1 << 30;

impl BatchTransport for RdmaPeer {
    /// Ops whose segments have no NIC registration go over tcp.
    const HANDS_BACK: bool = true;

    async fn run_batch(
        &self,
        inner: &Arc<Inner>,
        peer: &str,
        ops: Vec<PreparedOp>,
    ) -> Vec<Option<OpResult>> {
        let n = ops.len();
        let slice = inner.config.slice_bytes.max(4096) as u64;
        let want = connections_for(&ops, slice, inner.config.connections_per_peer);
        let links = match self.checkout(inner, peer, want).await {
            Ok(l) => l,
            Err(e) => {
                self.finished(peer, false, true);
                return vec![Some(Err(e)); n];
            }
        };
        let out = run_links(inner, &self.nic, peer, ops, links).await;
        let any_ok = out.results.iter().any(|r| matches!(r, Some(Ok(()))));
        self.finished(peer, any_ok, out.broken);
        self.put_back(out.healthy, IdleLimits::of(&inner.config));
        out.results
    }
}

/// One op going over rdma.
struct Plan {
    /// Its index in the batch.
    index: usize,
    local: Arc<RdmaMemory>,
    remote: RdmaKey,
    /// The checksum to verify after arrival (READ: the owner's; WRITE: ours).
    want: Option<u64>,
}

/// One work request: `len` bytes at `at` of plan `plan`'s op.
struct Job {
    plan: usize,
    at: u64,
    len: u32,
}

#[derive(Default)]
struct Tally {
    left: usize,
    error: Option<TransferError>,
}

/// What the queue pairs of one batch share.
struct Shared {
    ops: Vec<PreparedOp>,
    plans: Vec<Plan>,
    jobs: Vec<Job>,
    next: AtomicUsize,
    abort: AtomicBool,
    tallies: Mutex<Vec<Tally>>,
    timeout: Duration,
    peer: String,
}

/// What a batch over rdma links left.
struct RdmaOutcome {
    /// Per op: its result, or None when it must run over tcp.
    results: Vec<Option<OpResult>>,
    /// Links to return to the pool.
    healthy: Vec<RdmaLink>,
    /// A link broke: forget the pool and re-decide the transport.
    broken: bool,
}

/// Run `ops` over `links` (at least one).
async fn run_links(
    inner: &Arc<Inner>,
    nic: &Nic,
    peer: &str,
    ops: Vec<PreparedOp>,
    mut links: Vec<RdmaLink>,
) -> RdmaOutcome {
    let mut results: Vec<Option<OpResult>> = vec![None; ops.len()];
    let locals: Vec<Option<Arc<RdmaMemory>>> = ops.iter().map(|p| nic.memory(p.op.local)).collect();
    let asks: Vec<(usize, bool)> = (0..ops.len())
        .filter(|&i| locals[i].is_some())
        .map(|i| (i, ops[i].op.checksum && ops[i].op.kind == OpKind::Read))
        .collect();
    if asks.is_empty() || links.is_empty() {
        return RdmaOutcome {
            results,
            healthy: links,
            broken: false,
        };
    }
    let replies = match ranges(inner, peer, &mut links[0].conn, &ops, &asks).await {
        Ok(r) => r,
        Err(e) => {
            fail_all(inner, &mut results, &asks, &e);
            return RdmaOutcome {
                results,
                healthy: Vec::new(),
                broken: true,
            };
        }
    };
    let (plans, corrupted) = plan(inner, &ops, locals, &asks, replies, &mut results);
    let slice = (inner.config.slice_bytes as u64).clamp(4096, MAX_SLICE);
    let (jobs, tallies) = slice_jobs(&ops, &plans, slice);
    let spare = links.split_off(jobs.len().clamp(1, links.len()));
    let shared = Arc::new(Shared {
        ops,
        plans,
        jobs,
        next: AtomicUsize::new(0),
        abort: AtomicBool::new(false),
        tallies: Mutex::new(tallies),
        timeout: inner.config.op_timeout(),
        peer: peer.to_string(),
    });
    let mut healthy = spare;
    let link_error = drive_all(&shared, links, &mut healthy).await;
    for &i in &corrupted {
        flip_first_byte(&shared.ops[i].local, shared.ops[i].op.local_offset);
    }
    let verify = settle(inner, &shared, link_error.as_ref(), &mut results);
    let mut broken = link_error.is_some();
    if !verify.is_empty() {
        let links = healthy.first_mut();
        broken |= !verify_writes(inner, &shared, &verify, links, link_error, &mut results).await;
    }
    count(inner, &shared, &results);
    if broken {
        healthy.clear();
    }
    RdmaOutcome {
        results,
        healthy,
        broken,
    }
}

/// Plan the ops the owner accepted; corrupt WRITE sources as armed (test
/// hook) after taking their checksum, to restore once the batch is done.
/// Returns the plans and the ops corrupted.
fn plan(
    inner: &Inner,
    ops: &[PreparedOp],
    mut locals: Vec<Option<Arc<RdmaMemory>>>,
    asks: &[(usize, bool)],
    replies: Vec<Result<RangeReply, TransferError>>,
    results: &mut [Option<OpResult>],
) -> (Vec<Plan>, Vec<usize>) {
    let mut plans = Vec::new();
    let mut corrupted = Vec::new();
    for (&(i, _), reply) in asks.iter().zip(replies) {
        let (remote, owner_sum) = match reply {
            Err(e) => {
                inner.metrics.op_failed(TransportLabel::Rdma);
                results[i] = Some(Err(e));
                continue;
            }
            Ok(RangeReply { key: None, .. }) => continue,
            Ok(RangeReply {
                key: Some(k),
                checksum,
            }) => (k, checksum),
        };
        let p = &ops[i];
        let want = match (p.op.checksum, p.op.kind) {
            (false, _) => None,
            (true, OpKind::Read) => Some(owner_sum),
            (true, OpKind::Write) => {
                // SAFETY: local range checked at prepare; the caller owns it
                // for the duration of the batch.
                let src = unsafe { p.local.slice(p.op.local_offset as usize, p.op.len as usize) };
                let sum = src.map(checksum).ok();
                if sum.is_some() && inner.take_corruption() {
                    flip_first_byte(&p.local, p.op.local_offset);
                    corrupted.push(i);
                }
                sum
            }
        };
        if let Some(local) = locals[i].take() {
            plans.push(Plan {
                index: i,
                local,
                remote,
                want,
            });
        }
    }
    (plans, corrupted)
}

/// One work request per `slice` bytes of every planned op; one tally per plan.
fn slice_jobs(ops: &[PreparedOp], plans: &[Plan], slice: u64) -> (Vec<Job>, Vec<Tally>) {
    let mut jobs = Vec::new();
    let mut tallies = Vec::with_capacity(plans.len());
    for (k, plan) in plans.iter().enumerate() {
        let len = ops[plan.index].op.len;
        let mut at = 0;
        let mut n = 0;
        while at < len {
            let l = slice.min(len - at);
            jobs.push(Job {
                plan: k,
                at,
                len: l as u32,
            });
            at += l;
            n += 1;
        }
        tallies.push(Tally {
            left: n,
            error: None,
        });
    }
    (jobs, tallies)
}

/// Drive the jobs over every link, one task each; the links that finished
/// cleanly join `healthy`. The last link error, if any.
async fn drive_all(
    shared: &Arc<Shared>,
    links: Vec<RdmaLink>,
    healthy: &mut Vec<RdmaLink>,
) -> Option<TransferError> {
    if shared.jobs.is_empty() {
        healthy.extend(links);
        return None;
    }
    let mut link_error = None;
    let mut set = tokio::task::JoinSet::new();
    for mut link in links {
        let shared = shared.clone();
        set.spawn(async move { drive(&shared, &mut link).await.map(|()| link) });
    }
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(link)) => healthy.push(link),
            Ok(Err(e)) => link_error = Some(e),
            Err(e) => link_error = Some(TransferError::io_other("rdma task", e)),
        }
    }
    link_error
}

/// Settle every plan from its tally: done (READ checksums verified here),
/// failed, or left unfinished by `link_error`. Returns the checksummed
/// WRITEs that landed, to verify with their owner.
fn settle(
    inner: &Inner,
    shared: &Shared,
    link_error: Option<&TransferError>,
    results: &mut [Option<OpResult>],
) -> Vec<usize> {
    let tallies = std::mem::take(&mut *lock(&shared.tallies));
    let mut verify = Vec::new();
    for (plan, t) in shared.plans.iter().zip(tallies) {
        let p = &shared.ops[plan.index];
        let r = match (t.error, t.left) {
            (Some(e), _) => Err(e),
            (None, 0) => match (plan.want, p.op.kind) {
                (Some(want), OpKind::Read) => verify_read(inner, p, want),
                (Some(_), OpKind::Write) => {
                    verify.push(plan.index);
                    continue;
                }
                (None, _) => Ok(()),
            },
            (None, _) => Err(link_error.cloned().unwrap_or_else(|| {
                TransferError::connection(&shared.peer, ConnectionFault::Unfinished)
            })),
        };
        results[plan.index] = Some(r);
    }
    verify
}

/// A second range round trip on `link` asks the owner for the checksum of
/// what each WRITE in `verify` left; false when that broke the link.
async fn verify_writes(
    inner: &Inner,
    shared: &Shared,
    verify: &[usize],
    link: Option<&mut RdmaLink>,
    link_error: Option<TransferError>,
    results: &mut [Option<OpResult>],
) -> bool {
    let peer = shared.peer.as_str();
    let asks: Vec<(usize, bool)> = verify.iter().map(|&i| (i, true)).collect();
    let checked = match link {
        Some(l) => ranges(inner, peer, &mut l.conn, &shared.ops, &asks).await,
        None => Err(link_error.unwrap_or(TransferError::connection(
            peer,
            ConnectionFault::NoLinkToVerify,
        ))),
    };
    let wants: HashMap<usize, Option<u64>> =
        shared.plans.iter().map(|p| (p.index, p.want)).collect();
    match checked {
        Ok(replies) => {
            for (&i, reply) in verify.iter().zip(replies) {
                let op = &shared.ops[i].op;
                results[i] = Some(match reply {
                    Ok(r) if Some(r.checksum) == wants.get(&i).copied().flatten() => Ok(()),
                    Ok(_) => Err(TransferError::Checksum {
                        segment: op.remote.0,
                        offset: op.remote_offset,
                        len: op.len,
                    }),
                    Err(e) => Err(e),
                });
            }
            true
        }
        Err(e) => {
            for &i in verify {
                results[i] = Some(Err(e.clone()));
            }
            false
        }
    }
}

/// Count every planned op in the rdma metrics.
fn count(inner: &Inner, shared: &Shared, results: &[Option<OpResult>]) {
    for plan in &shared.plans {
        let p = &shared.ops[plan.index];
        match &results[plan.index] {
            Some(Ok(())) => {
                let dir = DirectionLabel::of(p.op.kind);
                inner.metrics.op_done(TransportLabel::Rdma, dir, p.op.len);
            }
            _ => inner.metrics.op_failed(TransportLabel::Rdma),
        }
    }
}

fn fail_all(
    inner: &Inner,
    results: &mut [Option<OpResult>],
    asks: &[(usize, bool)],
    e: &TransferError,
) {
    for &(i, _) in asks {
        inner.metrics.op_failed(TransportLabel::Rdma);
        results[i] = Some(Err(e.clone()));
    }
}

/// Test hook: flip the first byte of an op's local range (twice restores it).
fn flip_first_byte(region: &SharedRegion, offset: u64) {
    // SAFETY: the range was checked at prepare; test-only fault injection.
    if let Ok(b) = unsafe { region.slice_mut(offset as usize, 1) } {
        b[0] ^= 0xff;
    }
}

/// Check a READ that arrived against the owner's checksum of the range.
fn verify_read(inner: &Inner, p: &PreparedOp, want: u64) -> Result<(), TransferError> {
    if inner.take_corruption() {
        flip_first_byte(&p.local, p.op.local_offset);
    }
    // SAFETY: local range checked at prepare; every slice has completed.
    let got =
        unsafe { p.local.slice(p.op.local_offset as usize, p.op.len as usize) }.map(checksum)?;
    if got == want {
        Ok(())
    } else {
        Err(TransferError::Checksum {
            segment: p.op.local.0,
            offset: p.op.local_offset,
            len: p.op.len,
        })
    }
}

/// Keep up to [`WINDOW`] work requests posted on one queue pair until the
/// batch's jobs run out (or another queue pair failed), reaping completions.
/// Returns Ok only with nothing left posted, so the link may be reused.
async fn drive(shared: &Shared, link: &mut RdmaLink) -> Result<(), TransferError> {
    let mut posted = 0usize;
    let fail = |e: TransferError| {
        shared.abort.store(true, Ordering::Relaxed);
        Err(e)
    };
    loop {
        while posted < WINDOW && !shared.abort.load(Ordering::Relaxed) {
            let i = shared.next.fetch_add(1, Ordering::Relaxed);
            let Some(job) = shared.jobs.get(i) else {
                break;
            };
            let plan = &shared.plans[job.plan];
            let op = &shared.ops[plan.index].op;
            let wr = RdmaOp {
                kind: op.kind,
                local_offset: op.local_offset + job.at,
                remote: plan.remote,
                remote_offset: op.remote_offset + job.at,
                len: job.len,
                wr_id: i as u64,
            };
            if let Err(e) = link.qp.post(&plan.local, wr) {
                lock(&shared.tallies)[job.plan]
                    .error
                    .get_or_insert(e.clone());
                return fail(e);
            }
            posted += 1;
        }
        if posted == 0 {
            return Ok(());
        }
        let done = match link.qp.completions(posted, shared.timeout).await {
            Ok(d) => d,
            Err(TransferError::Timeout { timeout_ms, .. }) => {
                return fail(TransferError::Timeout {
                    peer: shared.peer.clone(),
                    timeout_ms,
                })
            }
            Err(e) => return fail(e),
        };
        let mut failed = None;
        let mut tallies = lock(&shared.tallies);
        for (wr_id, r) in done {
            posted = posted.saturating_sub(1);
            let Some(job) = shared.jobs.get(wr_id as usize) else {
                continue;
            };
            let t = &mut tallies[job.plan];
            match r {
                Ok(()) => t.left = t.left.saturating_sub(1),
                Err(e) => {
                    t.error.get_or_insert(e.clone());
                    failed.get_or_insert(e);
                }
            }
        }
        drop(tallies);
        if let Some(e) = failed {
            // The queue pair is in the error state now; it goes with the link.
            return fail(e);
        }
    }
}
