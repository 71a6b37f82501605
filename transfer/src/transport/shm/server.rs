//! The shm transport's serving side: the abstract Unix socket local peers
//! connect to, answering range checks, handing out segment memfds and taking
//! notifications.

use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};

use super::fds::send_with_fds;
use super::wire::{u64_at, KIND_CHECK, KIND_MAP, KIND_NOTIFY, ST_OK, ST_OOB, ST_UNKNOWN};
use crate::core::Inner;
use crate::error::{BadInput, ForbiddenReason};
use crate::op::{Notification, MAX_NOTIFY_BYTES};
use crate::segment::SegmentId;
use crate::transport::io::bounded;
use crate::TransferError;

/// The abstract socket name of an engine's shm service.
pub(crate) fn socket_name(pid: u32, port: u16) -> String {
    format!("kvfabric-transfer-{pid}-{port}")
}

/// Bind the shm service socket (abstract namespace: nothing to clean up).
pub(crate) fn bind(name: &str) -> Result<UnixListener, TransferError> {
    let io = |op| move |e| TransferError::io(op, e);
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(io("shm socket name"))?;
    let std_listener =
        std::os::unix::net::UnixListener::bind_addr(&addr).map_err(io("shm bind"))?;
    std_listener
        .set_nonblocking(true)
        .map_err(io("shm set_nonblocking"))?;
    UnixListener::from_std(std_listener).map_err(io("shm register"))
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
    // Secured modes: only processes of this user (who could ptrace this one
    // anyway) are handed memory; anyone else is refused before any op.
    if crate::transport::tcp::conn::secured(inner).is_some() {
        let uid = s
            .peer_cred()
            .map_err(|e| TransferError::io("shm peer_cred", e))?
            .uid();
        // SAFETY: geteuid has no preconditions and cannot fail.
        let ours = unsafe { libc::geteuid() };
        if uid != ours {
            inner.metrics.handshake_refused();
            return Err(TransferError::Forbidden {
                peer: format!("uid {uid}"),
                reason: ForbiddenReason::ShmOtherUser,
            });
        }
    }
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
                return Err(TransferError::InvalidArgument(BadInput::BadRequest {
                    transport: "shm",
                    kind: k,
                    len: u64::from(count),
                }))
            }
        }
    }
}
