//! The batch API's store for `kvfabric engine`: a RocksDB directory
//! (`[engine.batch] dir`) behind the engine crate's `BatchStore` trait, so
//! files, batches and per-request results survive a restart (or a crash:
//! every write is synced). It lives in the binary, not the engine crate,
//! which must not depend on RocksDB.

use std::path::Path;

use kvfabric_engine::batch::{BatchStore, Entries};
use kvfabric_engine::EngineError;
use rocksdb::{Direction, IteratorMode, Options, WriteOptions, DB};

/// A RocksDB database of batch jobs.
#[derive(Debug)]
pub struct RocksBatchStore {
    db: DB,
}

fn failed(op: &'static str, e: rocksdb::Error) -> EngineError {
    EngineError::BatchStore {
        op,
        source: e.into(),
    }
}

impl RocksBatchStore {
    /// Open (or create) the database at `dir`.
    pub fn open(dir: &Path) -> Result<RocksBatchStore, EngineError> {
        std::fs::create_dir_all(dir)?;
        let mut opts = Options::default();
        opts.create_if_missing(true);
        let db = DB::open(&opts, dir).map_err(|e| failed("open", e))?;
        Ok(RocksBatchStore { db })
    }

    fn synced() -> WriteOptions {
        let mut w = WriteOptions::default();
        w.set_sync(true);
        w
    }
}

impl BatchStore for RocksBatchStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        self.db.get(key).map_err(|e| failed("get", e))
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), EngineError> {
        self.db
            .put_opt(key, value, &Self::synced())
            .map_err(|e| failed("put", e))
    }

    fn delete(&self, key: &[u8]) -> Result<(), EngineError> {
        self.db
            .delete_opt(key, &Self::synced())
            .map_err(|e| failed("delete", e))
    }

    fn scan(&self, prefix: &[u8]) -> Result<Entries, EngineError> {
        let mut out = Vec::new();
        for item in self
            .db
            .iterator(IteratorMode::From(prefix, Direction::Forward))
        {
            let (k, v) = item.map_err(|e| failed("scan", e))?;
            if !k.starts_with(prefix) {
                break;
            }
            out.push((k.into_vec(), v.into_vec()));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_survive_reopening_and_scan_by_prefix_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let s = RocksBatchStore::open(dir.path()).expect("open");
            s.put(b"r/b1/00000002", b"two").expect("put");
            s.put(b"r/b1/00000001", b"one").expect("put");
            s.put(b"r/b2/00000001", b"other").expect("put");
            s.put(b"f/x", b"gone").expect("put");
            s.delete(b"f/x").expect("delete");
        }
        let s = RocksBatchStore::open(dir.path()).expect("reopen");
        let rows = s.scan(b"r/b1/").expect("scan");
        let keys: Vec<&[u8]> = rows.iter().map(|(k, _)| k.as_slice()).collect();
        assert_eq!(keys, vec![&b"r/b1/00000001"[..], b"r/b1/00000002"]);
        assert_eq!(s.get(b"f/x").expect("get"), None);
        assert_eq!(
            s.get(b"r/b2/00000001").expect("get"),
            Some(b"other".to_vec())
        );
    }
}
