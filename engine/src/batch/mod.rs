//! The async batch API's jobs: uploaded files, batches, their results.
//!
//! OpenAI's batch API (`/v1/files`, `/v1/batches`; routes in
//! `http/batch.rs`): a JSONL file of `{custom_id, method, url, body}`
//! lines is uploaded, a batch over it is created, and the engine runs its
//! requests in the background at a priority below interactive requests
//! (`scheduler/priority.rs`), writing an output file and an error file.
//!
//! Everything is kept behind [`BatchStore`], a small key-value trait, so
//! the engine crate stays free of a database: `kvfabric engine` passes a
//! RocksDB store under `[engine.batch] dir` (the binary's
//! `batch_store.rs`); without one, [`MemoryBatchStore`] keeps jobs for the
//! life of the process. Each request's result is stored as it ends, so a
//! batch still in progress when the process stops resumes at the next start
//! and runs only the requests without a stored result ([`runner`]).

mod catalog;
mod lines;
pub mod multipart;
mod objects;
pub(crate) mod runner;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

pub use catalog::Catalog;
pub use objects::{BatchObject, BatchStatus, FileObject, RequestCounts};
pub use runner::BatchService;

use crate::EngineError;

/// `[engine.batch]`: where jobs are kept and how much batch work may run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// RocksDB directory of files, batches and results (`kvfabric engine`
    /// opens it). None: kept in memory, lost at exit. Default: none.
    pub dir: Option<PathBuf>,
    /// Largest file `POST /v1/files` accepts. Default: 100 MiB.
    pub max_file_bytes: ByteSize,
    /// Most batch-job sequences running at once (they only take slots no
    /// interactive request waits for). Default: 4.
    pub max_seqs: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            dir: None,
            max_file_bytes: ByteSize::mib(100),
            max_seqs: 4,
        }
    }
}

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
