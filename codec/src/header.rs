//! The encoded block's header: what a reader needs before touching the body.
//!
//! ```text
//! offset  size  field
//!      0     1  codec id (1 = byte planes)
//!      1     1  format version (1: compact; 2: fast, may hold window planes)
//!      2     1  element width in bytes (2 for f16/bf16, 4 for f32)
//!      3     1  reserved, 0
//!      4     8  decoded length, bytes (little-endian)
//!     12     8  encoded length, bytes, this header included (little-endian)
//!     20     4  segment: elements per segment (little-endian, > 0)
//! ```
//!
//! The encoded length lets a block sit in a larger, padded extent (the disk
//! tier's 4 KiB units); the decoded length is checked against what the
//! caller expects before any buffer is sized from it.

use crate::CodecError;

/// Bytes of the header.
pub const HEADER_LEN: usize = 24;
/// Codec id of the byte-plane codec.
pub const CODEC_PLANES: u8 = 1;
/// Version of the byte-plane format the compact profile writes.
pub const VERSION: u8 = 1;
/// Version the fast profile writes: version 1's plane modes, plus the
/// window code for the high plane of 2-byte elements. Readers that know
/// only version 1 refuse it as an unknown format, not as corrupt planes.
pub const VERSION_FAST: u8 = 2;

/// A parsed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// [`VERSION`] or [`VERSION_FAST`].
    pub version: u8,
    pub width: usize,
    pub decoded_len: u64,
    pub encoded_len: u64,
    pub segment: u32,
}

impl Header {
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[CODEC_PLANES, self.version, self.width as u8, 0]);
        out.extend_from_slice(&self.decoded_len.to_le_bytes());
        out.extend_from_slice(&self.encoded_len.to_le_bytes());
        out.extend_from_slice(&self.segment.to_le_bytes());
    }

    /// Parse and check the header at the start of `enc`.
    pub fn parse(enc: &[u8]) -> Result<Header, CodecError> {
        let b = enc.get(..HEADER_LEN).ok_or(CodecError::Truncated {
            what: "header",
            len: enc.len(),
            need: HEADER_LEN,
        })?;
        if b[0] != CODEC_PLANES || !(VERSION..=VERSION_FAST).contains(&b[1]) || b[3] != 0 {
            return Err(CodecError::UnknownFormat {
                id: b[0],
                version: b[1],
            });
        }
        let width = b[2] as usize;
        if !(1..=8).contains(&width) {
            return Err(CodecError::BadWidth { width });
        }
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let h = Header {
            version: b[1],
            width,
            decoded_len: u64_at(4),
            encoded_len: u64_at(12),
            segment: u32::from_le_bytes([b[20], b[21], b[22], b[23]]),
        };
        if h.segment == 0 {
            return Err(CodecError::Corrupt {
                plane: 0,
                what: "segment length 0",
            });
        }
        if h.encoded_len < HEADER_LEN as u64 || h.encoded_len > enc.len() as u64 {
            return Err(CodecError::Truncated {
                what: "body",
                len: enc.len(),
                need: h.encoded_len.max(HEADER_LEN as u64) as usize,
            });
        }
        Ok(h)
    }
}
