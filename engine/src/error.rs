//! The engine crate's one error type.

use std::sync::Arc;

/// An error of a library the engine uses (a template engine, a regex
/// compiler, llguidance, RocksDB), kept as the source of the engine's own.
pub type LibraryError = Box<dyn std::error::Error + Send + Sync>;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The engine's scheduler is gone.
    #[error("the engine has shut down")]
    ShutDown,
    /// Bad input from a user.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A grammar (JSON schema, Lark) that does not compile, or a
    /// constrained sample whose parser failed.
    #[error("grammar: {0}")]
    Grammar(GrammarFault),
    /// A malformed or unsupported model file (what is wrong with it, from
    /// the file's own names and values).
    #[error("model file: {0}")]
    Model(String),
    /// A part of the model file (`part`: `chat template`, `pre-tokenizer
    /// pattern`, `special tokens`) that its library refused.
    #[error("model file: {part}: {source}")]
    ModelPart {
        part: &'static str,
        #[source]
        source: LibraryError,
    },
    /// The KV pool's shared region could not be made.
    #[error("KV pool: {0}")]
    KvPool(#[source] kvfabric_types::TypesError),
    /// A blocking task (`task`: `model loading`) panicked or was cancelled.
    #[error("{task} task: {source}")]
    Task {
        task: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    /// The fabric connector could not be attached (or failed).
    #[error("fabric connector: {0}")]
    Connector(#[from] kvfabric_connector::ConnectorError),
    /// The tenants file could not be loaded.
    #[error("tenants: {0}")]
    Tenants(#[from] kvfabric_tenants::TenantsError),
    /// The batch API's store failed (`op`: open, get, put, scan, encode,
    /// ...): `source` is the store's (or the JSON codec's) error.
    #[error("batch store {op}: {source}")]
    BatchStore {
        op: &'static str,
        #[source]
        source: LibraryError,
    },
    /// A batch record at `key` that does not decode.
    #[error("batch store decode: {key}: {source}")]
    BatchRecord {
        key: String,
        #[source]
        source: serde_json::Error,
    },
    /// A batch result whose key (`key`) holds no request index.
    #[error("batch store decode: bad result key {key}")]
    BatchResultKey { key: String },
    /// The speculative pass-cost probe gave no usable single-row time:
    /// `times` is what it measured (rows past the context, seconds).
    #[error("verify pass cost probe: no usable single-row time in {times:?}")]
    CostProbe { times: Vec<(usize, f64)> },
    /// An OS call failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// What went wrong with a grammar ([`EngineError::Grammar`]).
#[derive(Debug, thiserror::Error)]
pub enum GrammarFault {
    /// llguidance refused the grammar (an unknown type, a bad `$ref`, a
    /// Lark syntax error) or its parser failed: its error.
    #[error("{0}")]
    Parser(#[source] LibraryError),
    /// llguidance could not build its token trie over the vocabulary (built
    /// once and shared, hence the `Arc`).
    #[error("building the token trie: {0}")]
    TokenTrie(#[source] Arc<dyn std::error::Error + Send + Sync>),
    /// The grammar allows no next token (a constrained sample cannot go on).
    #[error("the grammar allows no next token")]
    NoNextToken,
    /// A constrained sequence whose grammar matcher is gone.
    #[error("the grammar matcher was lost")]
    MatcherLost,
}
