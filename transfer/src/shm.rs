//! The shm transport (peers on the same host): the owner checks every range of
//! a batch over a Unix socket and hands out segment memfds with SCM_RIGHTS; the
//! initiator maps them once and then each op is one memcpy.
//!
//! The range check is one round trip per batch and is done by the segment's
//! owner, so a segment unregistered there is refused even if it is still mapped
//! here.
//!
//! Each batch checks out its own link (one socket) from the peer's
//! [`ShmPool`], so concurrent batches to one peer run in parallel; the links to
//! one peer process share its mapped segments (a segment id is never reused by
//! its owner, and a restarted owner gets a new socket name, hence a new pool).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};

use crate::engine::{Inner, PreparedOp};
use crate::io_util::bounded;
use crate::metrics::{DirectionLabel, TransportLabel};
use crate::op::{Notification, OpKind};
use crate::protocol::{checksum, MAX_NOTIFY_BYTES};
use crate::segment::SegmentId;
use crate::{SharedRegion, TransferError};

const KIND_CHECK: u8 = 1;
const KIND_MAP: u8 = 2;
const KIND_NOTIFY: u8 = 3;
const ST_OK: u8 = 0;
const ST_UNKNOWN: u8 = 1;
const ST_OOB: u8 = 2;
/// Ops above this many bytes in total are copied on a blocking thread.
const INLINE_COPY_BYTES: u64 = 1 << 20;

/// The abstract socket name of an engine's shm service.
pub(crate) fn socket_name(pid: u32, port: u16) -> String {
    format!("kvfabric-transfer-{pid}-{port}")
}

/// Bind the shm service socket (abstract namespace: nothing to clean up).
pub(crate) fn bind(name: &str) -> Result<UnixListener, TransferError> {
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let std_listener = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    std_listener.set_nonblocking(true)?;
    Ok(UnixListener::from_std(std_listener)?)
}

/// Serve local peers until the task is aborted.
pub(crate) async fn accept_loop(listener: UnixListener, inner: Arc<Inner>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let inner = inner.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(stream, &inner).await {
                        tracing::debug!(error = %e, "shm connection closed");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "shm accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve(mut s: UnixStream, inner: &Inner) -> Result<(), TransferError> {
    let peer_pid = s.peer_cred().ok().and_then(|c| c.pid()).unwrap_or(0) as u32;
    let timeout = inner.config.op_timeout();
    loop {
        let mut head = [0u8; 5];
        if s.read_exact(&mut head).await.is_err() {
            return Ok(());
        }
        let count = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
        match head[0] {
            KIND_CHECK => {
                let mut body = vec![0u8; count as usize * 24];
                bounded("shm peer", timeout, s.read_exact(&mut body)).await?;
                let mut reply = Vec::with_capacity(count as usize * 9);
                for r in body.chunks_exact(24) {
                    let (seg, off, len) = (u64_at(r, 0), u64_at(r, 8), u64_at(r, 16));
                    let (st, aux) = match inner.segments.resolve("target", seg, off, len) {
                        Ok(_) => (ST_OK, 0),
                        Err(TransferError::OutOfBounds { segment_len, .. }) => {
                            (ST_OOB, segment_len)
                        }
                        Err(_) => (ST_UNKNOWN, 0),
                    };
                    reply.push(st);
                    reply.extend_from_slice(&aux.to_le_bytes());
                }
                bounded("shm peer", timeout, s.write_all(&reply)).await?;
            }
            KIND_MAP => {
                let mut seg = [0u8; 8];
                bounded("shm peer", timeout, s.read_exact(&mut seg)).await?;
                let region = inner.segments.get(SegmentId(u64::from_le_bytes(seg)));
                let mut reply = [0u8; 9];
                reply[0] = if region.is_some() { ST_OK } else { ST_UNKNOWN };
                let len = region.as_ref().map_or(0, |r| r.len() as u64);
                reply[1..].copy_from_slice(&len.to_le_bytes());
                let fd = region.as_ref().map(|r| r.raw_fd());
                let sock = s.as_raw_fd();
                let sent = bounded(
                    "shm peer",
                    timeout,
                    s.async_io(Interest::WRITABLE, || {
                        send_with_fds(sock, &reply, fd.as_slice())
                    }),
                )
                .await?;
                bounded("shm peer", timeout, s.write_all(&reply[sent..])).await?;
            }
            KIND_NOTIFY if u64::from(count) <= MAX_NOTIFY_BYTES => {
                let mut payload = vec![0u8; count as usize];
                bounded("shm peer", timeout, s.read_exact(&mut payload)).await?;
                let _ = inner.notify_tx.send(Notification {
                    from_pid: peer_pid,
                    payload,
                });
                bounded("shm peer", timeout, s.write_all(&[ST_OK])).await?;
            }
            k => {
                return Err(TransferError::InvalidArgument(format!(
                    "bad shm request kind {k} / size {count}"
                )))
            }
        }
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The segments of one peer process mapped here, by id, shared by its links.
type MapCache = Mutex<HashMap<u64, Arc<SharedRegion>>>;

fn lock_maps(m: &MapCache) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<SharedRegion>>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The shm links to one local peer process: its socket name (from its hello),
/// the segments mapped from it, and the links no batch is using.
#[derive(Debug)]
pub(crate) struct ShmPool {
    socket: String,
    maps: Arc<MapCache>,
    idle: Vec<ShmLink>,
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
            idle: vec![first],
        })
    }

    /// An idle link, if any.
    pub(crate) fn take_idle(&mut self) -> Option<ShmLink> {
        self.idle.pop()
    }

    /// Open one more link to the same peer process. Cheap: a local socket
    /// connect; no mapping happens until a batch needs one.
    pub(crate) fn connector(&self) -> impl FnOnce() -> Result<ShmLink, TransferError> {
        let (socket, maps) = (self.socket.clone(), self.maps.clone());
        move || ShmLink::connect(&socket, maps)
    }

    /// Take back a healthy link; keeps at most `cap` idle. A link opened for an
    /// earlier pool (the peer was re-decided since) is closed instead.
    pub(crate) fn put_back(&mut self, link: ShmLink, cap: usize) {
        if Arc::ptr_eq(&link.maps, &self.maps) && self.idle.len() < cap {
            self.idle.push(link);
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
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        let s = std::os::unix::net::UnixStream::connect_addr(&addr)?;
        s.set_nonblocking(true)?;
        Ok(ShmLink {
            stream: UnixStream::from_std(s)?,
            maps,
        })
    }

    async fn map(
        &mut self,
        inner: &Inner,
        peer: &str,
        seg: u64,
    ) -> Result<Arc<SharedRegion>, TransferError> {
        if let Some(r) = lock_maps(&self.maps).get(&seg) {
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
            return Err(TransferError::Connection {
                peer: peer.into(),
                reason: "closed".into(),
            });
        }
        bounded(peer, timeout, self.stream.read_exact(&mut reply[n..])).await?;
        let len = u64_at(&reply, 1) as usize;
        match (reply[0], fd) {
            (ST_OK, Some(fd)) => {
                let region = Arc::new(SharedRegion::from_fd(fd, len)?);
                lock_maps(&self.maps).insert(seg, region.clone());
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
    ) -> Result<Vec<Result<(), TransferError>>, TransferError> {
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
        let mut results: Vec<Result<(), TransferError>> = Vec::with_capacity(ops.len());
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
                lock_maps(&self.maps).remove(&p.op.remote.0);
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
                .map_err(|e| TransferError::Io(format!("copy task failed: {e}")))?
        } else {
            copy_all(&copies, &corrupt)
        };
        for ((i, p, _), outcome) in copies.iter().zip(outcomes) {
            let (dir, bytes) = match p.op.kind {
                OpKind::Read => (DirectionLabel::Read, p.op.len),
                OpKind::Write => (DirectionLabel::Write, p.op.len),
            };
            match outcome {
                Ok(()) => inner.metrics.op_done(TransportLabel::Shm, dir, bytes),
                Err(ref _e) => inner.metrics.op_failed(TransportLabel::Shm),
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
fn copy_all(
    copies: &[(usize, PreparedOp, Arc<SharedRegion>)],
    corrupt: &[bool],
) -> Vec<Result<(), TransferError>> {
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

/// Most fds one message may carry (sized into [`ControlBuf`]).
const MAX_FDS: usize = 16;
/// Room for the control message of [`MAX_FDS`] fds: CMSG_SPACE(16 * 4) is
/// 80 bytes; u64 storage keeps it aligned for cmsghdr.
type ControlBuf = [u64; 12];

/// sendmsg with `fds` attached (SCM_RIGHTS; none when empty).
fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> std::io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} fds in one message (at most {MAX_FDS})", fds.len()),
        ));
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cbuf: ControlBuf = [0; 12];
    // SAFETY: msghdr is plain data; every pointer in it outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds) as u32;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is pure arithmetic.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(bytes) } as usize;
        // SAFETY: the control buffer holds CMSG_SPACE(MAX_FDS fds) bytes and
        // `fds` has at most MAX_FDS entries (checked above).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as usize;
            let data = libc::CMSG_DATA(c).cast::<RawFd>();
            for (i, &fd) in fds.iter().enumerate() {
                std::ptr::write_unaligned(data.add(i), fd);
            }
        }
    }
    // SAFETY: valid socket and message.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// recvmsg that also takes every fd passed with SCM_RIGHTS, in order (each
/// one owned: dropping the ones not wanted closes them). A message whose fds
/// did not all fit (MSG_CTRUNC; the kernel closed the rest) is an error, and
/// the fds that did arrive are closed.
fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf: ControlBuf = [0; 12];
    // SAFETY: as in send_with_fds.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: valid socket and message buffers.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel filled in; an
    // SCM_RIGHTS message's data is cmsg_len - CMSG_LEN(0) bytes of fds, each
    // one a fresh descriptor this process now owns.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*c).cmsg_len - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(std::io::Error::other(format!(
            "more than {MAX_FDS} fds in one message"
        )));
    }
    Ok((n as usize, fds))
}

/// [`recv_with_fds`] for a message that should carry at most one fd: the
/// first is kept, any others are closed.
fn recv_first_fd(sock: RawFd, buf: &mut [u8]) -> std::io::Result<(usize, Option<OwnedFd>)> {
    let (n, fds) = recv_with_fds(sock, buf)?;
    // Dropping the rest of the iterator closes every other fd.
    Ok((n, fds.into_iter().next()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream as StdUnixStream;

    fn region_with(byte: u8) -> SharedRegion {
        let r = SharedRegion::create("fd-passing", 4096).unwrap();
        // SAFETY: fresh region, nobody else holds it.
        unsafe { r.slice_mut(0, 4096).unwrap() }.fill(byte);
        r
    }

    /// Issue #28: a message with several fds used to yield only its first.
    #[test]
    fn every_fd_of_a_multi_fd_message_arrives_and_is_usable() {
        let (a, b) = StdUnixStream::pair().unwrap();
        let regions: Vec<SharedRegion> = (1..=3u8).map(region_with).collect();
        let raw: Vec<RawFd> = regions.iter().map(|r| r.raw_fd()).collect();
        assert_eq!(send_with_fds(a.as_raw_fd(), b"map", &raw).unwrap(), 3);
        let mut buf = [0u8; 3];
        let (n, fds) = recv_with_fds(b.as_raw_fd(), &mut buf).unwrap();
        assert_eq!((n, &buf), (3, b"map"));
        assert_eq!(fds.len(), 3, "every fd of the message arrives");
        for (fd, want) in fds.into_iter().zip(1..=3u8) {
            let mapped = SharedRegion::from_fd(fd, 4096).unwrap();
            // SAFETY: the sender does not write while we read.
            let bytes = unsafe { mapped.slice(0, 4096).unwrap() };
            assert!(
                bytes.iter().all(|&x| x == want),
                "fd {want} maps its own region"
            );
        }
    }

    /// The fds a reader does not want are closed, not leaked: once the sender
    /// closes its end of a pipe, the pipe reads EOF only if no copy of that end
    /// survived in the receiver.
    #[test]
    fn fds_not_wanted_are_closed() {
        let (a, b) = StdUnixStream::pair().unwrap();
        let mut pipe = [0 as RawFd; 2];
        // SAFETY: plain syscall into a 2-int array.
        assert_eq!(
            unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) },
            0
        );
        // SAFETY: fresh fds we own.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };
        let region = region_with(7);
        send_with_fds(a.as_raw_fd(), b"x", &[region.raw_fd(), wr.as_raw_fd()]).unwrap();
        drop(wr);
        let mut buf = [0u8; 1];
        let (n, first) = recv_first_fd(b.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(n, 1);
        let mapped = SharedRegion::from_fd(first.unwrap(), 4096).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { mapped.slice(0, 1).unwrap() }, &[7]);
        let mut byte = [0u8; 1];
        // SAFETY: valid fd and buffer.
        let got = unsafe { libc::read(rd.as_raw_fd(), byte.as_mut_ptr().cast(), 1) };
        assert_eq!(got, 0, "EOF: the pipe's write end passed along was closed");
    }

    #[test]
    fn too_many_fds_are_refused_by_the_sender() {
        let (a, _b) = StdUnixStream::pair().unwrap();
        let region = region_with(1);
        let raw = vec![region.raw_fd(); MAX_FDS + 1];
        assert!(send_with_fds(a.as_raw_fd(), b"x", &raw).is_err());
    }
}
