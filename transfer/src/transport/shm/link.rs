//! The shm transport's initiating side: links to one local peer process
//! (one control socket each) sharing the segments mapped from it, and a batch
//! run as one CHECK round trip then one memcpy per op.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;

use super::fds::recv_first_fd;
use super::wire::{u64_at, KIND_CHECK, KIND_MAP, KIND_NOTIFY, ST_OK, ST_OOB};
use crate::checksum::checksum;
use crate::core::{lock, Inner, OpResult, PreparedOp};
use crate::error::ConnectionFault;
use crate::metrics::{DirectionLabel, TransportLabel};
use crate::op::OpKind;
use crate::transport::idle::{Idle, IdleLimits};
use crate::transport::io::bounded;
use crate::{SharedRegion, TransferError};

/// Ops above this many bytes in total are copied on a blocking thread.
const INLINE_COPY_BYTES: u64 = 1 << 20;

/// The segments of one peer process mapped here, by id, shared by its links.
type MapCache = Mutex<HashMap<u64, Arc<SharedRegion>>>;

/// The shm links to one local peer process: its socket name (from its hello),
/// the segments mapped from it, and the links no batch is using.
#[derive(Debug)]
pub(crate) struct ShmPool {
    socket: String,
    maps: Arc<MapCache>,
    idle: Idle<ShmLink>,
}

impl ShmPool {
    /// A pool for the peer serving shm at `socket`, with one link opened (so a
    /// peer whose socket cannot be reached is found out now).
    pub(crate) fn open(socket: String) -> Result<Self, TransferError> {
        let maps = Arc::new(MapCache::default());
        let first = ShmLink::connect(&socket, maps.clone())?;
        Ok(ShmPool {
            socket,
            maps,
            idle: Idle::holding(first, Instant::now()),
        })
    }

    /// An idle link, if any (links idle past the limit are closed).
    pub(crate) fn take_idle(&mut self, limits: IdleLimits) -> Option<ShmLink> {
        let (mut got, expired) = self.idle.take(1, limits, Instant::now());
        drop(expired);
        got.pop()
    }

    /// Open one more link to the same peer process. Cheap: a local socket
    /// connect; no mapping happens until a batch needs one.
    pub(crate) fn connector(&self) -> impl FnOnce() -> Result<ShmLink, TransferError> {
        let (socket, maps) = (self.socket.clone(), self.maps.clone());
        move || ShmLink::connect(&socket, maps)
    }

    /// Take back a healthy link, within `limits`. A link opened for an
    /// earlier pool (the peer was re-decided since) is closed instead.
    pub(crate) fn put_back(&mut self, link: ShmLink, limits: IdleLimits) {
        if Arc::ptr_eq(&link.maps, &self.maps) {
            drop(self.idle.put_back([link], limits, Instant::now()));
        }
    }
}

/// An initiator's link to one local peer: one control socket (one batch at a
/// time) and the pool's shared cache of mapped peer segments.
#[derive(Debug)]
pub(crate) struct ShmLink {
    stream: UnixStream,
    maps: Arc<MapCache>,
}

impl ShmLink {
    fn connect(name: &str, maps: Arc<MapCache>) -> Result<Self, TransferError> {
        let io = |op| move |e| TransferError::io(op, e);
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(io("shm socket name"))?;
        let s = std::os::unix::net::UnixStream::connect_addr(&addr).map_err(io("shm connect"))?;
        s.set_nonblocking(true).map_err(io("shm set_nonblocking"))?;
        Ok(ShmLink {
            stream: UnixStream::from_std(s).map_err(io("shm register"))?,
            maps,
        })
    }

    async fn map(
        &mut self,
        inner: &Inner,
        peer: &str,
        seg: u64,
    ) -> Result<Arc<SharedRegion>, TransferError> {
        if let Some(r) = lock(&self.maps).get(&seg) {
            return Ok(r.clone());
        }
        let timeout = inner.config.op_timeout();
        let mut req = [0u8; 13];
        req[0] = KIND_MAP;
        req[1..5].copy_from_slice(&1u32.to_le_bytes());
        req[5..].copy_from_slice(&seg.to_le_bytes());
        bounded(peer, timeout, self.stream.write_all(&req)).await?;
        let mut reply = [0u8; 9];
        let sock = self.stream.as_raw_fd();
        let (n, fd) = bounded(
            peer,
            timeout,
            self.stream
                .async_io(Interest::READABLE, || recv_first_fd(sock, &mut reply)),
        )
        .await?;
        if n == 0 {
            return Err(TransferError::connection(peer, ConnectionFault::Closed));
        }
        bounded(peer, timeout, self.stream.read_exact(&mut reply[n..])).await?;
        let len = u64_at(&reply, 1) as usize;
        match (reply[0], fd) {
            (ST_OK, Some(fd)) => {
                let region = Arc::new(SharedRegion::from_fd(fd, len)?);
                lock(&self.maps).insert(seg, region.clone());
                Ok(region)
            }
            _ => Err(TransferError::UnknownSegment {
                side: peer.into(),
                segment: seg,
            }),
        }
    }

    /// Run a batch; `Err` means the link broke and every op failed with it.
    pub(crate) async fn run_batch(
        &mut self,
        inner: &Inner,
        peer: &str,
        ops: Vec<PreparedOp>,
    ) -> Result<Vec<OpResult>, TransferError> {
        let timeout = inner.config.op_timeout();
        let mut req = Vec::with_capacity(5 + ops.len() * 24);
        req.push(KIND_CHECK);
        req.extend_from_slice(&(ops.len() as u32).to_le_bytes());
        for p in &ops {
            for v in [p.op.remote.0, p.op.remote_offset, p.op.len] {
                req.extend_from_slice(&v.to_le_bytes());
            }
        }
        bounded(peer, timeout, self.stream.write_all(&req)).await?;
        let mut reply = vec![0u8; ops.len() * 9];
        bounded(peer, timeout, self.stream.read_exact(&mut reply)).await?;
        let mut results: Vec<OpResult> = Vec::with_capacity(ops.len());
        let mut copies = Vec::new();
        for (p, st) in ops.into_iter().zip(reply.chunks_exact(9)) {
            let refused = match st[0] {
                ST_OK => None,
                ST_OOB => Some(TransferError::OutOfBounds {
                    offset: p.op.remote_offset,
                    len: p.op.len,
                    segment_len: u64_at(st, 1),
                }),
                _ => Some(TransferError::UnknownSegment {
                    side: peer.into(),
                    segment: p.op.remote.0,
                }),
            };
            if let Some(e) = refused {
                lock(&self.maps).remove(&p.op.remote.0);
                results.push(Err(e));
                continue;
            }
            match self.map(inner, peer, p.op.remote.0).await {
                Ok(remote) => {
                    copies.push((results.len(), p, remote));
                    results.push(Ok(()));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        let total: u64 = copies.iter().map(|(_, p, _)| p.op.len).sum();
        let corrupt: Vec<bool> = copies
            .iter()
            .map(|(_, p, _)| p.op.checksum && inner.take_corruption())
            .collect();
        let outcomes = if total > INLINE_COPY_BYTES {
            let work: Vec<_> = copies
                .iter()
                .map(|(i, p, r)| (*i, p.clone(), r.clone()))
                .collect();
            tokio::task::spawn_blocking(move || copy_all(&work, &corrupt))
                .await
                .map_err(|e| TransferError::io_other("shm copy task", e))?
        } else {
            copy_all(&copies, &corrupt)
        };
        for ((i, p, _), outcome) in copies.iter().zip(outcomes) {
            let dir = DirectionLabel::of(p.op.kind);
            match outcome {
                Ok(()) => inner.metrics.op_done(TransportLabel::Shm, dir, p.op.len),
                Err(_) => inner.metrics.op_failed(TransportLabel::Shm),
            }
            results[*i] = outcome;
        }
        Ok(results)
    }

    /// Deliver a notification.
    pub(crate) async fn notify(
        &mut self,
        inner: &Inner,
        peer: &str,
        payload: &[u8],
    ) -> Result<(), TransferError> {
        let timeout = inner.config.op_timeout();
        let mut req = vec![KIND_NOTIFY];
        req.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        req.extend_from_slice(payload);
        bounded(peer, timeout, self.stream.write_all(&req)).await?;
        let mut st = [0u8; 1];
        bounded(peer, timeout, self.stream.read_exact(&mut st)).await?;
        Ok(())
    }
}

/// Copy every op (memmove: a self-transfer may overlap) and verify checksums.
fn copy_all(copies: &[(usize, PreparedOp, Arc<SharedRegion>)], corrupt: &[bool]) -> Vec<OpResult> {
    copies
        .iter()
        .zip(corrupt)
        .map(|((_, p, remote), &corrupt)| {
            let (src, src_off, dst, dst_off) = match p.op.kind {
                OpKind::Read => (remote, p.op.remote_offset, &p.local, p.op.local_offset),
                OpKind::Write => (&p.local, p.op.local_offset, remote, p.op.remote_offset),
            };
            let len = p.op.len as usize;
            // Both ranges were checked: the local one at prepare, the remote
            // one by its owner in this batch's CHECK round trip.
            src.check(src_off as usize, len)?;
            dst.check(dst_off as usize, len)?;
            // SAFETY: ranges checked above; owners coordinate concurrent access.
            let want =
                p.op.checksum
                    .then(|| checksum(unsafe { src.slice(src_off as usize, len) }.unwrap_or(&[])));
            unsafe {
                std::ptr::copy(
                    src.as_ptr().add(src_off as usize),
                    dst.as_ptr().add(dst_off as usize),
                    len,
                );
                if corrupt && len > 0 {
                    *dst.as_ptr().add(dst_off as usize) ^= 0xff;
                }
            }
            if let Some(want) = want {
                // SAFETY: as above.
                let got = checksum(unsafe { dst.slice(dst_off as usize, len) }.unwrap_or(&[]));
                if got != want {
                    return Err(TransferError::Checksum {
                        segment: p.op.remote.0,
                        offset: p.op.remote_offset,
                        len: p.op.len,
                    });
                }
            }
            Ok(())
        })
        .collect()
}
