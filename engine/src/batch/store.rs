//! Where batch jobs are kept: [`BatchStore`], a small ordered key-value
//! trait (so the engine crate links no database; `kvfabric engine` passes a
//! RocksDB one), and [`MemoryBatchStore`] for a process without a
//! `[engine.batch] dir`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::EngineError;

/// Entries of a scan: (key, value), in key order.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// A small ordered key-value store the batch jobs are kept in.
pub trait BatchStore: Send + Sync + std::fmt::Debug {
    /// The value under `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError>;
    /// Store `value` under `key` (durably, for a persistent store).
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), EngineError>;
    /// Remove `key` (absent is fine).
    fn delete(&self, key: &[u8]) -> Result<(), EngineError>;
    /// Every entry whose key starts with `prefix`, in key order.
    fn scan(&self, prefix: &[u8]) -> Result<Entries, EngineError>;
}

/// A [`BatchStore`] in memory: jobs last as long as the process.
#[derive(Debug, Default)]
pub struct MemoryBatchStore {
    map: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl MemoryBatchStore {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<Vec<u8>, Vec<u8>>> {
        // A panic while holding the lock leaves the map whole: keep using it.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl BatchStore for MemoryBatchStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        Ok(self.map().get(key).cloned())
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), EngineError> {
        self.map().insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn delete(&self, key: &[u8]) -> Result<(), EngineError> {
        self.map().remove(key);
        Ok(())
    }

    fn scan(&self, prefix: &[u8]) -> Result<Entries, EngineError> {
        Ok(self
            .map()
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}
