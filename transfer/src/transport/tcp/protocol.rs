//! The tcp wire protocol: after the hello (`crate::hello`), fixed-size
//! little-endian request and response headers, each followed by its payload
//! (a slice of a segment), so payloads can be read straight into and written
//! straight from registered memory. Pure encoding and decoding: no I/O here.
//!
//! The same connection carries the rdma control plane: a queue-pair exchange
//! ([`RequestKind::RdmaConnect`], payload an [`RdmaEndpoint`]) and per-op range
//! checks that answer with the segment's [`RdmaKey`] ([`RequestKind::RdmaRange`]).

use serde::{Deserialize, Serialize};

use crate::error::BadInput;
use crate::segment::RdmaKey;
use crate::TransferError;

/// Size of an encoded [`Request`].
pub const REQUEST_BYTES: usize = 56;
/// Size of an encoded [`Response`] header.
pub const RESPONSE_BYTES: usize = 24;
/// Size of an encoded [`RdmaEndpoint`].
pub const RDMA_ENDPOINT_BYTES: usize = 24;
/// Size of an encoded [`RdmaKey`].
pub const RDMA_KEY_BYTES: usize = 16;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// Send `slice_len` bytes of the segment back.
    Read = 1,
    /// Store the `slice_len` payload bytes that follow into the segment.
    Write = 2,
    /// Deliver the `slice_len` payload bytes that follow as a notification.
    Notify = 3,
    /// rdma: the payload is the initiator's [`RdmaEndpoint`]; the server
    /// creates a queue pair connected to it (alive as long as this
    /// connection) and answers with its own endpoint as the response payload.
    RdmaConnect = 4,
    /// rdma: check the op range `segment[op_offset..+op_len]` and answer with
    /// the segment's [`RdmaKey`] as payload, and with the range's checksum in
    /// the response when `FLAG_CHECKSUM` is set. `Unsupported` when the
    /// segment has no NIC registration.
    RdmaRange = 5,
}

/// Request flag: the payload carries an xxh3 checksum.
pub const FLAG_CHECKSUM: u8 = 1;
/// Request flag (READ): a [`crate::security::Capability`] of
/// `CAPABILITY_BYTES` follows the header.
pub const FLAG_CAPABILITY: u8 = 2;
/// Request flag (READ): send the slice encoded with the block codec
/// (elements of [`Request::width`] bytes) when that saves bytes. Sent only
/// to peers whose hello announces it (`Hello::wire_codec`); the response's
/// [`Response::encoded`] says what came.
pub const FLAG_ENCODE: u8 = 4;

/// One slice of an op. The whole op range travels with every slice, so the
/// server refuses an op whose tail is out of bounds before its first slice lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub kind: RequestKind,
    pub flags: u8,
    /// Element width of the data (with [`FLAG_ENCODE`]), else 0.
    pub width: u8,
    pub segment: u64,
    pub op_offset: u64,
    pub op_len: u64,
    pub slice_offset: u64,
    pub slice_len: u64,
    pub checksum: u64,
}

impl Request {
    pub fn encode(&self) -> [u8; REQUEST_BYTES] {
        let mut b = [0u8; REQUEST_BYTES];
        b[0] = self.kind as u8;
        b[1] = self.flags;
        b[2] = self.width;
        for (i, v) in [
            self.segment,
            self.op_offset,
            self.op_len,
            self.slice_offset,
            self.slice_len,
            self.checksum,
        ]
        .iter()
        .enumerate()
        {
            b[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    pub fn decode(b: &[u8; REQUEST_BYTES]) -> Result<Self, TransferError> {
        let kind = match b[0] {
            1 => RequestKind::Read,
            2 => RequestKind::Write,
            3 => RequestKind::Notify,
            4 => RequestKind::RdmaConnect,
            5 => RequestKind::RdmaRange,
            k => {
                return Err(TransferError::InvalidArgument(
                    BadInput::UnknownRequestKind { kind: k },
                ))
            }
        };
        let w = |i: usize| u64_at(b, 8 + 8 * i);
        Ok(Request {
            kind,
            flags: b[1],
            width: b[2],
            segment: w(0),
            op_offset: w(1),
            op_len: w(2),
            slice_offset: w(3),
            slice_len: w(4),
            checksum: w(5),
        })
    }
}

impl Request {
    /// A request that names no segment and carries `len` payload bytes (a
    /// notification, an rdma endpoint).
    pub fn control(kind: RequestKind, len: u64) -> Self {
        Request {
            kind,
            flags: 0,
            width: 0,
            segment: 0,
            op_offset: 0,
            op_len: len,
            slice_offset: 0,
            slice_len: len,
            checksum: 0,
        }
    }

    /// Whether this slice ends its op (a checked request: the ranges add up).
    pub fn ends_op(&self) -> bool {
        self.slice_offset + self.slice_len == self.op_offset + self.op_len
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Outcome of a request, as the server reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    UnknownSegment = 1,
    OutOfBounds = 2,
    Checksum = 3,
    BadRequest = 4,
    /// The server cannot serve this over rdma (no device, no NIC registration).
    Unsupported = 5,
    /// The op is not allowed to this peer (capability, write grant).
    Forbidden = 6,
}

/// Response encoding byte of a payload sent encoded (the codec's id).
pub const ENCODING_PLANES: u8 = kvfabric_codec::CODEC_PLANES;

/// Response header; an error status is followed by `message_len` bytes of
/// UTF-8 reason, a successful READ by `payload_len` bytes of data (encoded
/// with the block codec when `encoded`: a self-describing codec block that
/// decodes to the slice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    pub status: Status,
    /// The payload is a codec block ([`ENCODING_PLANES`] on the wire), not
    /// the slice's raw bytes.
    pub encoded: bool,
    pub message_len: u32,
    pub checksum: u64,
    pub payload_len: u64,
}

impl Response {
    /// A successful answer: `payload_len` bytes follow; `checksum` is the
    /// payload's checksum (or the aux word).
    pub fn ok(checksum: u64, payload_len: u64) -> Self {
        Response {
            status: Status::Ok,
            encoded: false,
            message_len: 0,
            checksum,
            payload_len,
        }
    }

    pub fn encode(&self) -> [u8; RESPONSE_BYTES] {
        let mut b = [0u8; RESPONSE_BYTES];
        b[0] = self.status as u8;
        b[1] = if self.encoded { ENCODING_PLANES } else { 0 };
        b[4..8].copy_from_slice(&self.message_len.to_le_bytes());
        b[8..16].copy_from_slice(&self.checksum.to_le_bytes());
        b[16..24].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; RESPONSE_BYTES]) -> Result<Self, TransferError> {
        let status = match b[0] {
            0 => Status::Ok,
            1 => Status::UnknownSegment,
            2 => Status::OutOfBounds,
            3 => Status::Checksum,
            4 => Status::BadRequest,
            5 => Status::Unsupported,
            6 => Status::Forbidden,
            s => {
                return Err(TransferError::InvalidArgument(BadInput::UnknownStatus {
                    status: s,
                }))
            }
        };
        let encoded = match b[1] {
            0 => false,
            ENCODING_PLANES => true,
            e => {
                return Err(TransferError::InvalidArgument(BadInput::UnknownEncoding {
                    encoding: e,
                }))
            }
        };
        Ok(Response {
            status,
            encoded,
            message_len: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            checksum: u64_at(b, 8),
            payload_len: u64_at(b, 16),
        })
    }
}

/// The address of one end of an rdma RC connection, exchanged over tcp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaEndpoint {
    pub qp_num: u32,
    pub lid: u16,
    pub gid: [u8; 16],
}

impl RdmaEndpoint {
    pub fn encode(&self) -> [u8; RDMA_ENDPOINT_BYTES] {
        let mut b = [0u8; RDMA_ENDPOINT_BYTES];
        b[0..4].copy_from_slice(&self.qp_num.to_le_bytes());
        b[4..6].copy_from_slice(&self.lid.to_le_bytes());
        b[8..24].copy_from_slice(&self.gid);
        b
    }

    /// Decode; refuses a wrong length, set reserved bytes, or a queue pair
    /// number that is not a 24-bit nonzero value.
    pub fn decode(b: &[u8]) -> Result<Self, TransferError> {
        let bad = TransferError::InvalidArgument;
        if b.len() != RDMA_ENDPOINT_BYTES {
            return Err(bad(BadInput::RdmaEndpointLen {
                len: b.len() as u64,
            }));
        }
        if b[6] != 0 || b[7] != 0 {
            return Err(bad(BadInput::RdmaEndpointReserved));
        }
        let qp_num = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if qp_num == 0 || qp_num > 0x00ff_ffff {
            return Err(bad(BadInput::RdmaQueuePair { qp_num }));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..24]);
        Ok(RdmaEndpoint {
            qp_num,
            lid: u16::from_le_bytes([b[4], b[5]]),
            gid,
        })
    }
}

/// The wire form of a segment's rdma key (answered to an `RdmaRange`).
impl RdmaKey {
    /// Encode (address, rkey, 4 reserved zero bytes).
    pub fn encode(&self) -> [u8; RDMA_KEY_BYTES] {
        let mut b = [0u8; RDMA_KEY_BYTES];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// Decode; refuses a wrong length or set reserved bytes.
    pub fn decode(b: &[u8]) -> Result<Self, TransferError> {
        if b.len() != RDMA_KEY_BYTES || b[12..].iter().any(|&x| x != 0) {
            return Err(TransferError::InvalidArgument(BadInput::RdmaKey {
                len: b.len(),
            }));
        }
        Ok(RdmaKey {
            addr: u64_at(b, 0),
            rkey: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_garbage_is_refused() {
        let r = Request {
            kind: RequestKind::Read,
            flags: FLAG_CHECKSUM | FLAG_ENCODE,
            width: 2,
            segment: 3,
            op_offset: 4,
            op_len: 5,
            slice_offset: 6,
            slice_len: 7,
            checksum: 8,
        };
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        assert!(Request::decode(&[9u8; REQUEST_BYTES]).is_err());
        let s = Response {
            status: Status::Checksum,
            encoded: false,
            message_len: 9,
            checksum: 10,
            payload_len: 11,
        };
        assert_eq!(Response::decode(&s.encode()).unwrap(), s);
        let enc = Response {
            encoded: true,
            ..Response::ok(12, 13)
        };
        let b = enc.encode();
        assert_eq!(b[1], ENCODING_PLANES);
        assert_eq!(Response::decode(&b).unwrap(), enc);
        let mut unknown = b;
        unknown[1] = 77;
        assert_eq!(
            Response::decode(&unknown),
            Err(TransferError::InvalidArgument(BadInput::UnknownEncoding {
                encoding: 77
            }))
        );
    }

    #[test]
    fn rdma_messages_round_trip_and_malformed_are_refused() {
        let ep = RdmaEndpoint {
            qp_num: 0x12_3456,
            lid: 7,
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
        };
        let b = ep.encode();
        assert_eq!(RdmaEndpoint::decode(&b).unwrap(), ep);
        assert!(RdmaEndpoint::decode(&b[..23]).is_err(), "short");
        assert!(
            RdmaEndpoint::decode(&[b.as_slice(), &[0]].concat()).is_err(),
            "long"
        );
        let mut reserved = b;
        reserved[6] = 1;
        assert!(RdmaEndpoint::decode(&reserved).is_err(), "reserved bytes");
        let mut big_qpn = b;
        big_qpn[3] = 1;
        assert!(
            RdmaEndpoint::decode(&big_qpn).is_err(),
            "qp number over 24 bits"
        );
        assert!(
            RdmaEndpoint::decode(&[0u8; RDMA_ENDPOINT_BYTES]).is_err(),
            "qp 0"
        );

        let key = RdmaKey {
            addr: 0x7f00_dead_b000,
            rkey: 0xabcd_ef01,
        };
        let kb = key.encode();
        assert_eq!(RdmaKey::decode(&kb).unwrap(), key);
        assert!(RdmaKey::decode(&kb[..15]).is_err());
        let mut bad = kb;
        bad[15] = 9;
        assert!(RdmaKey::decode(&bad).is_err());

        for kind in [RequestKind::RdmaConnect, RequestKind::RdmaRange] {
            let r = Request {
                kind,
                flags: FLAG_CHECKSUM,
                width: 0,
                segment: 1,
                op_offset: 2,
                op_len: 3,
                slice_offset: 2,
                slice_len: 3,
                checksum: 0,
            };
            assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        }
        let s = Response {
            status: Status::Unsupported,
            encoded: false,
            message_len: 3,
            checksum: 0,
            payload_len: 0,
        };
        assert_eq!(Response::decode(&s.encode()).unwrap(), s);
        let mut unknown = s.encode();
        unknown[0] = 7;
        assert!(Response::decode(&unknown).is_err());
    }
}
