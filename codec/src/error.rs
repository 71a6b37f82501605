//! The codec's one error type: what was wrong with an encoded block.

use thiserror::Error;

/// Why a block could not be encoded or decoded. Decoding never panics on
/// bad input: every malformed, truncated or corrupt block is one of these.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("encoded block is {len} bytes, shorter than its {need}-byte {what}")]
    Truncated {
        what: &'static str,
        len: usize,
        need: usize,
    },
    #[error("not a kvfabric-codec block (codec id {id}, version {version})")]
    UnknownFormat { id: u8, version: u8 },
    #[error("element width {width} is not supported (1..=8)")]
    BadWidth { width: usize },
    #[error("block decodes to {len} bytes; {limit} expected")]
    WrongLength { len: u64, limit: u64 },
    #[error("corrupt {what} in plane {plane}")]
    Corrupt { plane: usize, what: &'static str },
}
