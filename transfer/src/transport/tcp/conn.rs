//! A transfer connection as the security mode makes it ([`Link`]): opened
//! and accepted here, authenticated before any op. Mode `none`: plain tcp,
//! then hellos. Secured modes: a mutual-TLS handshake first (both ends show
//! a certificate of the cluster CA; the peer's node id is read from its
//! certificate), the hellos inside TLS; then `encrypt` keeps TLS for every
//! byte, while `authenticate` leaves TLS (no session tickets, nothing
//! pipelined across the switch) and tags every frame with the keyed MAC
//! exported from the session ([`ConnMac`]).

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{tcp, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};

use crate::checksum::Checksummer;
use crate::core::Inner;
use crate::error::ConnectionFault;
use crate::hello::{Hello, HELLO_BYTES};
use crate::security::{node_id_of, ConnMac, NodeIdentity, SecurityMode, TAG_BYTES};
use crate::transport::io::{bounded, write_all_v};
use crate::TransferError;

/// The byte stream of a connection.
pub(crate) enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// An authenticated (or, in mode `none`, plain) connection: its stream, the
/// MAC every frame carries (`authenticate`), the peer's node id (secured modes).
pub(crate) struct Link {
    pub conn: Conn,
    pub mac: Option<Arc<ConnMac>>,
    pub peer_id: Option<String>,
    /// Secured modes: the peer's certificate (DER), checked against the
    /// revocation list on every use.
    pub peer_cert: Option<Arc<[u8]>>,
    /// The peer's hello announced wire compression: READs on this link may
    /// carry `FLAG_ENCODE` (never on a link to an older peer).
    pub peer_codec: bool,
}

/// Reading half of a [`Conn`].
pub(crate) enum ConnRead<'a> {
    Plain(tcp::ReadHalf<'a>),
    Tls(tokio::io::ReadHalf<&'a mut TlsStream<TcpStream>>),
}

/// Writing half of a [`Conn`].
pub(crate) enum ConnWrite<'a> {
    Plain(tcp::WriteHalf<'a>),
    Tls(tokio::io::WriteHalf<&'a mut TlsStream<TcpStream>>),
}

impl Conn {
    /// Whether the peer closed this idle connection (end of stream, or an
    /// error pending: a killed or restarted peer), seen without reading or
    /// waiting: a non-blocking peek at the socket. Bytes waiting (a TLS
    /// record) do not count as closed.
    pub fn peer_closed(&self) -> bool {
        use std::os::fd::AsRawFd;
        let tcp = match self {
            Conn::Plain(s) => s,
            Conn::Tls(t) => t.get_ref().0,
        };
        let mut b = [0u8; 1];
        // SAFETY: `b` is valid for 1 byte; MSG_PEEK leaves the data queued.
        let n = unsafe {
            libc::recv(
                tcp.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        let err = std::io::Error::last_os_error().kind();
        n == 0
            || (n < 0
                && !matches!(
                    err,
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ))
    }

    /// Halves that can be driven concurrently (a TLS stream's share a lock).
    pub fn split(&mut self) -> (ConnRead<'_>, ConnWrite<'_>) {
        match self {
            Conn::Plain(s) => {
                let (r, w) = s.split();
                (ConnRead::Plain(r), ConnWrite::Plain(w))
            }
            Conn::Tls(s) => {
                let (r, w) = tokio::io::split(&mut **s);
                (ConnRead::Tls(r), ConnWrite::Tls(w))
            }
        }
    }
}

macro_rules! delegate_read {
    ($t:ty, $($v:ident),+) => {
        impl AsyncRead for $t {
            fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
                match self.get_mut() { $(Self::$v(s) => Pin::new(s).poll_read(cx, buf)),+ }
            }
        }
    };
}
macro_rules! delegate_write {
    ($t:ty, $($v:ident),+) => {
        impl AsyncWrite for $t {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
                match self.get_mut() { $(Self::$v(s) => Pin::new(s).poll_write(cx, buf)),+ }
            }
            fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
                match self.get_mut() { $(Self::$v(s) => Pin::new(s).poll_write_vectored(cx, bufs)),+ }
            }
            fn is_write_vectored(&self) -> bool {
                match self { $(Self::$v(s) => s.is_write_vectored()),+ }
            }
            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
                match self.get_mut() { $(Self::$v(s) => Pin::new(s).poll_flush(cx)),+ }
            }
            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
                match self.get_mut() { $(Self::$v(s) => Pin::new(s).poll_shutdown(cx)),+ }
            }
        }
    };
}
delegate_read!(Conn, Plain, Tls);
delegate_write!(Conn, Plain, Tls);
delegate_read!(ConnRead<'_>, Plain, Tls);
delegate_write!(ConnWrite<'_>, Plain, Tls);

/// Bytes of a payload handled per step: a sender MACs each piece just
/// before the socket copies it out, a receiver MACs (or checksums) it just
/// after it lands, so the pass over the payload finds it in cache (L2 is 1
/// MiB per core here) instead of reading a whole slice from memory twice.
const PIECE: usize = 256 << 10;

/// Write one frame: `head`, `body`, then its tag when the link MACs frames.
pub(crate) async fn send_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    mac: Option<&ConnMac>,
    head: &[u8],
    body: &[u8],
) -> std::io::Result<()> {
    send_payload(w, mac, head, body, false).await
}

/// [`send_frame`], the body in [`PIECE`]s, each MACed right before it is
/// written; the header goes with the first piece and the tag with the last.
/// `corrupt` (fault injection, `Inner::take_corruption`): the body's first
/// byte is flipped on the wire while the tag covers the bytes meant, as an
/// attacker in flight would leave it.
pub(crate) async fn send_payload<W: AsyncWrite + Unpin>(
    w: &mut W,
    mac: Option<&ConnMac>,
    head: &[u8],
    body: &[u8],
    corrupt: bool,
) -> std::io::Result<()> {
    let mut tag = mac.map(|m| m.sending(head));
    // Without a MAC nothing is computed per piece: the body goes in one
    // vectored write with its header. In pieces it costs tcp throughput
    // ~12% (four writes per 1 MiB slice, each waking the reader on a
    // 2-core machine).
    let step = if tag.is_some() {
        PIECE
    } else {
        body.len().max(1)
    };
    let pieces = body.len().div_ceil(step).max(1);
    for i in 0..pieces {
        let piece = &body[i * step..((i + 1) * step).min(body.len())];
        if let Some(t) = tag.as_mut() {
            t.update(piece);
        }
        let flipped = (corrupt && i == 0).then(|| {
            let mut bad = piece.to_vec();
            if let Some(b) = bad.first_mut() {
                *b ^= 0xff;
            }
            bad
        });
        let wire = flipped.as_deref().unwrap_or(piece);
        let first = if i == 0 { head } else { &[] };
        let last = (i + 1 == pieces).then(|| tag.as_ref().map(|t| t.finish()));
        let tail = last.flatten();
        write_all_v(w, [first, wire, tail.as_ref().map_or(&[], |t| &t[..])]).await?;
    }
    // TLS (encrypt) holds records until flushed; plain tcp flushes for free.
    w.flush().await
}

/// Read a frame's payload into `dst` (header `head` already read) and check
/// it: against the tag that follows it when the link MACs frames, else
/// against `checksum` when one was sent. Each [`PIECE`] is hashed as soon as
/// it lands. Whether the payload is intact; the stream stays in step either way.
pub(crate) async fn recv_payload<R: AsyncRead + Unpin>(
    r: &mut R,
    mac: Option<&ConnMac>,
    head: &[u8],
    dst: &mut [u8],
    checksum: Option<u64>,
) -> std::io::Result<bool> {
    let mut tag = mac.map(|m| m.receiving(head));
    let mut sum = checksum
        .filter(|_| mac.is_none())
        .map(|_| Checksummer::new());
    for piece in dst.chunks_mut(PIECE) {
        r.read_exact(piece).await?;
        if let Some(t) = tag.as_mut() {
            t.update(piece);
        }
        if let Some(s) = sum.as_mut() {
            s.update(piece);
        }
    }
    if let Some(t) = tag {
        return read_tag(r).await.map(|got| t.verify(&got));
    }
    Ok(sum.zip(checksum).is_none_or(|(s, want)| s.digest() == want))
}

/// Read the tag after a received frame whose body was already read, and
/// check it (true without a MAC).
pub(crate) async fn frame_ok<R: AsyncRead + Unpin>(
    r: &mut R,
    mac: Option<&ConnMac>,
    head: &[u8],
    body: &[u8],
) -> std::io::Result<bool> {
    let Some(mac) = mac else {
        return Ok(true);
    };
    let mut t = mac.receiving(head);
    t.update(body);
    read_tag(r).await.map(|got| t.verify(&got))
}

async fn read_tag<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<[u8; TAG_BYTES]> {
    let mut tag = [0u8; TAG_BYTES];
    r.read_exact(&mut tag).await?;
    Ok(tag)
}

/// Exchange hellos over `s`; the initiator speaks first.
async fn hellos<S: AsyncRead + AsyncWrite + Unpin>(
    inner: &Inner,
    peer: &str,
    s: &mut S,
    initiator: bool,
) -> Result<Hello, TransferError> {
    let timeout = inner.config.op_timeout();
    let mut buf = [0u8; HELLO_BYTES];
    if initiator {
        bounded(peer, timeout, s.write_all(&inner.hello.encode())).await?;
        bounded(peer, timeout, s.flush()).await?;
        bounded(peer, timeout, s.read_exact(&mut buf)).await?;
    } else {
        bounded(peer, timeout, s.read_exact(&mut buf)).await?;
        bounded(peer, timeout, s.write_all(&inner.hello.encode())).await?;
        bounded(peer, timeout, s.flush()).await?;
    }
    Hello::decode(&buf)
}

/// The peer's node id from a finished TLS session.
fn peer_id<D>(peer: &str, tls: &rustls::ConnectionCommon<D>) -> Result<String, TransferError> {
    tls.peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| node_id_of(c))
        .ok_or_else(|| TransferError::connection(peer, ConnectionFault::NoNodeId))
}

/// Open the initiating end of a connection to `peer` on `tcp`.
pub(crate) async fn open(
    inner: &Inner,
    peer: &str,
    mut tcp: TcpStream,
) -> Result<(Link, Hello), TransferError> {
    let Some(id) = secured(inner) else {
        let hello = hellos(inner, peer, &mut tcp, true).await?;
        return Ok((Link::plain(tcp, &hello), hello));
    };
    let connector = TlsConnector::from(id.client.clone());
    let timeout = inner.config.op_timeout();
    let expected = inner.expected_node(peer);
    let tls = bounded(
        peer,
        timeout,
        connector.connect(NodeIdentity::server_name(expected.as_deref()), tcp),
    )
    .await?;
    let (link, hello) = secured_link(inner, peer, id.mode, tls).await?;
    match (expected, &link.peer_id) {
        (Some(want), Some(got)) if want != *got => Err(TransferError::connection(
            peer,
            ConnectionFault::WrongNode {
                expected: want,
                presented: got.clone(),
            },
        )),
        _ => Ok((link, hello)),
    }
}

/// Accept the serving end of a connection from `peer` on `tcp`.
pub(crate) async fn accept(
    inner: &Inner,
    peer: &str,
    mut tcp: TcpStream,
) -> Result<(Link, Hello), TransferError> {
    let Some(id) = secured(inner) else {
        let hello = hellos(inner, peer, &mut tcp, false).await?;
        return Ok((Link::plain(tcp, &hello), hello));
    };
    let acceptor = TlsAcceptor::from(id.server.clone());
    let timeout = inner.config.op_timeout();
    let tls = bounded(peer, timeout, acceptor.accept(tcp)).await?;
    secured_link(inner, peer, id.mode, tls).await
}

impl Link {
    /// A link with no security: the bare TCP stream, to the peer that
    /// said `hello`.
    fn plain(tcp: TcpStream, hello: &Hello) -> Link {
        Link {
            conn: Conn::Plain(tcp),
            mac: None,
            peer_id: None,
            peer_cert: None,
            peer_codec: hello.wire_codec,
        }
    }
}

/// Either end of a finished TLS handshake over TCP, for [`secured_link`].
trait TlsEnd: AsyncRead + AsyncWrite + Unpin {
    /// The initiating end (it speaks first, and keys the MAC as the client).
    const INITIATOR: bool;
    type Data;
    fn session(&self) -> &rustls::ConnectionCommon<Self::Data>;
    fn into_tls(self) -> TlsStream<TcpStream>;
    fn into_tcp(self) -> TcpStream;
}

impl TlsEnd for tokio_rustls::client::TlsStream<TcpStream> {
    const INITIATOR: bool = true;
    type Data = rustls::client::ClientConnectionData;
    fn session(&self) -> &rustls::ConnectionCommon<Self::Data> {
        self.get_ref().1
    }
    fn into_tls(self) -> TlsStream<TcpStream> {
        TlsStream::Client(self)
    }
    fn into_tcp(self) -> TcpStream {
        self.into_inner().0
    }
}

impl TlsEnd for tokio_rustls::server::TlsStream<TcpStream> {
    const INITIATOR: bool = false;
    type Data = rustls::server::ServerConnectionData;
    fn session(&self) -> &rustls::ConnectionCommon<Self::Data> {
        self.get_ref().1
    }
    fn into_tls(self) -> TlsStream<TcpStream> {
        TlsStream::Server(self)
    }
    fn into_tcp(self) -> TcpStream {
        self.into_inner().0
    }
}

/// Hellos over a finished TLS session, the peer's node id from its
/// certificate, then the link: the TLS stream itself (`encrypt`), or the
/// bare TCP stream with a MAC keyed from the session (`authenticate`).
async fn secured_link<T: TlsEnd>(
    inner: &Inner,
    peer: &str,
    mode: SecurityMode,
    mut tls: T,
) -> Result<(Link, Hello), TransferError> {
    let hello = hellos(inner, peer, &mut tls, T::INITIATOR).await?;
    let peer_id = Some(peer_id(peer, tls.session())?);
    let peer_cert: Option<Arc<[u8]>> = tls
        .session()
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| Arc::from(c.as_ref()));
    if peer_cert.as_deref().is_some_and(|c| revoked(inner, c)) {
        return Err(TransferError::connection(peer, ConnectionFault::Revoked));
    }
    let link = if mode == SecurityMode::Encrypt {
        Link {
            conn: Conn::Tls(Box::new(tls.into_tls())),
            mac: None,
            peer_id,
            peer_cert,
            peer_codec: hello.wire_codec,
        }
    } else {
        let mac = ConnMac::export(tls.session(), T::INITIATOR)?;
        Link {
            conn: Conn::Plain(tls.into_tcp()),
            mac: Some(Arc::new(mac)),
            peer_id,
            peer_cert,
            peer_codec: hello.wire_codec,
        }
    };
    Ok((link, hello))
}

/// Whether the peer certificate `der` is on this engine's revocation list.
pub(crate) fn revoked(inner: &Inner, der: &[u8]) -> bool {
    secured(inner).is_some_and(|id| id.is_revoked(der))
}

/// This engine's identity when its mode is a secured one.
pub(crate) fn secured(inner: &Inner) -> Option<&Arc<NodeIdentity>> {
    inner
        .config
        .identity
        .as_ref()
        .filter(|i| i.mode != SecurityMode::None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::checksum;

    /// Frames whose bodies span several pieces arrive intact and verified;
    /// a body corrupted in flight fails its tag (or, without a MAC, its
    /// checksum), and the stream stays in step for the next frame.
    #[tokio::test]
    async fn pieced_frames_verify_and_a_corrupted_one_fails() {
        let body: Vec<u8> = (0..(2 * PIECE + 12_345) as u32)
            .map(|i| (i * 17 % 253) as u8)
            .collect();
        let head = [9u8; 24];
        for mac in [true, false] {
            let (a, b) = ConnMac::pair_for_tests();
            let (tx_mac, rx_mac) = if mac {
                (Some(&a), Some(&b))
            } else {
                (None, None)
            };
            let (mut w, mut r) = tokio::io::duplex(64 << 10);
            let sent = body.clone();
            let writer = async {
                for corrupt in [false, true, false] {
                    send_payload(&mut w, tx_mac, &head, &sent, corrupt)
                        .await
                        .unwrap();
                }
                send_frame(&mut w, tx_mac, &head, b"tail").await.unwrap();
            };
            let reader = async {
                let mut seen = Vec::new();
                for _ in 0..3 {
                    let mut h = [0u8; 24];
                    r.read_exact(&mut h).await.unwrap();
                    let mut dst = vec![0u8; body.len()];
                    let sum = Some(checksum(&body));
                    seen.push(
                        recv_payload(&mut r, rx_mac, &h, &mut dst, sum)
                            .await
                            .unwrap(),
                    );
                    assert_eq!(dst[1..], body[1..]);
                }
                let mut h = [0u8; 24];
                r.read_exact(&mut h).await.unwrap();
                let mut tail = [0u8; 4];
                r.read_exact(&mut tail).await.unwrap();
                assert!(frame_ok(&mut r, rx_mac, &h, &tail).await.unwrap());
                assert_eq!(&tail, b"tail");
                seen
            };
            let ((), seen) = tokio::join!(writer, reader);
            assert_eq!(seen, [true, false, true], "mac {mac}");
        }
    }
}
