//! `[engine.batch]`: where batch jobs are kept and how much batch work may
//! run beside interactive requests (docs/CONFIG.md).

use std::path::PathBuf;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

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
    /// How long a batch may run (its `completion_window`, which the API
    /// spells `24h`) before it ends `expired`, its unfinished requests
    /// stopped and listed in its error file. Default: 86400 (24 h).
    pub completion_window_secs: u64,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            dir: None,
            max_file_bytes: ByteSize::mib(100),
            max_seqs: 4,
            completion_window_secs: 24 * 3600,
        }
    }
}
