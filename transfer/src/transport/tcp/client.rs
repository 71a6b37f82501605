//! The tcp transport's initiating side: opens pooled connections to a peer,
//! cuts ops into slices, sprays them over several connections with a few
//! slices in flight on each, and receives READ payloads straight into the
//! destination segment (an encoded one, `wire.rs`, is checked whole, then
//! decoded into it). Any connection failure fails every unfinished op.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::choice::{asks_encoded, Plan};
use super::conn::{frame_ok, open, recv_payload, send_frame, send_payload, Link};
use super::protocol::{
    Request, RequestKind, Response, Status, FLAG_CAPABILITY, FLAG_CHECKSUM, FLAG_ENCODE,
    RESPONSE_BYTES,
};
use super::wire::decode_slice;
use crate::checksum::checksum;
use crate::core::{lock, Inner, OpResult, PreparedOp};
use crate::error::{ConnectionFault, ForbiddenReason, Missing, RefusalReason};
use crate::hello::Hello;
use crate::metrics::{DirectionLabel, TransportLabel};
use crate::op::{OpKind, TransferOp};
use crate::security::ConnMac;
use crate::transport::io::{bounded, cpu_bound, read_message};
use crate::TransferError;

/// Open a connection, authenticate it (secured modes) and exchange hellos.
pub(crate) async fn connect(inner: &Inner, addr: &str) -> Result<(Link, Hello), TransferError> {
    let timeout = inner.config.op_timeout();
    let stream = bounded(addr, timeout, TcpStream::connect(addr)).await?;
    inner.metrics.link_opened(TransportLabel::Tcp);
    stream
        .set_nodelay(true)
        .map_err(|e| TransferError::io("tcp set_nodelay", e))?;
    open(inner, addr, stream).await
}

/// One slice of one op.
struct SliceJob {
    op: usize,
    /// Offset of the slice from the start of its op.
    at: u64,
    len: u64,
}

#[derive(Default)]
struct Tally {
    slices_left: usize,
    error: Option<TransferError>,
}

/// What a batch's READ replies measured, for the wire-compression chooser
/// and the codec's speeds (`choice.rs`, `wire.rs`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WireReport {
    /// READ payload bytes on the wire, and the bytes they stood for.
    pub wire: u64,
    pub raw: u64,
    /// Of those, the slices that asked for encoding (encoded or not).
    pub asked_wire: u64,
    pub asked_raw: u64,
    /// Slices that arrived encoded; bytes decoded and the time it took.
    pub encoded_slices: u64,
    pub decoded: u64,
    pub decode_time: Duration,
}

#[derive(Default)]
struct WireTally {
    wire: AtomicU64,
    raw: AtomicU64,
    asked_wire: AtomicU64,
    asked_raw: AtomicU64,
    encoded_slices: AtomicU64,
    decoded: AtomicU64,
    decode_ns: AtomicU64,
}

impl WireTally {
    fn add(&self, asked: bool, wire: u64, raw: u64) {
        self.wire.fetch_add(wire, Ordering::Relaxed);
        self.raw.fetch_add(raw, Ordering::Relaxed);
        if asked {
            self.asked_wire.fetch_add(wire, Ordering::Relaxed);
            self.asked_raw.fetch_add(raw, Ordering::Relaxed);
        }
    }

    fn report(&self) -> WireReport {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WireReport {
            wire: get(&self.wire),
            raw: get(&self.raw),
            asked_wire: get(&self.asked_wire),
            asked_raw: get(&self.asked_raw),
            encoded_slices: get(&self.encoded_slices),
            decoded: get(&self.decoded),
            decode_time: Duration::from_nanos(get(&self.decode_ns)),
        }
    }
}

/// What the connections of one batch share.
struct BatchShared {
    inner: Arc<Inner>,
    peer: String,
    ops: Vec<PreparedOp>,
    jobs: Vec<SliceJob>,
    next_job: AtomicUsize,
    abort: AtomicBool,
    tallies: Mutex<Vec<Tally>>,
    /// Whether hinted READs ask for encoded replies (on links whose peer
    /// supports it).
    plan: Plan,
    wire: WireTally,
}

/// Run `ops` over `conns` (at least one) as `plan` says. Returns per-op
/// results, the connections that are still healthy (to go back to the
/// pool) and what the READ replies measured.
pub(crate) async fn run_batch(
    inner: &Arc<Inner>,
    peer: &str,
    ops: Vec<PreparedOp>,
    mut conns: Vec<Link>,
    plan: Plan,
) -> (Vec<OpResult>, Vec<Link>, WireReport) {
    let (jobs, tallies) = slice_jobs(&ops, inner.config.slice_bytes.max(4096) as u64);
    conns.truncate(jobs.len().max(1));
    let shared = Arc::new(BatchShared {
        inner: inner.clone(),
        peer: peer.to_string(),
        ops,
        jobs,
        next_job: AtomicUsize::new(0),
        abort: AtomicBool::new(false),
        tallies: Mutex::new(tallies),
        plan,
        wire: WireTally::default(),
    });
    let (mut healthy, conn_error) = drive_all(&shared, conns).await;
    let tallies = std::mem::take(&mut *lock(&shared.tallies));
    let results = tallies
        .into_iter()
        .map(|t| match (t.error, t.slices_left) {
            (Some(e), _) => Err(e),
            (None, 0) => Ok(()),
            (None, _) => Err(conn_error
                .clone()
                .unwrap_or_else(|| TransferError::connection(peer, ConnectionFault::Unfinished))),
        })
        .collect();
    if conn_error.is_some() {
        healthy.clear();
    }
    (results, healthy, shared.wire.report())
}

/// Cut every op into slices of at most `slice` bytes; one tally per op.
fn slice_jobs(ops: &[PreparedOp], slice: u64) -> (Vec<SliceJob>, Vec<Tally>) {
    let mut jobs = Vec::new();
    let mut tallies = Vec::with_capacity(ops.len());
    for (i, p) in ops.iter().enumerate() {
        let mut at = 0;
        let mut n = 0;
        while at < p.op.len {
            let len = slice.min(p.op.len - at);
            jobs.push(SliceJob { op: i, at, len });
            at += len;
            n += 1;
        }
        tallies.push(Tally {
            slices_left: n,
            error: None,
        });
    }
    (jobs, tallies)
}

/// Drive the batch's slices over every connection; the connections that
/// finished cleanly, and the last connection error.
async fn drive_all(
    shared: &Arc<BatchShared>,
    conns: Vec<Link>,
) -> (Vec<Link>, Option<TransferError>) {
    let mut healthy = Vec::new();
    let mut conn_error = None;
    if shared.jobs.len() == 1 && conns.len() == 1 {
        // One slice (a small op): request then reply on this task, no
        // channel, no join, no spawn on the latency path.
        for mut c in conns {
            let timeout = shared.inner.config.op_timeout();
            let mac = c.mac.clone();
            let encode = shared.plan.encode && c.peer_codec;
            let (mut rd, mut wr) = c.conn.split();
            let mac = mac.as_deref();
            let mut scratch = Vec::new();
            let outcome = match send_request(shared, &mut wr, mac, 0, encode, timeout).await {
                Ok(()) => {
                    let ends = Ends {
                        mac,
                        encode,
                        timeout,
                    };
                    receive_reply(shared, &mut rd, &ends, 0, &mut scratch).await
                }
                Err(e) => Err(e),
            };
            match outcome {
                Ok(()) => healthy.push(c),
                Err(e) => conn_error = Some(e),
            }
        }
    } else if conns.len() == 1 {
        // Small batches: no task spawn.
        for mut c in conns {
            match drive_connection(shared, &mut c).await {
                Ok(()) => healthy.push(c),
                Err(e) => conn_error = Some(e),
            }
        }
    } else {
        let mut set = tokio::task::JoinSet::new();
        for mut c in conns {
            let shared = shared.clone();
            set.spawn(async move { drive_connection(&shared, &mut c).await.map(|()| c) });
        }
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Ok(c)) => healthy.push(c),
                Ok(Err(e)) => conn_error = Some(e),
                Err(e) => {
                    let task = ConnectionFault::Task(std::io::Error::other(e).into());
                    conn_error = Some(TransferError::connection(&shared.peer, task))
                }
            }
        }
    }
    (healthy, conn_error)
}

/// Pump slices through one connection: a writer sends requests (at most
/// `pipeline_depth` ahead of the replies), a reader consumes replies in order.
async fn drive_connection(shared: &BatchShared, link: &mut Link) -> Result<(), TransferError> {
    let depth = shared.inner.config.pipeline_depth.max(1);
    let timeout = shared.inner.config.op_timeout();
    let mac = link.mac.clone();
    let mac = mac.as_deref();
    let encode = shared.plan.encode && link.peer_codec;
    let (mut rd, mut wr) = link.conn.split();
    let (tx, mut rx) = mpsc::channel::<usize>(depth);
    let writer = async {
        loop {
            if shared.abort.load(Ordering::Relaxed) {
                break;
            }
            let Ok(permit) = tx.reserve().await else {
                break;
            };
            let i = shared.next_job.fetch_add(1, Ordering::Relaxed);
            if i >= shared.jobs.len() {
                break;
            }
            if let Err(e) = send_request(shared, &mut wr, mac, i, encode, timeout).await {
                shared.abort.store(true, Ordering::Relaxed);
                return Err(e);
            }
            permit.send(i);
        }
        drop(tx);
        Ok(())
    };
    let reader = async {
        let ends = Ends {
            mac,
            encode,
            timeout,
        };
        // Encoded replies land here, are checked whole, then decoded.
        let mut scratch = Vec::new();
        while let Some(i) = rx.recv().await {
            if let Err(e) = receive_reply(shared, &mut rd, &ends, i, &mut scratch).await {
                shared.abort.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
        Ok(())
    };
    tokio::try_join!(writer, reader).map(|_| ())
}

/// Send slice `i`'s request (a WRITE's payload with it); `encode`: the
/// batch's plan asks, and this link's peer supports, encoded READ replies.
async fn send_request<W: AsyncWrite + Unpin>(
    shared: &BatchShared,
    wr: &mut W,
    mac: Option<&ConnMac>,
    i: usize,
    encode: bool,
    timeout: Duration,
) -> Result<(), TransferError> {
    let job = &shared.jobs[i];
    let p = &shared.ops[job.op];
    let kind = match p.op.kind {
        OpKind::Read => RequestKind::Read,
        OpKind::Write => RequestKind::Write,
    };
    let cap = p.op.capability.map(|c| c.encode());
    let asked = asks_encoded(p, encode);
    let flags = if p.op.checksum { FLAG_CHECKSUM } else { 0 }
        | if cap.is_some() { FLAG_CAPABILITY } else { 0 }
        | if asked { FLAG_ENCODE } else { 0 };
    let mut req = Request {
        kind,
        flags,
        width: if asked { p.op.element_width } else { 0 },
        segment: p.op.remote.0,
        op_offset: p.op.remote_offset,
        op_len: p.op.len,
        slice_offset: p.op.remote_offset.wrapping_add(job.at),
        slice_len: job.len,
        checksum: 0,
    };
    match p.op.kind {
        OpKind::Read => {
            let cap = cap.as_ref().map_or(&[][..], |c| &c[..]);
            bounded(
                &shared.peer,
                timeout,
                send_frame(wr, mac, &req.encode(), cap),
            )
            .await
        }
        OpKind::Write => {
            // SAFETY: the local range was checked when the op was prepared;
            // the caller owns it for the duration of the batch.
            let data = unsafe {
                p.local
                    .slice((p.op.local_offset + job.at) as usize, job.len as usize)?
            };
            if p.op.checksum && mac.is_none() {
                req.checksum = checksum(data);
            }
            let head = req.encode();
            // Fault injection: corrupted in flight, under the sender's tag.
            let corrupt = shared.inner.take_corruption();
            let sent = send_payload(wr, mac, &head, data, corrupt);
            bounded(&shared.peer, timeout, sent).await
        }
    }
}

/// A connection's receiving side: its MAC, whether its READs ask for
/// encoded replies, the op timeout.
struct Ends<'a> {
    mac: Option<&'a ConnMac>,
    encode: bool,
    timeout: Duration,
}

async fn receive_reply<R: AsyncRead + Unpin>(
    shared: &BatchShared,
    rd: &mut R,
    ends: &Ends<'_>,
    i: usize,
    scratch: &mut Vec<u8>,
) -> Result<(), TransferError> {
    let (mac, timeout) = (ends.mac, ends.timeout);
    let job = &shared.jobs[i];
    let p = &shared.ops[job.op];
    let peer = &shared.peer;
    let mut head = [0u8; RESPONSE_BYTES];
    bounded(peer, timeout, rd.read_exact(&mut head)).await?;
    let resp = Response::decode(&head)?;
    let outcome = match resp.status {
        Status::Ok => match p.op.kind {
            OpKind::Read => receive_read(shared, rd, ends, &head, &resp, i, scratch).await?,
            OpKind::Write => {
                if bounded(peer, timeout, frame_ok(rd, mac, &head, &[])).await? {
                    Ok(())
                } else {
                    Err(altered(peer))
                }
            }
        },
        _ => {
            let reason = bounded(peer, timeout, read_message(rd, resp.message_len)).await?;
            if !bounded(peer, timeout, frame_ok(rd, mac, &head, reason.as_bytes())).await? {
                return Err(altered(peer));
            }
            Err(refusal(peer, &resp, reason, &p.op, job.at, job.len))
        }
    };
    let mut tallies = lock(&shared.tallies);
    let t = &mut tallies[job.op];
    t.slices_left = t.slices_left.saturating_sub(1);
    if let Err(e) = outcome {
        t.error.get_or_insert(e);
    }
    Ok(())
}

/// A successful READ reply's payload into the op's destination. Raw: read
/// in place and checked. Encoded (only when asked, and smaller than the
/// slice): read whole into `scratch` and checked (checksum or MAC over the
/// bytes on the wire, as sent) before a byte is decoded into the
/// destination, so a payload corrupted in flight never lands there. Err:
/// the connection is out of step; Ok(Err): this op failed.
async fn receive_read<R: AsyncRead + Unpin>(
    shared: &BatchShared,
    rd: &mut R,
    ends: &Ends<'_>,
    head: &[u8],
    resp: &Response,
    i: usize,
    scratch: &mut Vec<u8>,
) -> Result<OpResult, TransferError> {
    let job = &shared.jobs[i];
    let p = &shared.ops[job.op];
    let peer = &shared.peer;
    let asked = asks_encoded(p, ends.encode);
    let fits = match resp.encoded {
        true => asked && resp.payload_len < job.len,
        false => resp.payload_len == job.len,
    };
    if !fits {
        let fault = ConnectionFault::PayloadSize {
            len: resp.payload_len,
            slice: job.len,
            encoded: resp.encoded,
            asked,
        };
        return Err(TransferError::connection(peer, fault));
    }
    let at = p.op.local_offset + job.at;
    // SAFETY: local range checked at prepare; received (or decoded) in place.
    let dst = unsafe { p.local.slice_mut(at as usize, job.len as usize)? };
    let sum = p.op.checksum.then_some(resp.checksum);
    let (mac, timeout) = (ends.mac, ends.timeout);
    let corrupt = TransferError::Checksum {
        segment: p.op.local.0,
        offset: at,
        len: job.len,
    };
    if !resp.encoded {
        let intact = bounded(peer, timeout, recv_payload(rd, mac, head, dst, sum)).await?;
        shared.wire.add(asked, job.len, job.len);
        return Ok(if intact { Ok(()) } else { Err(corrupt) });
    }
    scratch.resize(resp.payload_len as usize, 0);
    let intact = bounded(peer, timeout, recv_payload(rd, mac, head, scratch, sum)).await?;
    shared.wire.add(true, resp.payload_len, job.len);
    if !intact {
        return Ok(Err(corrupt));
    }
    let started = Instant::now();
    let decoded = cpu_bound(|| decode_slice(scratch, dst));
    let w = &shared.wire;
    w.decode_ns
        .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    w.decoded.fetch_add(job.len, Ordering::Relaxed);
    w.encoded_slices.fetch_add(1, Ordering::Relaxed);
    let m = &shared.inner.metrics;
    m.wire_encoded(DirectionLabel::Read, resp.payload_len, job.len);
    Ok(decoded.map_err(|error| TransferError::Decode {
        segment: p.op.local.0,
        offset: at,
        len: job.len,
        error,
    }))
}

/// The error a peer's non-OK response means for (the slice at `at`, `len`
/// bytes of) `op`; `reason` is the message that followed the header (the
/// peer's own text, kept as it sent it).
pub(crate) fn refusal(
    peer: &str,
    resp: &Response,
    reason: String,
    op: &TransferOp,
    at: u64,
    len: u64,
) -> TransferError {
    match resp.status {
        Status::UnknownSegment => TransferError::UnknownSegment {
            side: peer.to_string(),
            segment: op.remote.0,
        },
        Status::OutOfBounds => TransferError::OutOfBounds {
            offset: op.remote_offset,
            len: op.len,
            segment_len: resp.checksum,
        },
        Status::Checksum => TransferError::Checksum {
            segment: op.remote.0,
            offset: op.remote_offset.wrapping_add(at),
            len,
        },
        Status::Unsupported => TransferError::Unsupported(Missing::PeerRefused {
            peer: peer.to_string(),
            reason,
        }),
        Status::Forbidden => TransferError::Forbidden {
            peer: peer.to_string(),
            reason: ForbiddenReason::Peer { message: reason },
        },
        // The callers take OK as success before asking; a peer that sends
        // it here answered nothing this side can serve.
        Status::Ok | Status::BadRequest => TransferError::Refused {
            peer: peer.to_string(),
            reason: RefusalReason::BadRequest { message: reason },
        },
    }
}

/// A reply frame whose tag did not verify (the connection is dropped).
fn altered(peer: &str) -> TransferError {
    TransferError::connection(peer, ConnectionFault::Altered { reply: true })
}

/// Deliver a notification over one connection.
pub(crate) async fn notify(
    inner: &Inner,
    peer: &str,
    link: &mut Link,
    payload: &[u8],
) -> Result<(), TransferError> {
    let timeout = inner.config.op_timeout();
    let mac = link.mac.clone();
    let (mac, conn) = (mac.as_deref(), &mut link.conn);
    let req = Request::control(RequestKind::Notify, payload.len() as u64);
    bounded(peer, timeout, send_frame(conn, mac, &req.encode(), payload)).await?;
    let mut head = [0u8; RESPONSE_BYTES];
    bounded(peer, timeout, conn.read_exact(&mut head)).await?;
    let resp = Response::decode(&head)?;
    let reason = if resp.status == Status::Ok {
        String::new()
    } else {
        bounded(peer, timeout, read_message(conn, resp.message_len)).await?
    };
    if !bounded(peer, timeout, frame_ok(conn, mac, &head, reason.as_bytes())).await? {
        return Err(altered(peer));
    }
    if resp.status == Status::Ok {
        return Ok(());
    }
    Err(TransferError::Refused {
        peer: peer.to_string(),
        reason: RefusalReason::Notification { message: reason },
    })
}
