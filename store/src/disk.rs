//! `DiskTier`: block bytes in a preallocated file (or raw block device) read
//! and written with O_DIRECT through io_uring, and the key -> extent index in
//! RocksDB so the tier survives restarts.
//!
//! Ordering rule (crash safety): a block's data is written (and, for durable
//! puts, fdatasync'ed) before its index entry is written; the index entry of a
//! durable put goes through a synced WAL. So after a kill -9 every indexed
//! extent holds the bytes its checksum describes, and a stale or torn extent
//! can only show up as a checksum mismatch (a miss), never as wrong bytes.
//! Space accounting (which extents are free) belongs to the store; this type
//! only moves bytes and index records. A record also names the block's
//! owner in the tiers' shares, so a restarted node counts its
//! recovered blocks to the tenants that stored them. Every I/O goes through a staging
//! buffer (see `staging` for why), so callers pass any memory.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use rocksdb::{IteratorMode, Options, WriteOptions, DB};

use crate::disk_codec::DiskCodec;
use crate::disk_staging::StagingPool;
use crate::extent::Extent;
use crate::keys::{BlockKey, KvLayout, KEY_LEN};
use crate::uring::IoRing;
use crate::{BadArgument, StoreError};

pub use crate::extent::DISK_ALIGN;

const BLOCK_PREFIX: u8 = b'b';
/// An index record: extent, length, checksum, tokens, layout, codec; then,
/// for an owned block, the owner's name (one length byte, then UTF-8).
const RECORD_LEN: usize = OLD_RECORD_LEN + 1;
/// Records written before the codec byte existed (raw blocks).
const OLD_RECORD_LEN: usize = 8 * 4 + 4 + 22;
/// Longest owner name a record holds (tenant names are at most 64 bytes,
/// `shared:` + a name 71); a longer one is not recorded (the block is
/// recovered unowned).
pub(crate) const MAX_OWNER_LEN: usize = u8::MAX as usize;

/// What the index remembers about one block on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskRecord {
    pub extent: Extent,
    pub len: u64,
    pub checksum: u64,
    pub tokens: u32,
    pub layout: KvLayout,
    /// How the bytes sit in the extent; `len` and `checksum` are the
    /// decoded block's.
    pub codec: DiskCodec,
    /// Who the block counts to in the tiers' shares; None: nobody (records
    /// written before owners were recorded, or unowned blocks).
    pub owner: Option<Arc<str>>,
}

impl DiskRecord {
    fn encode(&self) -> Vec<u8> {
        let owner = self
            .owner
            .as_deref()
            .filter(|o| !o.is_empty() && o.len() <= MAX_OWNER_LEN)
            .map(str::as_bytes);
        let mut b = vec![0u8; RECORD_LEN + owner.map_or(0, |o| 1 + o.len())];
        b[0..8].copy_from_slice(&self.extent.offset.to_le_bytes());
        b[8..16].copy_from_slice(&self.extent.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..32].copy_from_slice(&self.checksum.to_le_bytes());
        b[32..36].copy_from_slice(&self.tokens.to_le_bytes());
        b[36..58].copy_from_slice(&self.layout.to_key_bytes());
        b[58] = self.codec.code();
        if let Some(o) = owner {
            b[RECORD_LEN] = o.len() as u8;
            b[RECORD_LEN + 1..].copy_from_slice(o);
        }
        b
    }

    fn decode(b: &[u8]) -> Option<Self> {
        let (codec, owner) = match b.len() {
            OLD_RECORD_LEN => (DiskCodec::Raw, None),
            RECORD_LEN => (DiskCodec::from_code(b[58])?, None),
            n if n > RECORD_LEN + 1 && n == RECORD_LEN + 1 + b[RECORD_LEN] as usize => {
                let name = std::str::from_utf8(&b[RECORD_LEN + 1..]).ok()?;
                (DiskCodec::from_code(b[58])?, Some(Arc::from(name)))
            }
            _ => return None,
        };
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let layout_bytes: [u8; 22] = b[36..58].try_into().ok()?;
        Some(DiskRecord {
            extent: Extent {
                offset: u64_at(0),
                len: u64_at(8),
            },
            len: u64_at(16),
            checksum: u64_at(24),
            tokens: u32::from_le_bytes(b[32..36].try_into().ok()?),
            layout: KvLayout::from_key_bytes(&layout_bytes)?,
            codec,
            owner,
        })
    }
}

fn index_key(key: &BlockKey) -> [u8; KEY_LEN + 1] {
    let mut k = [0u8; KEY_LEN + 1];
    k[0] = BLOCK_PREFIX;
    k[1..].copy_from_slice(key.as_bytes());
    k
}

/// The disk tier's file, ring and index.
pub struct DiskTier {
    // Field order matters: the ring thread must stop before the file closes.
    ring: IoRing,
    staging: StagingPool,
    /// Keeps the data file's fd open for the ring.
    _file: File,
    db: DB,
    capacity: u64,
}

impl DiskTier {
    /// Open (creating and preallocating if needed) the data file and the index;
    /// returns the tier and every record the index holds.
    pub fn open(
        path: &Path,
        index_path: &Path,
        capacity: u64,
    ) -> Result<(Self, Vec<(BlockKey, DiskRecord)>), StoreError> {
        let file = open_direct(path)?;
        let meta = file.metadata()?;
        let capacity = if meta.file_type().is_block_device() {
            let dev_len = device_len(&file)?;
            capacity.min(dev_len)
        } else {
            if meta.len() < capacity {
                preallocate(&file, capacity)?;
            }
            capacity
        } / DISK_ALIGN
            * DISK_ALIGN;
        let mut opts = Options::default();
        opts.create_if_missing(true);
        let db = DB::open(&opts, index_path)?;
        let mut records = Vec::new();
        let mut bad = Vec::new();
        for item in db.iterator(IteratorMode::Start) {
            let (k, v) = item?;
            if k.first() != Some(&BLOCK_PREFIX) {
                continue;
            }
            let parsed = BlockKey::from_slice(&k[1..])
                .ok()
                .zip(DiskRecord::decode(&v));
            match parsed {
                Some((key, rec)) if rec.extent.offset + rec.extent.len <= capacity => {
                    records.push((key, rec))
                }
                _ => bad.push(k.to_vec()),
            }
        }
        for k in bad {
            tracing::warn!("dropping unreadable disk index entry");
            db.delete(k)?;
        }
        let ring = IoRing::new(file.as_raw_fd());
        Ok((
            DiskTier {
                ring,
                staging: StagingPool::default(),
                _file: file,
                db,
                capacity,
            },
            records,
        ))
    }

    /// Usable bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Write `data` (at most `extent.len` bytes; the rest of the extent is
    /// zeroed) into `extent`, through a staging buffer.
    pub fn write(&self, extent: Extent, data: &[u8]) -> Result<(), StoreError> {
        check_extent(extent, data.len())?;
        let mut staged = self.staging.take(extent.len as usize);
        let (head, tail) = staged.split_at_mut(data.len());
        head.copy_from_slice(data);
        tail.fill(0);
        self.ring.write(extent.offset, &staged)?;
        Ok(())
    }

    /// Make written data durable (fdatasync through the ring).
    pub fn sync_data(&self) -> Result<(), StoreError> {
        self.ring.datasync()?;
        Ok(())
    }

    /// Read `extent` into a staging buffer and run `f` on its bytes.
    pub fn read<R>(&self, extent: Extent, f: impl FnOnce(&[u8]) -> R) -> Result<R, StoreError> {
        check_extent(extent, 0)?;
        let mut staged = self.staging.take(extent.len as usize);
        self.ring.read(extent.offset, &mut staged)?;
        Ok(f(&staged))
    }

    /// Index `key` -> `rec`; with `sync` the WAL is synced before returning.
    pub fn index_put(
        &self,
        key: &BlockKey,
        rec: &DiskRecord,
        sync: bool,
    ) -> Result<(), StoreError> {
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        self.db.put_opt(index_key(key), rec.encode(), &wo)?;
        Ok(())
    }

    /// Drop the index entry of `key`.
    pub fn index_delete(&self, key: &BlockKey) -> Result<(), StoreError> {
        self.db.delete(index_key(key))?;
        Ok(())
    }
}

/// O_DIRECT needs aligned offsets and lengths; `data_len` must fit the extent.
fn check_extent(extent: Extent, data_len: usize) -> Result<(), StoreError> {
    if extent.offset % DISK_ALIGN != 0 || extent.len % DISK_ALIGN != 0 || extent.len == 0 {
        return Err(StoreError::InvalidArgument(BadArgument::UnalignedExtent {
            offset: extent.offset,
            len: extent.len,
            align: DISK_ALIGN,
        }));
    }
    if data_len as u64 > extent.len {
        return Err(StoreError::InvalidArgument(BadArgument::ExtentOverflow {
            len: data_len as u64,
            extent_len: extent.len,
        }));
    }
    Ok(())
}

fn open_direct(path: &Path) -> Result<File, StoreError> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true).truncate(false);
    match o.clone().custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Ok(f),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            tracing::warn!(
                "{}: O_DIRECT not supported here; using the page cache",
                path.display()
            );
            Ok(o.open(path)?)
        }
        Err(e) => Err(e.into()),
    }
}

fn preallocate(file: &File, len: u64) -> Result<(), StoreError> {
    // SAFETY: plain syscall on an open fd.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!("fallocate failed ({e}); extending the file sparsely");
        file.set_len(len)?;
    }
    Ok(())
}

fn device_len(file: &File) -> Result<u64, StoreError> {
    use std::io::{Seek, SeekFrom};
    let mut f = file;
    let len = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(0))?;
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{BlockOrder, DType};

    fn rec(offset: u64) -> DiskRecord {
        DiskRecord {
            extent: Extent { offset, len: 8192 },
            len: 5000,
            checksum: 42,
            tokens: 16,
            layout: KvLayout {
                layers: 2,
                kv_heads: 1,
                head_dim: 8,
                dtype: DType::F16,
                block_tokens: 16,
                order: BlockOrder::LayerKvTokenHead,
            },
            codec: DiskCodec::Planes,
            owner: None,
        }
    }

    fn owned(offset: u64) -> DiskRecord {
        DiskRecord {
            owner: Some("acme".into()),
            ..rec(offset)
        }
    }

    #[test]
    fn records_round_trip_and_old_records_read_as_raw() {
        let r = rec(8192);
        assert_eq!(DiskRecord::decode(&r.encode()), Some(r.clone()));
        // A record from before the codec byte: the block is raw.
        let old = DiskRecord::decode(&r.encode()[..OLD_RECORD_LEN]).unwrap();
        assert_eq!(old.codec, DiskCodec::Raw);
        assert_eq!(
            (old.extent, old.len, old.checksum),
            (r.extent, r.len, r.checksum)
        );
        // An unknown codec is an unreadable record (dropped at open), not a guess.
        let mut bad = r.encode();
        bad[58] = 77;
        assert_eq!(DiskRecord::decode(&bad), None);
    }

    #[test]
    fn records_keep_their_owner_and_ownerless_records_read_as_unowned() {
        let owned = DiskRecord {
            owner: Some("shared:public-assistant".into()),
            ..rec(8192)
        };
        let bytes = owned.encode();
        assert_eq!(DiskRecord::decode(&bytes), Some(owned.clone()));
        // A record from before owners were recorded: the block is nobody's.
        let old = DiskRecord::decode(&bytes[..RECORD_LEN]).unwrap();
        assert_eq!(old.owner, None);
        assert_eq!(old.codec, DiskCodec::Planes);
        // A length byte that disagrees with the record, or a name that is
        // not UTF-8, is an unreadable record (dropped at open), not a guess.
        assert_eq!(DiskRecord::decode(&bytes[..bytes.len() - 1]), None);
        let mut bad = bytes.clone();
        bad[RECORD_LEN + 1] = 0xff;
        assert_eq!(DiskRecord::decode(&bad), None);
        // An empty name is not written (the block is nobody's).
        let empty = DiskRecord {
            owner: Some("".into()),
            ..rec(8192)
        };
        assert_eq!(empty.encode().len(), RECORD_LEN);
    }

    #[test]
    fn data_and_index_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (data_path, idx) = (dir.path().join("d"), dir.path().join("i"));
        let key = BlockKey([3; 32]);
        // Any source memory: the tier stages it (this slice is unaligned).
        let src: Vec<u8> = (0..8193u32).map(|i| (i % 251) as u8).collect();
        let data = &src[1..];
        {
            let (t, recs) = DiskTier::open(&data_path, &idx, 1 << 20).unwrap();
            assert!(recs.is_empty());
            t.write(rec(4096).extent, data).unwrap();
            t.sync_data().unwrap();
            t.index_put(&key, &owned(4096), true).unwrap();
            // Misaligned extents and oversized data are refused, not mangled.
            let refused =
                |r: Result<(), StoreError>| matches!(r, Err(StoreError::InvalidArgument(_)));
            let odd = Extent {
                offset: 100,
                len: 8192,
            };
            let small = Extent {
                offset: 4096,
                len: 4096,
            };
            assert!(refused(t.write(odd, data)));
            assert!(refused(t.write(small, data)));
            assert!(refused(t.read(odd, |_| ())));
        }
        let (t, recs) = DiskTier::open(&data_path, &idx, 1 << 20).unwrap();
        assert_eq!(recs, vec![(key, owned(4096))], "the owner survives reopen");
        let back = t.read(rec(4096).extent, |b| b.to_vec()).unwrap();
        assert_eq!(back, data);
        // A short write zero-fills the rest of its extent.
        t.write(rec(4096).extent, &data[..100]).unwrap();
        let back = t.read(rec(4096).extent, |b| b.to_vec()).unwrap();
        assert_eq!(&back[..100], &data[..100]);
        assert!(back[100..].iter().all(|&b| b == 0));
        t.index_delete(&key).unwrap();
        drop(t);
        // Records past a shrunk capacity are dropped at open.
        let (_t, recs) = DiskTier::open(&data_path, &idx, 1 << 20).unwrap();
        assert!(recs.is_empty());
    }
}
