//! The tcp transport's serving side: accepts peers, answers hello, and serves
//! READ/WRITE slices straight from/into registered segments after checking the
//! whole op range, plus notifications; and the rdma control plane (queue-pair
//! exchange, range checks answering rkeys), whose queue pairs live as long as
//! the connection that set them up.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::engine::Inner;
use crate::io_util::{bounded, discard, write_all_2};
use crate::metrics::{DirectionLabel, TransportLabel};
use crate::op::Notification;
use crate::protocol::{
    checksum, encode_rdma_key, Hello, RdmaEndpoint, Request, RequestKind, Response, Status,
    FLAG_CHECKSUM, HELLO_BYTES, MAX_NOTIFY_BYTES, RDMA_ENDPOINT_BYTES, RDMA_KEY_BYTES,
    REQUEST_BYTES,
};
use crate::segment::RdmaKey;
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
    // Queue pairs this connection set up: the peer's one-sided ops land
    // through them until the connection closes.
    let mut qps = ServedQps::new();
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
            RequestKind::RdmaConnect => {
                if req.slice_len != RDMA_ENDPOINT_BYTES as u64 {
                    let msg = format!("rdma endpoint of {} bytes", req.slice_len);
                    send_status(&peer, inner, &mut wr, Status::BadRequest, 0, &msg).await?;
                    return Err(TransferError::InvalidArgument(msg));
                }
                let mut theirs = [0u8; RDMA_ENDPOINT_BYTES];
                bounded(&peer, timeout, rd.read_exact(&mut theirs)).await?;
                let accepted = match RdmaEndpoint::decode(&theirs) {
                    Ok(remote) => accept_qp(inner, remote, &mut qps)
                        .map_err(|e| (Status::Unsupported, e.to_string())),
                    Err(e) => Err((Status::BadRequest, e.to_string())),
                };
                match accepted {
                    Ok(ours) => {
                        let ok = Response {
                            status: Status::Ok,
                            message_len: 0,
                            checksum: 0,
                            payload_len: RDMA_ENDPOINT_BYTES as u64,
                        };
                        let body = ours.encode();
                        bounded(&peer, timeout, write_all_2(&mut wr, &ok.encode(), &body)).await?;
                    }
                    Err((status, msg)) => {
                        send_status(&peer, inner, &mut wr, status, 0, &msg).await?;
                    }
                }
            }
            RequestKind::RdmaRange => match check(inner, &req) {
                Ok(region) => match rdma_key(inner, req.segment) {
                    Some(key) => {
                        let sum = if req.flags & FLAG_CHECKSUM != 0 {
                            // SAFETY: range checked; as for READ.
                            checksum(unsafe {
                                region.slice(req.op_offset as usize, req.op_len as usize)?
                            })
                        } else {
                            0
                        };
                        let ok = Response {
                            status: Status::Ok,
                            message_len: 0,
                            checksum: sum,
                            payload_len: RDMA_KEY_BYTES as u64,
                        };
                        let body = encode_rdma_key(&key);
                        bounded(&peer, timeout, write_all_2(&mut wr, &ok.encode(), &body)).await?;
                    }
                    None => {
                        let msg = "segment not registered with an RDMA NIC";
                        send_status(&peer, inner, &mut wr, Status::Unsupported, 0, msg).await?;
                    }
                },
                Err((status, aux, msg)) => {
                    send_error(&peer, inner, &mut wr, status, aux, &msg).await?
                }
            },
        }
    }
}

#[cfg(feature = "rdma")]
type ServedQps = Vec<crate::rdma::RcQueuePair>;
/// Without the feature no queue pair is ever set up.
#[cfg(not(feature = "rdma"))]
type ServedQps = Vec<std::convert::Infallible>;

/// Set up a queue pair connected to `remote` for this connection; our endpoint.
#[cfg(feature = "rdma")]
fn accept_qp(
    inner: &Inner,
    remote: RdmaEndpoint,
    qps: &mut ServedQps,
) -> Result<RdmaEndpoint, TransferError> {
    if qps.len() >= crate::rdma_link::MAX_SERVED_QPS {
        return Err(TransferError::Unsupported(
            "too many queue pairs on one connection".into(),
        ));
    }
    let qp = crate::rdma_link::accept_qp(inner, remote)?;
    let ours = qp.endpoint();
    qps.push(qp);
    Ok(ours)
}

#[cfg(not(feature = "rdma"))]
fn accept_qp(
    _inner: &Inner,
    _remote: RdmaEndpoint,
    _qps: &mut ServedQps,
) -> Result<RdmaEndpoint, TransferError> {
    Err(TransferError::Unsupported(
        "built without the rdma feature".into(),
    ))
}

/// The NIC key of a registered segment, if it has one.
#[cfg(feature = "rdma")]
fn rdma_key(inner: &Inner, segment: u64) -> Option<RdmaKey> {
    inner.rdma.as_ref()?.key(crate::SegmentId(segment))
}

#[cfg(not(feature = "rdma"))]
fn rdma_key(_inner: &Inner, _segment: u64) -> Option<RdmaKey> {
    None
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
    send_status(peer, inner, wr, status, aux, msg).await
}

/// Answer with a non-OK `status` (not counted as a failed op).
async fn send_status<W: tokio::io::AsyncWrite + Unpin>(
    peer: &str,
    inner: &Inner,
    wr: &mut W,
    status: Status,
    aux: u64,
    msg: &str,
) -> Result<(), TransferError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TransferConfig, TransferEngine};

    async fn request(s: &mut TcpStream, req: Request, payload: &[u8]) -> (Response, Vec<u8>) {
        s.write_all(&req.encode()).await.unwrap();
        s.write_all(payload).await.unwrap();
        let mut head = [0u8; crate::protocol::RESPONSE_BYTES];
        s.read_exact(&mut head).await.unwrap();
        let resp = Response::decode(&head).unwrap();
        let n = match resp.status {
            Status::Ok => resp.payload_len as usize,
            _ => resp.message_len as usize,
        };
        let mut body = vec![0u8; n];
        s.read_exact(&mut body).await.unwrap();
        (resp, body)
    }

    fn range(segment: u64, offset: u64, len: u64) -> Request {
        Request {
            kind: RequestKind::RdmaRange,
            flags: FLAG_CHECKSUM,
            segment,
            op_offset: offset,
            op_len: len,
            slice_offset: offset,
            slice_len: len,
            checksum: 0,
        }
    }

    /// Without a NIC the server answers the rdma control requests (no queue
    /// pair, no key) and still checks ranges first; the stream stays in sync.
    #[tokio::test]
    async fn rdma_control_requests_are_answered_without_a_nic() {
        #[cfg(feature = "rdma")]
        if !crate::rdma::device_names().is_empty() {
            eprintln!("SKIPPED: an RDMA device exists; this test covers hosts without one");
            return;
        }
        let mut registry = prometheus_client::registry::Registry::default();
        let engine = TransferEngine::start(TransferConfig::default(), &mut registry)
            .await
            .unwrap();
        let seg = engine.register(Arc::new(SharedRegion::create("t", 8192).unwrap()));
        let mut s = TcpStream::connect(engine.local_addr()).await.unwrap();
        let hello = Hello {
            pid: 1,
            boot_id: String::new(),
            shm_socket: String::new(),
            rdma: true,
        };
        s.write_all(&hello.encode()).await.unwrap();
        let mut theirs = [0u8; HELLO_BYTES];
        s.read_exact(&mut theirs).await.unwrap();
        assert!(
            !Hello::decode(&theirs).unwrap().rdma,
            "no NIC, no rdma in hello"
        );

        let ep = RdmaEndpoint {
            qp_num: 5,
            lid: 1,
            gid: [0; 16],
        };
        let connect = Request {
            kind: RequestKind::RdmaConnect,
            flags: 0,
            segment: 0,
            op_offset: 0,
            op_len: RDMA_ENDPOINT_BYTES as u64,
            slice_offset: 0,
            slice_len: RDMA_ENDPOINT_BYTES as u64,
            checksum: 0,
        };
        let (resp, _) = request(&mut s, connect, &ep.encode()).await;
        assert_eq!(resp.status, Status::Unsupported);
        let (resp, _) = request(&mut s, connect, &[0u8; RDMA_ENDPOINT_BYTES]).await;
        assert_eq!(resp.status, Status::BadRequest, "malformed endpoint");
        let (resp, _) = request(&mut s, range(seg.0, 0, 4096), &[]).await;
        assert_eq!(resp.status, Status::Unsupported, "segment has no NIC key");
        let (resp, _) = request(&mut s, range(999, 0, 4096), &[]).await;
        assert_eq!(resp.status, Status::UnknownSegment);
        let (resp, _) = request(&mut s, range(seg.0, 4096, 8192), &[]).await;
        assert_eq!(resp.status, Status::OutOfBounds);
        assert_eq!(resp.checksum, 8192, "segment length rides in the aux word");
        let read = Request {
            kind: RequestKind::Read,
            ..range(seg.0, 0, 4096)
        };
        let (resp, body) = request(&mut s, read, &[]).await;
        assert_eq!(resp.status, Status::Ok);
        assert_eq!(body.len(), 4096);
        assert_eq!(resp.checksum, checksum(&body));
    }
}
