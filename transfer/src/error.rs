//! The transfer crate's one error type.
//!
//! Every op of a batch reports its own `Result<(), TransferError>`, so the
//! variants name what went wrong with that op precisely enough for a caller to
//! decide between "retry elsewhere" (peer faults) and "bug" (bad ranges).

use kvfabric_types::IoError;

/// Everything that can go wrong moving bytes.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum TransferError {
    /// A caller passed something unusable (what, and its values).
    #[error("invalid argument: {0}")]
    InvalidArgument(BadInput),
    /// A range that does not lie inside its segment.
    #[error("range {offset}+{len} is outside the segment ({segment_len} bytes)")]
    OutOfBounds {
        offset: u64,
        len: u64,
        segment_len: u64,
    },
    /// The named segment is not registered (never was, or was unregistered).
    #[error("unknown segment {segment} on {side}")]
    UnknownSegment {
        /// `local` or the peer's address.
        side: String,
        segment: u64,
    },
    /// The peer refused an op or a notification as malformed.
    #[error("peer {peer} refused the op: {reason}")]
    Refused { peer: String, reason: RefusalReason },
    /// An op its caller has no right to (no or a wrong capability, a WRITE
    /// outside the ranges the peer granted, shm from another user).
    #[error("peer {peer} forbade the op: {reason}")]
    Forbidden {
        peer: String,
        reason: ForbiddenReason,
    },
    /// A payload did not match the checksum its sender computed.
    #[error("checksum mismatch on {segment}@{offset}+{len}")]
    Checksum { segment: u64, offset: u64, len: u64 },
    /// A slice that arrived encoded with the block codec (wire compression)
    /// and intact did not decode into its `len` bytes at local
    /// `segment@offset` (a peer's codec bug, or a lying peer).
    #[error("encoded slice for {segment}@{offset}+{len} does not decode: {error}")]
    Decode {
        segment: u64,
        offset: u64,
        len: u64,
        error: kvfabric_codec::CodecError,
    },
    /// The peer did not answer within the op timeout.
    #[error("peer {peer} timed out after {timeout_ms} ms")]
    Timeout { peer: String, timeout_ms: u64 },
    /// The connection to the peer broke (peer died, reset, protocol error):
    /// `cause` says how.
    #[error("connection to {peer} failed: {cause}")]
    Connection {
        peer: String,
        #[source]
        cause: ConnectionFault,
    },
    /// A transport or device this build or host does not have (which).
    #[error("unsupported: {0}")]
    Unsupported(Missing),
    /// An OS or device call (or a task doing one) failed: `op` names it,
    /// `source` is its error (kind `Other`, holding the library's or the
    /// task's own error, when there was no OS error).
    #[error("i/o error: {op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: IoError,
    },
}

impl TransferError {
    /// [`TransferError::Io`] of `op` from the OS error `e`.
    pub fn io(op: &'static str, e: std::io::Error) -> Self {
        TransferError::Io {
            op,
            source: e.into(),
        }
    }

    /// [`TransferError::Io`] of `op` without an OS error: `e` is what
    /// failed instead (a task's `JoinError`, a CUDA driver error), kept as
    /// the source of an `Other` I/O error.
    pub fn io_other(
        op: &'static str,
        e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::io(op, std::io::Error::other(e))
    }

    /// [`TransferError::Connection`] to `peer`, broken by `cause`.
    pub fn connection(peer: impl Into<String>, cause: ConnectionFault) -> Self {
        TransferError::Connection {
            peer: peer.into(),
            cause,
        }
    }
}

/// How a connection to a peer broke ([`TransferError::Connection`]).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ConnectionFault {
    /// A read or write on it failed (reset, closed mid-frame, ...).
    #[error("{0}")]
    Io(#[source] IoError),
    /// The peer closed it.
    #[error("closed")]
    Closed,
    /// There is no `transport` link to the peer (none was opened, or the
    /// pool was dropped) and no connection could be taken.
    #[error("no {transport} link")]
    NoLink { transport: &'static str },
    /// No link was left to ask the peer for the checksums of the WRITEs.
    #[error("no link left to verify writes")]
    NoLinkToVerify,
    /// The batch ended with this op's slices still outstanding.
    #[error("op left unfinished")]
    Unfinished,
    /// The task driving the connection died (panicked or was cancelled):
    /// its `JoinError`.
    #[error("connection task failed: {0}")]
    Task(#[source] IoError),
    /// A reply (`reply`) or request frame whose MAC did not verify.
    #[error(
        "a {} frame failed its MAC (altered in flight?)",
        if *reply { "reply" } else { "request" }
    )]
    Altered { reply: bool },
    /// A READ reply of `len` bytes for a `slice`-byte slice: `encoded`
    /// says how it came, `asked` whether encoding was asked for.
    #[error(
        "peer sent {len} {} bytes for a {slice}-byte slice",
        payload_form(*encoded, *asked)
    )]
    PayloadSize {
        len: u64,
        slice: u64,
        encoded: bool,
        asked: bool,
    },
    /// A peer whose TLS certificate names no node id.
    #[error("tls: peer certificate names no node")]
    NoNodeId,
    /// A peer whose certificate is on the revocation list.
    #[error("tls: the peer's certificate is revoked")]
    Revoked,
    /// A peer whose certificate names another node than the one meant.
    #[error("tls: meant to reach node {expected:?}, the peer's certificate names {presented:?}")]
    WrongNode { expected: String, presented: String },
    /// An RDMA endpoint reply of `len` bytes (not the encoded size).
    #[error("rdma endpoint of {len} bytes")]
    RdmaEndpointLen { len: u64 },
    /// An RDMA key reply of `len` bytes (not the encoded size).
    #[error("rdma key of {len} bytes")]
    RdmaKeyLen { len: u64 },
}

impl From<std::io::Error> for ConnectionFault {
    fn from(e: std::io::Error) -> Self {
        ConnectionFault::Io(e.into())
    }
}

/// How a READ payload came, for [`ConnectionFault::PayloadSize`].
fn payload_form(encoded: bool, asked: bool) -> &'static str {
    match (encoded, asked) {
        (true, false) => "encoded (not asked)",
        (true, true) => "encoded",
        (false, _) => "raw",
    }
}

/// Why a peer refused an op ([`TransferError::Refused`]).
///
/// The peer's reason crosses the wire as text: a refusal is a status byte
/// and the peer's own UTF-8 message (`tcp/protocol.rs`), so `message` is
/// kept as the peer sent it; the status is what this side knows as a type.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RefusalReason {
    /// The peer answered an op "bad request": it cannot serve the request
    /// as sent.
    #[error("{message}")]
    BadRequest { message: String },
    /// The peer did not take a notification (an oversized one).
    #[error("notification not taken: {message}")]
    Notification { message: String },
}

/// Why an op was forbidden ([`TransferError::Forbidden`]).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ForbiddenReason {
    /// The peer answered "forbidden" (no or a wrong capability, a WRITE
    /// outside its grants). Its reason crosses the wire as text (see
    /// [`RefusalReason`]), kept as the peer sent it.
    #[error("{message}")]
    Peer { message: String },
    /// In a secured mode this engine serves shm only to processes of its
    /// own user, and the peer runs as another.
    #[error("shm is served to this user's processes only")]
    ShmOtherUser,
}

/// What was unusable ([`TransferError::InvalidArgument`]), with the values
/// a caller can act on; each reads as the `String` it replaced.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum BadInput {
    /// An op of zero bytes.
    #[error("zero-length op")]
    ZeroLengthOp,
    /// An op a batch never ran (its result slot stayed empty).
    #[error("op not run")]
    OpNotRun,
    /// Engine settings (`keys`) that must be positive.
    #[error("{keys} must be positive")]
    NotPositive { keys: &'static str },
    /// A peer whose hello has the wrong magic or version.
    #[error("not a kvfabric transfer peer (magic {magic:#x}, version {version})")]
    NotAPeer { magic: u32, version: u16 },
    /// A notification not sent because an op of its batch failed.
    #[error("notification withheld: an op failed")]
    NotificationWithheld,
    /// A notification of `len` bytes, over `max`.
    #[error("notification of {len} bytes is too large (max {max})")]
    NotificationTooLarge { len: u64, max: u64 },
    /// A request kind byte this protocol does not have.
    #[error("unknown request kind {kind}")]
    UnknownRequestKind { kind: u8 },
    /// A response status byte this protocol does not have.
    #[error("unknown response status {status}")]
    UnknownStatus { status: u8 },
    /// A response encoding byte this protocol does not have.
    #[error("unknown payload encoding {encoding}")]
    UnknownEncoding { encoding: u8 },
    /// A request a transport's server cannot serve (`transport`: `shm`,
    /// `rdma`; `kind` its kind byte, `len` its size field).
    #[error("bad {transport} request kind {kind} / size {len}")]
    BadRequest {
        transport: &'static str,
        kind: u8,
        len: u64,
    },
    /// An RDMA endpoint of `len` bytes (not the encoded size).
    #[error("bad rdma endpoint: {len} bytes")]
    RdmaEndpointLen { len: u64 },
    /// An RDMA endpoint with reserved bytes set.
    #[error("bad rdma endpoint: reserved bytes set")]
    RdmaEndpointReserved,
    /// An RDMA endpoint whose queue pair number is not 24-bit nonzero.
    #[error("bad rdma endpoint: queue pair number {qp_num:#x}")]
    RdmaQueuePair { qp_num: u32 },
    /// An RDMA key of `len` bytes, or with reserved bytes set.
    #[error("bad rdma key ({len} bytes)")]
    RdmaKey { len: usize },
    /// A security mode that is none of the three.
    #[error("security mode {got:?} (want none, authenticate or encrypt)")]
    SecurityMode { got: String },
    /// Some but not all of cert, key and ca.
    #[error("security: give cert, key and ca together")]
    SecurityFilesPartial,
    /// A secured `mode` without cert, key and ca.
    #[error("security mode {mode} needs cert, key and ca")]
    SecurityFilesMissing { mode: &'static str },
    /// A region or layout the vocabulary crate refused (its error, which
    /// reads as its message).
    #[error("{}", vocabulary_message(.0))]
    Vocabulary(kvfabric_types::TypesError),
    /// Credentials that could not be read, made or used: `what` (a file
    /// read, `certs`, a certificate or key, the TLS exporter), `reason`
    /// what the library or the OS said.
    #[error("{what}: {reason}")]
    Credentials { what: String, reason: String },
}

/// What this build or host lacks ([`TransferError::Unsupported`]).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Missing {
    /// The peer answered "unsupported" with its own `reason` (text from its
    /// response frame: see [`RefusalReason`]).
    #[error("{peer}: {reason}")]
    PeerRefused { peer: String, reason: String },
    /// shm to a peer on another host.
    #[error("shm to {peer}: peer is on another host")]
    ShmRemote { peer: String },
    /// rdma asked for in a secured mode (one-sided verbs show no capability).
    #[error("rdma is off in secured modes")]
    RdmaSecured,
    /// No (local) RDMA device: `what` says which was looked for.
    #[error("{what}")]
    RdmaDevice { what: &'static str },
    /// No RDMA device of the configured name.
    #[error("no RDMA device named {want:?}")]
    RdmaDeviceNamed { want: Option<String> },
    /// The peer has no RDMA device.
    #[error("{peer} has no RDMA device")]
    PeerRdma { peer: String },
    /// RDMA to `peer` was turned off after it failed before any op succeeded.
    #[error("rdma to {peer} is off: it failed before any op succeeded")]
    RdmaDisabled { peer: String },
    /// More queue pairs on one connection than `max`.
    #[error("too many queue pairs on one connection (max {max})")]
    QueuePairs { max: usize },
    /// The verbs provider lacks `op` (`post_send`, `poll_cq`, ...).
    #[error("provider has no {op}")]
    ProviderOp { op: &'static str },
    /// This binary was built without the rdma feature.
    #[error("built without the rdma feature")]
    RdmaFeature,
    /// No CUDA driver library.
    #[error("no CUDA device: driver library not found")]
    CudaDriver,
    /// No CUDA device `ordinal` (`count` present).
    #[error("no CUDA device {ordinal} ({count} present)")]
    CudaDevice { ordinal: usize, count: usize },
    /// No NVRTC library (libnvrtc.so*) to compile the GPU kernels with.
    #[error("NVRTC (libnvrtc) not found: the GPU kernels cannot be compiled")]
    Nvrtc,
}

/// Regions (`kvfabric-types`) report the variants this crate reported when
/// it owned them.
impl From<kvfabric_types::TypesError> for TransferError {
    fn from(e: kvfabric_types::TypesError) -> Self {
        use kvfabric_types::TypesError as T;
        match e {
            e @ T::InvalidArgument(_) => TransferError::InvalidArgument(BadInput::Vocabulary(e)),
            T::OutOfBounds {
                offset,
                len,
                segment_len,
            } => TransferError::OutOfBounds {
                offset,
                len,
                segment_len,
            },
            T::Io { op, source } => TransferError::Io { op, source },
        }
    }
}

/// A vocabulary error's message without its own "invalid argument: "
/// (the variant holding it says that already).
pub fn vocabulary_message(e: &kvfabric_types::TypesError) -> String {
    match e {
        kvfabric_types::TypesError::InvalidArgument(msg) => msg.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hello with the wrong magic names the magic and version it saw as
    /// fields, and reads as the string it replaced.
    #[test]
    fn bad_hello_is_typed_and_reads_as_before() {
        let mut b = [0u8; crate::hello::HELLO_BYTES];
        b[..4].copy_from_slice(&0x1234u32.to_le_bytes());
        b[4..6].copy_from_slice(&9u16.to_le_bytes());
        let e = crate::hello::Hello::decode(&b).unwrap_err();
        assert_eq!(
            e,
            TransferError::InvalidArgument(BadInput::NotAPeer {
                magic: 0x1234,
                version: 9
            })
        );
        assert_eq!(
            e.to_string(),
            "invalid argument: not a kvfabric transfer peer (magic 0x1234, version 9)"
        );
    }

    /// Binding the engine to a taken address says which OS call failed and
    /// keeps the OS error's kind.
    #[tokio::test]
    async fn taken_listen_address_is_a_typed_io_error() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let cfg = crate::TransferConfig {
            listen: taken.local_addr().unwrap().to_string(),
            ..Default::default()
        };
        let mut registry = prometheus_client::registry::Registry::default();
        match crate::TransferEngine::start(cfg, &mut registry).await {
            Err(e @ TransferError::Io { .. }) => {
                let TransferError::Io { op, source } = &e else {
                    unreachable!()
                };
                assert_eq!(
                    (*op, source.kind()),
                    ("tcp bind", std::io::ErrorKind::AddrInUse)
                );
                let os = std::error::Error::source(&e).expect("the OS error");
                assert_eq!(os.to_string(), source.to_string());
                assert!(e.to_string().starts_with("i/o error: tcp bind: "), "{e}");
            }
            other => panic!("expected Io, got {:?}", other.map(|_| ())),
        }
    }

    /// A broken connection names its peer, reads as its cause, and keeps
    /// the I/O error as the source of that cause; one error can fail every
    /// op of a batch (clones compare equal).
    #[test]
    fn a_broken_connection_keeps_its_io_error() {
        use std::error::Error as _;
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let e = TransferError::connection("10.0.0.2:7400", reset.into());
        assert_eq!(
            e.to_string(),
            "connection to 10.0.0.2:7400 failed: connection reset"
        );
        let io = e
            .source()
            .and_then(|cause| cause.source())
            .and_then(|s| s.downcast_ref::<IoError>())
            .expect("the I/O error");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
        assert_eq!(e.clone(), e);
        let altered = TransferError::connection("p", ConnectionFault::Altered { reply: true });
        assert_eq!(
            altered.to_string(),
            "connection to p failed: a reply frame failed its MAC (altered in flight?)"
        );
        let short = ConnectionFault::PayloadSize {
            len: 10,
            slice: 4096,
            encoded: true,
            asked: false,
        };
        assert_eq!(
            short.to_string(),
            "peer sent 10 encoded (not asked) bytes for a 4096-byte slice"
        );
    }

    /// A peer's refusal keeps the peer's own text under a typed reason.
    #[test]
    fn refusals_read_as_the_peers_message() {
        let e = TransferError::Refused {
            peer: "p".into(),
            reason: RefusalReason::BadRequest {
                message: "bad rdma endpoint: 3 bytes".into(),
            },
        };
        assert_eq!(
            e.to_string(),
            "peer p refused the op: bad rdma endpoint: 3 bytes"
        );
        let e = TransferError::Forbidden {
            peer: "uid 7".into(),
            reason: ForbiddenReason::ShmOtherUser,
        };
        assert_eq!(
            e.to_string(),
            "peer uid 7 forbade the op: shm is served to this user's processes only"
        );
    }

    /// A region the vocabulary refuses stays InvalidArgument, holding the
    /// vocabulary's own error, and reads as before (one "invalid argument").
    #[test]
    fn vocabulary_errors_keep_their_type_and_message() {
        let e = TransferError::from(kvfabric_types::TypesError::InvalidArgument(
            "region length is zero".into(),
        ));
        assert!(matches!(
            &e,
            TransferError::InvalidArgument(BadInput::Vocabulary(
                kvfabric_types::TypesError::InvalidArgument(_)
            ))
        ));
        assert_eq!(e.to_string(), "invalid argument: region length is zero");
    }
}
