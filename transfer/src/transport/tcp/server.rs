//! The tcp transport's serving side: accepts peers, answers hello, and serves
//! READ/WRITE slices straight from/into registered segments after checking the
//! whole op range, plus notifications; and the rdma control plane (queue-pair
//! exchange, range checks answering rkeys), whose queue pairs live as long as
//! the connection that set them up. What to answer is decided without I/O in
//! `answer.rs`; this file moves the bytes.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpListener;

use super::answer::{authorize, check, Refusal};
use super::conn::{accept, recv_payload, revoked, send_frame, send_payload, Link};
use super::protocol::{
    RdmaEndpoint, Request, RequestKind, Response, Status, FLAG_CAPABILITY, FLAG_CHECKSUM,
    FLAG_ENCODE, RDMA_ENDPOINT_BYTES, RDMA_KEY_BYTES, REQUEST_BYTES,
};
use super::wire::encode_slice;
use crate::checksum::checksum;
use crate::core::Inner;
use crate::error::{BadInput, ConnectionFault};
use crate::metrics::{DirectionLabel, TransportLabel};
use crate::op::{Notification, MAX_NOTIFY_BYTES};
use crate::security::{ConnMac, CAPABILITY_BYTES};
use crate::transport::io::{bounded, cpu_bound, discard};
use crate::transport::rdma::{Nic, ServedQps};
use crate::{SegmentId, TransferError};

/// Accept peers until the listener task is aborted.
pub(crate) async fn accept_loop(listener: TcpListener, inner: Arc<Inner>, nic: Arc<Nic>) {
    loop {
        match listener.accept().await {
            Ok((stream, from)) => {
                let (inner, nic) = (inner.clone(), nic.clone());
                tokio::spawn(async move {
                    if let Err(e) = serve_connection(stream, &inner, &nic).await {
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

async fn serve_connection(
    stream: tokio::net::TcpStream,
    inner: &Inner,
    nic: &Nic,
) -> Result<(), TransferError> {
    stream
        .set_nodelay(true)
        .map_err(|e| TransferError::io("tcp set_nodelay", e))?;
    let timeout = inner.config.op_timeout();
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "peer".into());
    // Authenticated (secured modes) before any op is read.
    let (link, theirs) = match accept(inner, &peer, stream).await {
        Ok(l) => l,
        Err(e) => {
            inner.metrics.handshake_refused();
            tracing::warn!(%peer, error = %e, "transfer connection refused at handshake");
            return Err(e);
        }
    };
    let Link {
        mut conn,
        mac,
        peer_id,
        peer_cert,
        ..
    } = link;
    let (mut rd, mut wr) = conn.split();
    let conn = Served {
        inner,
        nic,
        peer,
        timeout,
        from_pid: theirs.pid,
        mac: mac.as_deref(),
        peer_id,
    };
    // Queue pairs this connection set up: the peer's one-sided ops land
    // through them until the connection closes.
    let mut qps = ServedQps::new();
    // READ slices asked for encoded are encoded here.
    let mut scratch = Vec::new();
    loop {
        let mut head = [0u8; REQUEST_BYTES];
        // An idle pooled connection may wait for its next request forever.
        if rd.read_exact(&mut head).await.is_err() {
            return Ok(());
        }
        // A certificate revoked since the handshake ends the connection.
        if peer_cert.as_deref().is_some_and(|c| revoked(inner, c)) {
            inner.metrics.handshake_refused();
            tracing::warn!(peer = %conn.peer, "transfer connection closed: the peer's certificate is revoked");
            return Err(TransferError::connection(
                &conn.peer,
                ConnectionFault::Revoked,
            ));
        }
        let req = Request::decode(&head)?;
        match req.kind {
            RequestKind::Read => {
                conn.read(&req, &head, &mut rd, &mut wr, &mut scratch)
                    .await?
            }
            RequestKind::Write => conn.write(&req, &head, &mut rd, &mut wr).await?,
            RequestKind::Notify => conn.notify(&req, &head, &mut rd, &mut wr).await?,
            _ if conn.peer_id.is_some() => conn.no_rdma(&req, &head, &mut rd, &mut wr).await?,
            RequestKind::RdmaConnect => conn.rdma_connect(&req, &mut qps, &mut rd, &mut wr).await?,
            RequestKind::RdmaRange => conn.rdma_range(&req, &mut wr).await?,
        }
    }
}

/// One served connection: what its handlers need to know of the engine and
/// of the peer at its other end.
struct Served<'a> {
    inner: &'a Inner,
    nic: &'a Nic,
    peer: String,
    timeout: Duration,
    from_pid: u32,
    /// `authenticate` mode: every frame in and out carries a tag.
    mac: Option<&'a ConnMac>,
    /// Secured modes: the peer's node id, from its certificate.
    peer_id: Option<String>,
}

/// A frame whose tag did not verify: the connection is closed.
fn altered(peer: &str) -> TransferError {
    TransferError::connection(peer, ConnectionFault::Altered { reply: false })
}

impl Served<'_> {
    /// Read the rest of a request (`extra` bytes after the header) and its
    /// tag; Err (closing the connection) when the tag does not verify.
    async fn rest<R: AsyncRead + Unpin>(
        &self,
        head: &[u8],
        extra: &mut [u8],
        rd: &mut R,
    ) -> Result<(), TransferError> {
        let intact = recv_payload(rd, self.mac, head, extra, None);
        if bounded(&self.peer, self.timeout, intact).await? {
            Ok(())
        } else {
            Err(altered(&self.peer))
        }
    }

    /// READ: the slice's bytes, straight from the segment (secured modes:
    /// only inside the capability the request shows); with `FLAG_ENCODE`,
    /// encoded into `scratch` with the block codec when that saves bytes.
    /// The checksum (or the MAC) covers the payload as sent.
    async fn read<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
        &self,
        req: &Request,
        head: &[u8],
        rd: &mut R,
        wr: &mut W,
        scratch: &mut Vec<u8>,
    ) -> Result<(), TransferError> {
        let mut cap = [0u8; CAPABILITY_BYTES];
        let cap = if req.flags & FLAG_CAPABILITY != 0 {
            self.rest(head, &mut cap, rd).await?;
            Some(&cap[..])
        } else {
            self.rest(head, &mut [], rd).await?;
            None
        };
        let region = match check(&self.inner.segments, req)
            .and_then(|r| authorize(self.inner, self.peer_id.as_deref(), req, cap).map(|()| r))
        {
            Ok(r) => r,
            Err(refusal) => return self.refuse(wr, &refusal).await,
        };
        // SAFETY: range checked; concurrent writers of the same range are
        // excluded by the segment owner's leases.
        let data = unsafe { region.slice(req.slice_offset as usize, req.slice_len as usize)? };
        let encoded =
            req.flags & FLAG_ENCODE != 0 && cpu_bound(|| encode_slice(data, req.width, scratch));
        let data = if encoded { &scratch[..] } else { data };
        // With a MAC the tag covers the payload; the checksum would only cost.
        let sum = if req.flags & FLAG_CHECKSUM != 0 && self.mac.is_none() {
            checksum(data)
        } else {
            0
        };
        let head = Response {
            encoded,
            ..Response::ok(sum, data.len() as u64)
        }
        .encode();
        // Fault injection: corrupted in flight, under the sender's tag.
        let corrupt = self.inner.take_corruption();
        let sent = send_payload(wr, self.mac, &head, data, corrupt);
        bounded(&self.peer, self.timeout, sent).await?;
        let m = &self.inner.metrics;
        if encoded {
            m.wire_encoded(DirectionLabel::ServedRead, data.len() as u64, req.slice_len);
        }
        if req.ends_op() {
            m.op_done(TransportLabel::Tcp, DirectionLabel::ServedRead, req.op_len);
        }
        Ok(())
    }

    /// WRITE: the payload straight into the segment (secured modes: only
    /// inside a range this engine granted the peer), then its checksum or tag.
    async fn write<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
        &self,
        req: &Request,
        head: &[u8],
        rd: &mut R,
        wr: &mut W,
    ) -> Result<(), TransferError> {
        let (peer, timeout) = (&self.peer, self.timeout);
        let granted = |r| match &self.peer_id {
            Some(id)
                if !self
                    .inner
                    .grants
                    .allows(id, req.segment, req.op_offset, req.op_len) =>
            {
                Err(Refusal::new(
                    Status::Forbidden,
                    0,
                    format!(
                        "no write grant to {id} covers {}+{}",
                        req.op_offset, req.op_len
                    ),
                ))
            }
            _ => Ok(r),
        };
        let region = match check(&self.inner.segments, req).and_then(granted) {
            Ok(r) => r,
            Err(refusal) => {
                // The bytes never go near a segment; the tag keeps the
                // counters in step.
                bounded(peer, timeout, discard(rd, req.slice_len)).await?;
                if let Some(mac) = self.mac {
                    let tag = crate::security::TAG_BYTES as u64;
                    bounded(peer, timeout, discard(rd, tag)).await?;
                    mac.skip_received();
                }
                return self.refuse(wr, &refusal).await;
            }
        };
        // SAFETY: as for READ; the writer owns the range.
        let dst = unsafe { region.slice_mut(req.slice_offset as usize, req.slice_len as usize)? };
        let sum = (req.flags & FLAG_CHECKSUM != 0).then_some(req.checksum);
        let intact = recv_payload(rd, self.mac, head, dst, sum);
        if !bounded(peer, timeout, intact).await? {
            let msg = format!(
                "checksum mismatch at {}+{}",
                req.slice_offset, req.slice_len
            );
            return self
                .refuse(wr, &Refusal::new(Status::Checksum, 0, msg))
                .await;
        }
        let ok = Response::ok(0, 0).encode();
        bounded(peer, timeout, send_frame(wr, self.mac, &ok, &[])).await?;
        if req.ends_op() {
            let m = &self.inner.metrics;
            m.op_done(TransportLabel::Tcp, DirectionLabel::ServedWrite, req.op_len);
        }
        Ok(())
    }

    /// A notification; an oversized one closes the connection.
    async fn notify<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
        &self,
        req: &Request,
        head: &[u8],
        rd: &mut R,
        wr: &mut W,
    ) -> Result<(), TransferError> {
        if req.slice_len > MAX_NOTIFY_BYTES {
            let bad = BadInput::NotificationTooLarge {
                len: req.slice_len,
                max: MAX_NOTIFY_BYTES,
            };
            self.refuse(wr, &Refusal::new(Status::BadRequest, 0, bad.to_string()))
                .await?;
            return Err(TransferError::InvalidArgument(bad));
        }
        let mut payload = vec![0u8; req.slice_len as usize];
        self.rest(head, &mut payload, rd).await?;
        // No receiver yet is fine: notifications are best effort.
        let _ = self.inner.notify_tx.send(Notification {
            from_pid: self.from_pid,
            payload,
        });
        let ok = Response::ok(0, 0).encode();
        bounded(&self.peer, self.timeout, send_frame(wr, self.mac, &ok, &[])).await
    }

    /// Secured modes carry no rdma: one-sided verbs cannot show a capability.
    async fn no_rdma<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
        &self,
        req: &Request,
        head: &[u8],
        rd: &mut R,
        wr: &mut W,
    ) -> Result<(), TransferError> {
        let n = match req.kind {
            RequestKind::RdmaConnect if req.slice_len == RDMA_ENDPOINT_BYTES as u64 => {
                req.slice_len
            }
            RequestKind::RdmaRange => 0,
            kind => {
                return Err(TransferError::InvalidArgument(BadInput::BadRequest {
                    transport: "rdma",
                    kind: kind as u8,
                    len: req.slice_len,
                }))
            }
        };
        let mut extra = vec![0u8; n as usize];
        self.rest(head, &mut extra, rd).await?;
        let msg = "rdma is off in secured modes (one-sided verbs cannot be capability-checked)";
        self.answer(wr, &Refusal::new(Status::Unsupported, 0, msg))
            .await
    }

    /// rdma: a queue pair connected to the peer's endpoint, ours in return;
    /// a malformed request closes the connection.
    async fn rdma_connect<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
        &self,
        req: &Request,
        qps: &mut ServedQps,
        rd: &mut R,
        wr: &mut W,
    ) -> Result<(), TransferError> {
        if req.slice_len != RDMA_ENDPOINT_BYTES as u64 {
            let bad = BadInput::RdmaEndpointLen { len: req.slice_len };
            self.answer(wr, &Refusal::new(Status::BadRequest, 0, bad.to_string()))
                .await?;
            return Err(TransferError::InvalidArgument(bad));
        }
        let mut theirs = [0u8; RDMA_ENDPOINT_BYTES];
        bounded(&self.peer, self.timeout, rd.read_exact(&mut theirs)).await?;
        let accepted = match RdmaEndpoint::decode(&theirs) {
            Ok(remote) => qps
                .accept(self.nic, remote)
                .map_err(|e| Refusal::new(Status::Unsupported, 0, e.to_string())),
            Err(e) => Err(Refusal::new(Status::BadRequest, 0, e.to_string())),
        };
        match accepted {
            Ok(ours) => {
                let head = Response::ok(0, RDMA_ENDPOINT_BYTES as u64).encode();
                let body = ours.encode();
                bounded(
                    &self.peer,
                    self.timeout,
                    send_frame(wr, self.mac, &head, &body),
                )
                .await
            }
            Err(refusal) => self.answer(wr, &refusal).await,
        }
    }

    /// rdma: check an op's range and answer the segment's key (and the
    /// range's checksum when asked).
    async fn rdma_range<W: AsyncWrite + Unpin>(
        &self,
        req: &Request,
        wr: &mut W,
    ) -> Result<(), TransferError> {
        let region = match check(&self.inner.segments, req) {
            Ok(r) => r,
            Err(refusal) => return self.refuse(wr, &refusal).await,
        };
        let Some(key) = self.nic.key(SegmentId(req.segment)) else {
            let msg = "segment not registered with an RDMA NIC";
            return self
                .answer(wr, &Refusal::new(Status::Unsupported, 0, msg))
                .await;
        };
        let sum = if req.flags & FLAG_CHECKSUM != 0 {
            // SAFETY: range checked; as for READ.
            checksum(unsafe { region.slice(req.op_offset as usize, req.op_len as usize)? })
        } else {
            0
        };
        let head = Response::ok(sum, RDMA_KEY_BYTES as u64).encode();
        let body = key.encode();
        bounded(
            &self.peer,
            self.timeout,
            send_frame(wr, self.mac, &head, &body),
        )
        .await
    }

    /// Refuse an op (counted as a failed op).
    async fn refuse<W: AsyncWrite + Unpin>(
        &self,
        wr: &mut W,
        refusal: &Refusal,
    ) -> Result<(), TransferError> {
        self.inner.metrics.op_failed(TransportLabel::Tcp);
        self.answer(wr, refusal).await
    }

    /// Answer with a non-OK status (not counted as a failed op).
    async fn answer<W: AsyncWrite + Unpin>(
        &self,
        wr: &mut W,
        refusal: &Refusal,
    ) -> Result<(), TransferError> {
        let (head, msg) = refusal.frame();
        bounded(
            &self.peer,
            self.timeout,
            send_frame(wr, self.mac, &head, msg),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::super::protocol::RESPONSE_BYTES;
    use super::*;
    use crate::hello::{Hello, HELLO_BYTES};
    use crate::{SharedRegion, TransferConfig, TransferEngine};
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    async fn request(s: &mut TcpStream, req: Request, payload: &[u8]) -> (Response, Vec<u8>) {
        s.write_all(&req.encode()).await.unwrap();
        s.write_all(payload).await.unwrap();
        let mut head = [0u8; RESPONSE_BYTES];
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
            width: 0,
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
            wire_codec: false,
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
        let connect = Request::control(RequestKind::RdmaConnect, RDMA_ENDPOINT_BYTES as u64);
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
