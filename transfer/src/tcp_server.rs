//! The tcp transport's serving side: accepts peers, answers hello, and serves
//! READ/WRITE slices straight from/into registered segments after checking the
//! whole op range, plus notifications.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::engine::Inner;
use crate::io_util::{bounded, discard, write_all_2};
use crate::metrics::{DirectionLabel, TransportLabel};
use crate::op::Notification;
use crate::protocol::{
    checksum, Hello, Request, RequestKind, Response, Status, FLAG_CHECKSUM, HELLO_BYTES,
    MAX_NOTIFY_BYTES, REQUEST_BYTES,
};
use crate::{SharedRegion, TransferError};

/// Accept peers until the listener task is aborted.
pub(crate) async fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    loop {
        match listener.accept().await {
            Ok((stream, from)) => {
                let inner = inner.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve_connection(stream, &inner).await {
                        tracing::debug!(%from, error = %e, "transfer connection closed");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "transfer accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve_connection(mut stream: TcpStream, inner: &Inner) -> Result<(), TransferError> {
    stream.set_nodelay(true)?;
    let timeout = inner.config.op_timeout();
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "peer".into());
    let mut hello = [0u8; HELLO_BYTES];
    bounded(&peer, timeout, stream.read_exact(&mut hello)).await?;
    let theirs = Hello::decode(&hello)?;
    bounded(&peer, timeout, stream.write_all(&inner.hello.encode())).await?;
    let (mut rd, mut wr) = stream.split();
    loop {
        let mut head = [0u8; REQUEST_BYTES];
        // An idle pooled connection may wait for its next request forever.
        if rd.read_exact(&mut head).await.is_err() {
            return Ok(());
        }
        let req = Request::decode(&head)?;
        match req.kind {
            RequestKind::Read => match check(inner, &req) {
                Ok(region) => {
                    // SAFETY: range checked; concurrent writers of the same
                    // range are excluded by the segment owner's leases.
                    let data =
                        unsafe { region.slice(req.slice_offset as usize, req.slice_len as usize)? };
                    let sum = if req.flags & FLAG_CHECKSUM != 0 {
                        checksum(data)
                    } else {
                        0
                    };
                    let head = Response {
                        status: Status::Ok,
                        message_len: 0,
                        checksum: sum,
                        payload_len: req.slice_len,
                    }
                    .encode();
                    if inner.take_corruption() {
                        let mut bad = data.to_vec();
                        if let Some(b) = bad.first_mut() {
                            *b ^= 0xff;
                        }
                        bounded(&peer, timeout, write_all_2(&mut wr, &head, &bad)).await?;
                    } else {
                        bounded(&peer, timeout, write_all_2(&mut wr, &head, data)).await?;
                    }
                    if req.slice_offset + req.slice_len == req.op_offset + req.op_len {
                        inner.metrics.op_done(
                            TransportLabel::Tcp,
                            DirectionLabel::ServedRead,
                            req.op_len,
                        );
                    }
                }
                Err((status, aux, msg)) => {
                    send_error(&peer, inner, &mut wr, status, aux, &msg).await?
                }
            },
            RequestKind::Write => match check(inner, &req) {
                Ok(region) => {
                    // SAFETY: as above; the writer owns the range.
                    let dst = unsafe {
                        region.slice_mut(req.slice_offset as usize, req.slice_len as usize)?
                    };
                    bounded(&peer, timeout, rd.read_exact(dst)).await?;
                    if req.flags & FLAG_CHECKSUM != 0 && checksum(dst) != req.checksum {
                        let msg = format!(
                            "checksum mismatch at {}+{}",
                            req.slice_offset, req.slice_len
                        );
                        send_error(&peer, inner, &mut wr, Status::Checksum, 0, &msg).await?;
                        continue;
                    }
                    let ok = Response {
                        status: Status::Ok,
                        message_len: 0,
                        checksum: 0,
                        payload_len: 0,
                    };
                    bounded(&peer, timeout, wr.write_all(&ok.encode())).await?;
                    if req.slice_offset + req.slice_len == req.op_offset + req.op_len {
                        inner.metrics.op_done(
                            TransportLabel::Tcp,
                            DirectionLabel::ServedWrite,
                            req.op_len,
                        );
                    }
                }
                Err((status, aux, msg)) => {
                    bounded(&peer, timeout, discard(&mut rd, req.slice_len)).await?;
                    send_error(&peer, inner, &mut wr, status, aux, &msg).await?;
                }
            },
            RequestKind::Notify => {
                if req.slice_len > MAX_NOTIFY_BYTES {
                    let msg = format!("notification of {} bytes is too large", req.slice_len);
                    send_error(&peer, inner, &mut wr, Status::BadRequest, 0, &msg).await?;
                    return Err(TransferError::InvalidArgument(msg));
                }
                let mut payload = vec![0u8; req.slice_len as usize];
                bounded(&peer, timeout, rd.read_exact(&mut payload)).await?;
                // No receiver yet is fine: notifications are best effort.
                let _ = inner.notify_tx.send(Notification {
                    from_pid: theirs.pid,
                    payload,
                });
                let ok = Response {
                    status: Status::Ok,
                    message_len: 0,
                    checksum: 0,
                    payload_len: 0,
                };
                bounded(&peer, timeout, wr.write_all(&ok.encode())).await?;
            }
        }
    }
}

/// The region for a request, after checking the whole op range and that the
/// slice lies inside the op; or (status, aux word, reason).
fn check(inner: &Inner, req: &Request) -> Result<Arc<SharedRegion>, (Status, u64, String)> {
    let region = inner
        .segments
        .resolve("target", req.segment, req.op_offset, req.op_len)
        .map_err(|e| match e {
            TransferError::UnknownSegment { .. } => (Status::UnknownSegment, 0, e.to_string()),
            TransferError::OutOfBounds { segment_len, .. } => {
                (Status::OutOfBounds, segment_len, e.to_string())
            }
            other => (Status::BadRequest, 0, other.to_string()),
        })?;
    let inside_op = req.slice_offset >= req.op_offset
        && req
            .slice_offset
            .checked_add(req.slice_len)
            .zip(req.op_offset.checked_add(req.op_len))
            .is_some_and(|(se, oe)| se <= oe);
    if !inside_op || req.slice_len == 0 {
        return Err((Status::BadRequest, 0, "slice outside its op".into()));
    }
    Ok(region)
}

async fn send_error<W: tokio::io::AsyncWrite + Unpin>(
    peer: &str,
    inner: &Inner,
    wr: &mut W,
    status: Status,
    aux: u64,
    msg: &str,
) -> Result<(), TransferError> {
    inner.metrics.op_failed(TransportLabel::Tcp);
    let msg = &msg.as_bytes()[..msg.len().min(4096)];
    let head = Response {
        status,
        message_len: msg.len() as u32,
        checksum: aux,
        payload_len: 0,
    }
    .encode();
    bounded(peer, inner.config.op_timeout(), write_all_2(wr, &head, msg)).await
}
