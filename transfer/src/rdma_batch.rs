//! Running a batch over rdma links (feature `rdma`).
//!
//! 1. One pipelined range round trip on a link's control connection
//!    ([`RequestKind::RdmaRange`]): the owner refuses bad ranges before a byte
//!    moves and answers each segment's rkey (and, for checksummed READs, the
//!    checksum of the range). Ops whose local or remote segment has no NIC
//!    registration are handed back to the engine to run over tcp.
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

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::engine::{Inner, PreparedOp};
use crate::io_util::{bounded, read_message};
use crate::metrics::{DirectionLabel, TransportLabel};
use crate::protocol::{
    checksum, decode_rdma_key, Request, RequestKind, Response, Status, FLAG_CHECKSUM,
    RDMA_KEY_BYTES, REQUEST_BYTES, RESPONSE_BYTES,
};
use crate::rdma::{RdmaMemory, RdmaOp};
use crate::rdma_link::RdmaLink;
use crate::segment::RdmaKey;
use crate::{tcp_client, OpKind, SharedRegion, TransferError};

/// Work requests kept posted per queue pair (below its send queue depth).
const WINDOW: usize = 128;
/// Largest slice one work request carries.
const MAX_SLICE: u64 = 1 << 30;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The owner's answer to a range check: the segment's key (None: not
/// registered with its NIC) and the range's checksum when asked.
struct RangeReply {
    key: Option<RdmaKey>,
    checksum: u64,
}

/// Range-check `ops[i]` for every `(i, with_checksum)` in `asks`, pipelined on
/// one control connection. `Err` means the connection broke.
async fn ranges(
    inner: &Inner,
    peer: &str,
    conn: &mut TcpStream,
    ops: &[PreparedOp],
    asks: &[(usize, bool)],
) -> Result<Vec<Result<RangeReply, TransferError>>, TransferError> {
    let timeout = inner.config.op_timeout();
    let mut out = Vec::with_capacity(asks.len() * REQUEST_BYTES);
    for &(i, sum) in asks {
        let op = &ops[i].op;
        let req = Request {
            kind: RequestKind::RdmaRange,
            flags: if sum { FLAG_CHECKSUM } else { 0 },
            segment: op.remote.0,
            op_offset: op.remote_offset,
            op_len: op.len,
            slice_offset: op.remote_offset,
            slice_len: op.len,
            checksum: 0,
        };
        out.extend_from_slice(&req.encode());
    }
    let (mut rd, mut wr) = conn.split();
    let writer = bounded(peer, timeout, wr.write_all(&out));
    let reader = async {
        let mut replies = Vec::with_capacity(asks.len());
        for &(i, _) in asks {
            let mut head = [0u8; RESPONSE_BYTES];
            bounded(peer, timeout, rd.read_exact(&mut head)).await?;
            let resp = Response::decode(&head)?;
            replies.push(match resp.status {
                Status::Ok if resp.payload_len == RDMA_KEY_BYTES as u64 => {
                    let mut key = [0u8; RDMA_KEY_BYTES];
                    bounded(peer, timeout, rd.read_exact(&mut key)).await?;
                    Ok(RangeReply {
                        key: Some(decode_rdma_key(&key)?),
                        checksum: resp.checksum,
                    })
                }
                Status::Ok => {
                    return Err(TransferError::Connection {
                        peer: peer.into(),
                        reason: format!("rdma key of {} bytes", resp.payload_len),
                    })
                }
                status => {
                    let reason =
                        bounded(peer, timeout, read_message(&mut rd, resp.message_len)).await?;
                    if status == Status::Unsupported {
                        Ok(RangeReply {
                            key: None,
                            checksum: 0,
                        })
                    } else {
                        let op = &ops[i].op;
                        Err(tcp_client::refusal(peer, &resp, reason, op, 0, op.len))
                    }
                }
            });
        }
        Ok(replies)
    };
    let ((), replies) = tokio::try_join!(writer, reader)?;
    Ok(replies)
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

/// What a batch over rdma left for the engine.
pub(crate) struct RdmaOutcome {
    /// Per op: its result, or None when it must run over tcp.
    pub results: Vec<Option<Result<(), TransferError>>>,
    /// Links to return to the pool.
    pub healthy: Vec<RdmaLink>,
    /// A link broke: forget the pool and re-decide the transport.
    pub broken: bool,
}

/// Run `ops` over `links` (at least one).
pub(crate) async fn run_batch(
    inner: &Arc<Inner>,
    peer: &str,
    ops: Vec<PreparedOp>,
    mut links: Vec<RdmaLink>,
) -> RdmaOutcome {
    let mut results: Vec<Option<Result<(), TransferError>>> = vec![None; ops.len()];
    let nic = inner.rdma.as_ref();
    let locals: Vec<Option<Arc<RdmaMemory>>> = ops
        .iter()
        .map(|p| nic.and_then(|n| n.memory(p.op.local)))
        .collect();
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
    // Plan the ops the owner accepted; corrupt WRITE sources as armed (test
    // hook) after taking their checksum, to restore once the batch is done.
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
        if let Some(local) = locals[i].clone() {
            plans.push(Plan {
                index: i,
                local,
                remote,
                want,
            });
        }
    }
    let slice = (inner.config.slice_bytes as u64).clamp(4096, MAX_SLICE);
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
    let mut link_error = None;
    if !shared.jobs.is_empty() {
        let mut set = tokio::task::JoinSet::new();
        for mut link in links {
            let shared = shared.clone();
            set.spawn(async move { drive(&shared, &mut link).await.map(|()| link) });
        }
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Ok(link)) => healthy.push(link),
                Ok(Err(e)) => link_error = Some(e),
                Err(e) => link_error = Some(TransferError::Io(format!("rdma task failed: {e}"))),
            }
        }
    } else {
        healthy.extend(links);
    }
    for &i in &corrupted {
        flip_first_byte(&shared.ops[i].local, shared.ops[i].op.local_offset);
    }
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
            (None, _) => Err(link_error
                .clone()
                .unwrap_or_else(|| TransferError::Connection {
                    peer: peer.into(),
                    reason: "op left unfinished".into(),
                })),
        };
        results[plan.index] = Some(r);
    }
    let mut broken = link_error.is_some();
    if !verify.is_empty() {
        let asks: Vec<(usize, bool)> = verify.iter().map(|&i| (i, true)).collect();
        let checked = match healthy.first_mut() {
            Some(l) => ranges(inner, peer, &mut l.conn, &shared.ops, &asks).await,
            None => Err(link_error.clone().unwrap_or(TransferError::Connection {
                peer: peer.into(),
                reason: "no link left to verify writes".into(),
            })),
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
            }
            Err(e) => {
                broken = true;
                for &i in &verify {
                    results[i] = Some(Err(e.clone()));
                }
            }
        }
    }
    for plan in &shared.plans {
        let p = &shared.ops[plan.index];
        match &results[plan.index] {
            Some(Ok(())) => {
                let dir = match p.op.kind {
                    OpKind::Read => DirectionLabel::Read,
                    OpKind::Write => DirectionLabel::Write,
                };
                inner.metrics.op_done(TransportLabel::Rdma, dir, p.op.len);
            }
            _ => inner.metrics.op_failed(TransportLabel::Rdma),
        }
    }
    if broken {
        healthy.clear();
    }
    RdmaOutcome {
        results,
        healthy,
        broken,
    }
}

fn fail_all(
    inner: &Inner,
    results: &mut [Option<Result<(), TransferError>>],
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
