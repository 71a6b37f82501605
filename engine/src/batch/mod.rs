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
mod config;
mod executor;
mod lines;
pub mod multipart;
mod objects;
pub(crate) mod runner;
mod stop;
mod store;

pub use catalog::Catalog;
pub use config::BatchConfig;
pub use executor::BatchExecutor;
pub use objects::{BatchObject, BatchStatus, FileObject, RequestCounts};
pub use runner::BatchService;
pub use store::{BatchStore, Entries, MemoryBatchStore};
