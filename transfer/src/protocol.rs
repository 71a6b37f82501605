//! The tcp wire protocol: a hello exchanged once per connection, then
//! fixed-size little-endian request and response headers, each followed by
//! its payload (a slice of a segment), so payloads can be read straight into
//! and written straight from registered memory.

use crate::TransferError;

/// "KVFT".
pub const MAGIC: u32 = 0x5446_564b;
/// Protocol version; a peer with another version is refused at hello.
pub const VERSION: u16 = 1;
/// Largest notification payload accepted.
pub const MAX_NOTIFY_BYTES: u64 = 1 << 20;

const BOOT_ID_BYTES: usize = 48;
const SOCKET_BYTES: usize = 64;
/// Size of an encoded [`Hello`].
pub const HELLO_BYTES: usize = 12 + BOOT_ID_BYTES + SOCKET_BYTES;
/// Size of an encoded [`Request`].
pub const REQUEST_BYTES: usize = 56;
/// Size of an encoded [`Response`] header.
pub const RESPONSE_BYTES: usize = 24;

/// Identity exchanged when a connection opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub pid: u32,
    pub boot_id: String,
    pub shm_socket: String,
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        put_str(&mut b[12..12 + BOOT_ID_BYTES], &self.boot_id);
        put_str(&mut b[12 + BOOT_ID_BYTES..], &self.shm_socket);
        b
    }

    pub fn decode(b: &[u8; HELLO_BYTES]) -> Result<Self, TransferError> {
        let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let version = u16::from_le_bytes([b[4], b[5]]);
        if magic != MAGIC || version != VERSION {
            return Err(TransferError::InvalidArgument(format!(
                "not a kvfabric transfer peer (magic {magic:#x}, version {version})"
            )));
        }
        Ok(Hello {
            pid: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            boot_id: get_str(&b[12..12 + BOOT_ID_BYTES]),
            shm_socket: get_str(&b[12 + BOOT_ID_BYTES..]),
        })
    }
}

fn put_str(dst: &mut [u8], s: &str) {
    let n = s.len().min(dst.len());
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn get_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// Send `slice_len` bytes of the segment back.
    Read = 1,
    /// Store the `slice_len` payload bytes that follow into the segment.
    Write = 2,
    /// Deliver the `slice_len` payload bytes that follow as a notification.
    Notify = 3,
}

/// Request flag: the payload carries an xxh3 checksum.
pub const FLAG_CHECKSUM: u8 = 1;

/// One slice of an op. The whole op range travels with every slice, so the
/// server refuses an op whose tail is out of bounds before its first slice lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub kind: RequestKind,
    pub flags: u8,
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
            k => {
                return Err(TransferError::InvalidArgument(format!(
                    "unknown request kind {k}"
                )))
            }
        };
        let w = |i: usize| u64_at(b, 8 + 8 * i);
        Ok(Request {
            kind,
            flags: b[1],
            segment: w(0),
            op_offset: w(1),
            op_len: w(2),
            slice_offset: w(3),
            slice_len: w(4),
            checksum: w(5),
        })
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
}

/// Response header; an error status is followed by `message_len` bytes of
/// UTF-8 reason, a successful READ by `payload_len` bytes of data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    pub status: Status,
    pub message_len: u32,
    pub checksum: u64,
    pub payload_len: u64,
}

impl Response {
    pub fn encode(&self) -> [u8; RESPONSE_BYTES] {
        let mut b = [0u8; RESPONSE_BYTES];
        b[0] = self.status as u8;
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
            s => {
                return Err(TransferError::InvalidArgument(format!(
                    "unknown response status {s}"
                )))
            }
        };
        Ok(Response {
            status,
            message_len: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            checksum: u64_at(b, 8),
            payload_len: u64_at(b, 16),
        })
    }
}

pub use crate::checksum::checksum;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_garbage_is_refused() {
        let h = Hello {
            pid: 42,
            boot_id: "abc".into(),
            shm_socket: "kvfabric-1".into(),
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        assert!(Hello::decode(&[7u8; HELLO_BYTES]).is_err());
        let r = Request {
            kind: RequestKind::Write,
            flags: FLAG_CHECKSUM,
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
            message_len: 9,
            checksum: 10,
            payload_len: 11,
        };
        assert_eq!(Response::decode(&s.encode()).unwrap(), s);
    }
}
