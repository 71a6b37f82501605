//! The store crate's one error type. The node crate maps it to gRPC status
//! codes at its edge.

use kvfabric_transfer::TransferError;
use kvfabric_types::TypesError;

use crate::keys::BlockKey;

/// Everything that can go wrong in a node's store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Bad input from a client (maps to gRPC INVALID_ARGUMENT).
    #[error("invalid argument: {0}")]
    InvalidArgument(BadArgument),
    /// No room: everything that could make room is pinned or being read (RESOURCE_EXHAUSTED).
    #[error("resource exhausted: {0}")]
    ResourceExhausted(NoRoom),
    /// The reservation for `key` was reclaimed (timed out) or revoked before commit.
    #[error("reservation expired: {key:?} was reclaimed or revoked before commit")]
    ReservationExpired {
        /// The key the reservation was for.
        key: BlockKey,
    },
    /// `key` is not stored (NOT_FOUND).
    #[error("not found: block {key:?}")]
    NotFound {
        /// The key asked for.
        key: BlockKey,
    },
    /// A configuration that cannot work.
    #[error("bad configuration: {0}")]
    Config(BadConfig),
    /// A disk or OS call failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The disk index (RocksDB) failed.
    #[error("index error: {0}")]
    Index(#[from] rocksdb::Error),
    /// The RAM arena could not be set up.
    #[error("transfer region: {0}")]
    Region(#[from] TransferError),
}

/// What was wrong with a client's input ([`StoreError::InvalidArgument`]):
/// the values a caller can act on, with the message the `String` it replaced
/// gave.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadArgument {
    /// A block of `len` bytes, outside `1..=max` (`max_block_size`).
    #[error("block size {len} is outside 1..={max} (max_block_size)")]
    BlockSize { len: u64, max: u64 },
    /// A durable put on a node without a disk tier.
    #[error("durable put needs a disk tier; this node has none")]
    DurableWithoutDisk,
    /// A write of `len` bytes at `offset` past the `reserved` size.
    #[error("write of {len} bytes at {offset} exceeds the reserved size {reserved}")]
    WriteBeyondReservation {
        len: u64,
        offset: u64,
        reserved: u64,
    },
    /// A VRAM reservation written out of order (it hashes as it stages).
    #[error("VRAM write at {offset} is out of order: the next byte to write is {expected}")]
    OutOfOrderWrite { offset: u64, expected: u64 },
    /// A VRAM reservation committed before all `len` bytes were written.
    #[error("commit after {written} of {len} bytes: the block is not fully written")]
    ShortWrite { written: u64, len: u64 },
    /// A durable put into VRAM (which does not outlive the process).
    #[error("a durable put cannot go to the VRAM tier; put it to the store (RAM and disk)")]
    DurableVram,
    /// The client's checksum (`want`) is not the data's (`got`).
    #[error("checksum mismatch: client said {want:#018x}, data hashes to {got:#018x}")]
    ChecksumMismatch { want: u64, got: u64 },
    /// A byte range `offset+len` outside a block of `block_len` bytes
    /// (`len` 0 in a request means "to the end").
    #[error("range {offset}+{len} is outside the {block_len}-byte block")]
    RangeOutsideBlock {
        offset: u64,
        len: u64,
        block_len: u64,
    },
    /// [`BadArgument::RangeOutsideBlock`] of a leased block, named by `key`.
    #[error("range {offset}+{len} is outside the {block_len}-byte block {key:?}")]
    RangeOutsideLeased {
        offset: u64,
        len: u64,
        block_len: u64,
        key: BlockKey,
    },
    /// A range the lease checked no longer fits the stored block.
    #[error("range {offset}+{len} is outside the stored block")]
    RangeOutsideStored { offset: u64, len: u64 },
    /// `len` bytes for a read target of `capacity` bytes at `offset` of a
    /// `region_len`-byte region.
    #[error(
        "{len} bytes do not fit the read target ({capacity} bytes at {offset} of a {region_len}-byte region)"
    )]
    ReadTarget {
        len: u64,
        capacity: u64,
        offset: u64,
        region_len: u64,
    },
    /// A disk extent at `offset`, `len` bytes, not `align`-aligned.
    #[error("disk extent Extent {{ offset: {offset}, len: {len} }} is not {align}-aligned")]
    UnalignedExtent { offset: u64, len: u64, align: u64 },
    /// `len` bytes for a disk extent of `extent_len` bytes.
    #[error("{len} bytes do not fit the {extent_len}-byte disk extent")]
    ExtentOverflow { len: u64, extent_len: u64 },
    /// A key or layout the shared vocabulary refused (its error, which
    /// reads as its message).
    #[error("{}", kvfabric_transfer::vocabulary_message(.0))]
    Vocabulary(TypesError),
}

impl BadArgument {
    /// A put of `len` bytes: refused unless in `1..=max` (`max_block_size`).
    /// Every tier's `reserve` asks this.
    pub(crate) fn check_block_size(len: u64, max: u64) -> Result<(), StoreError> {
        if len == 0 || len > max {
            return Err(StoreError::InvalidArgument(BadArgument::BlockSize {
                len,
                max,
            }));
        }
        Ok(())
    }

    /// A write of `len` bytes at `offset` into a `reserved`-byte
    /// reservation: refused if it runs past the end. Every tier's
    /// reservation asks this.
    pub(crate) fn check_write(offset: u64, len: u64, reserved: u64) -> Result<(), StoreError> {
        if offset.checked_add(len).is_none_or(|e| e > reserved) {
            return Err(StoreError::InvalidArgument(
                BadArgument::WriteBeyondReservation {
                    len,
                    offset,
                    reserved,
                },
            ));
        }
        Ok(())
    }
}

/// Which tier or region had no room ([`StoreError::ResourceExhausted`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoRoom {
    /// A block of `len` bytes cannot fit the RAM tier at all.
    #[error("block of {len} bytes is larger than the RAM tier")]
    LargerThanRam { len: u64 },
    /// Every RAM block is pinned, leased or reserved: nothing to evict.
    #[error("RAM tier full: every block is pinned, leased or reserved")]
    RamPinned,
    /// A block of `len` bytes cannot fit the VRAM tier at all.
    #[error("block of {len} bytes is larger than the VRAM tier")]
    LargerThanVram { len: u64 },
    /// Every VRAM block is leased or reserved: nothing to evict.
    #[error("VRAM tier full: every block is leased or reserved")]
    VramPinned,
    /// A durable put found no room on disk.
    #[error("disk tier full: durable put not acknowledged")]
    DiskFull,
    /// No free `len`-byte range in the `capacity`-byte staging region.
    #[error("no {len}-byte range free in the {capacity}-byte staging region")]
    Staging { len: u64, capacity: u64 },
}

/// A setting that cannot work ([`StoreError::Config`]): which key, and the
/// value or limit it broke.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BadConfig {
    /// `key` is empty.
    #[error("{key} is empty")]
    Empty { key: &'static str },
    /// `key` is zero.
    #[error("{key} is zero")]
    Zero { key: &'static str },
    /// `key` is below one 4 KiB page.
    #[error("{key} is below one page")]
    BelowOnePage { key: &'static str },
    /// The capacity `key` is `value`, below one 4 KiB page.
    #[error("{key} {value} is below one page")]
    CapacityBelowPage { key: &'static str, value: String },
    /// `key` is `got`, outside what it `must` be (e.g. `in (0, 50]`).
    #[error("{key} must be {must}, got {got}")]
    OutOfRange {
        key: &'static str,
        must: &'static str,
        got: f64,
    },
    /// The watermarks are not `0 < low <= high <= 1`.
    #[error("watermarks must satisfy 0 < low ({low}) <= high ({high}) <= 1")]
    Watermarks { low: f64, high: f64 },
    /// The disk tier cannot hold one block of the largest size.
    #[error("disk_capacity {disk_capacity} is smaller than max_block_size {max_block_size}")]
    DiskBelowBlock {
        disk_capacity: String,
        max_block_size: String,
    },
    /// A VRAM tier asked of a build without the `cuda` feature.
    #[error(
        "vram_capacity is set but this build has no `cuda` feature (cargo build --features cuda)"
    )]
    NoCudaBuild,
}

impl From<TypesError> for StoreError {
    /// A bad key or layout is the client's (INVALID_ARGUMENT); a region that
    /// could not be made is the arena's, as when the transfer crate made it.
    fn from(e: TypesError) -> Self {
        match e {
            e @ TypesError::InvalidArgument(_) => {
                StoreError::InvalidArgument(BadArgument::Vocabulary(e))
            }
            other => StoreError::Region(other.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed InvalidArgument / ResourceExhausted / Config fields read as
    /// the strings they replaced, and keep their gRPC codes.
    #[test]
    fn typed_fields_keep_messages_and_codes() {
        let e = StoreError::InvalidArgument(BadArgument::BlockSize { len: 0, max: 4096 });
        assert_eq!(
            e.to_string(),
            "invalid argument: block size 0 is outside 1..=4096 (max_block_size)"
        );
        let e = StoreError::InvalidArgument(BadArgument::UnalignedExtent {
            offset: 100,
            len: 8192,
            align: 4096,
        });
        assert_eq!(
            e.to_string(),
            "invalid argument: disk extent Extent { offset: 100, len: 8192 } is not 4096-aligned"
        );
        let e = StoreError::InvalidArgument(BadArgument::ChecksumMismatch { want: 1, got: 2 });
        assert_eq!(
            e.to_string(),
            "invalid argument: checksum mismatch: client said 0x0000000000000001, data hashes to 0x0000000000000002"
        );
        let e = StoreError::ResourceExhausted(NoRoom::Staging {
            len: 8192,
            capacity: 4096,
        });
        assert_eq!(
            e.to_string(),
            "resource exhausted: no 8192-byte range free in the 4096-byte staging region"
        );
        let e = StoreError::Config(BadConfig::OutOfRange {
            key: "lirs_hir_percent",
            must: "in (0, 50]",
            got: 60.0,
        });
        assert_eq!(
            e.to_string(),
            "bad configuration: lirs_hir_percent must be in (0, 50], got 60"
        );
        let e = StoreError::Config(BadConfig::BelowOnePage {
            key: "staging_capacity",
        });
        assert_eq!(
            e.to_string(),
            "bad configuration: staging_capacity is below one page"
        );
    }

    /// A validation failure names its key and value as fields, not only in text.
    #[test]
    fn config_validation_names_the_key() {
        let cfg = crate::NodeConfig {
            planner_sample_rate: 2.0,
            ..crate::NodeConfig::default()
        };
        match cfg.validate() {
            Err(StoreError::Config(BadConfig::OutOfRange { key, got, .. })) => {
                assert_eq!((key, got), ("planner_sample_rate", 2.0));
            }
            other => panic!("expected OutOfRange, got {other:?}"),
        }
    }

    /// A layout the vocabulary refuses holds its typed error, reads as its
    /// message (once "invalid argument") and stays INVALID_ARGUMENT.
    #[test]
    fn vocabulary_error_is_typed() {
        let e = StoreError::from(TypesError::InvalidArgument("unknown layout dtype 9".into()));
        assert!(matches!(
            &e,
            StoreError::InvalidArgument(BadArgument::Vocabulary(TypesError::InvalidArgument(_)))
        ));
        assert_eq!(e.to_string(), "invalid argument: unknown layout dtype 9");
    }
}
