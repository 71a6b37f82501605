//! The engine crate's one error type.

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
    #[error("grammar: {reason}")]
    Grammar { reason: String },
    /// A malformed or unsupported model file.
    #[error("model file: {0}")]
    Model(String),
    /// The fabric connector could not be attached (or failed).
    #[error("fabric connector: {0}")]
    Connector(#[from] kvfabric_connector::ConnectorError),
    /// The tenants file could not be loaded.
    #[error("tenants: {0}")]
    Tenants(#[from] kvfabric_tenants::TenantsError),
    /// The batch API's store failed (`op`: get, put, scan, decode, ...).
    #[error("batch store {op}: {message}")]
    BatchStore { op: &'static str, message: String },
    /// The speculative pass-cost probe gave no usable timing.
    #[error("verify pass cost probe: {reason}")]
    CostProbe { reason: String },
    /// An OS call failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}
