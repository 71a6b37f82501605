//! [`PyClientError`]: every failure of this crate, and the Python exception
//! each one raises (`kvfabric.KvfabricError` and its subclasses).

use std::time::Duration;

use pyo3::{create_exception, PyErr};

create_exception!(
    _native,
    KvfabricError,
    pyo3::exceptions::PyException,
    "Base of every error kvfabric raises."
);
create_exception!(
    _native,
    ConnectError,
    KvfabricError,
    "The node cannot be reached (refused, TLS mismatch, timed out connecting)."
);
create_exception!(
    _native,
    AuthError,
    KvfabricError,
    "The node refused this caller: unknown API key, or a certificate it does not admit."
);
create_exception!(
    _native,
    NodeError,
    KvfabricError,
    "The node answered a call with an error (its gRPC status and reason)."
);

/// Why a call failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum PyClientError {
    /// The node at `addr` cannot be reached.
    #[error("cannot reach the kvfabric node at {addr}: {reason}")]
    Connect { addr: String, reason: String },
    /// The node refused the caller's key or certificate.
    #[error("the kvfabric node at {addr} refused this caller ({sent}): {reason}")]
    Auth {
        addr: String,
        sent: &'static str,
        reason: String,
    },
    /// An argument the call cannot use.
    #[error("invalid {what}: {reason}")]
    InvalidArgument { what: &'static str, reason: String },
    /// The node answered with an error status.
    #[error("the kvfabric node at {addr} failed {call}: {code:?}: {message}")]
    Node {
        addr: String,
        call: &'static str,
        code: tonic::Code,
        message: String,
    },
    /// The call ran past its deadline.
    #[error("{what} did not end within {after:?}")]
    Timeout { what: &'static str, after: Duration },
    /// Starting something in this process failed (a runtime, an embedded node).
    #[error("{what}: {reason}")]
    Local { what: &'static str, reason: String },
}

impl PyClientError {
    /// The error for `status`, from the node at `addr` answering `call`;
    /// `keyed`: the caller sent an API key.
    pub fn from_status(addr: &str, call: &'static str, keyed: bool, s: &tonic::Status) -> Self {
        use tonic::Code;
        match s.code() {
            Code::Unauthenticated | Code::PermissionDenied => PyClientError::Auth {
                addr: addr.to_string(),
                sent: if keyed { "its API key" } else { "no API key" },
                reason: s.message().to_string(),
            },
            Code::Unavailable => PyClientError::Connect {
                addr: addr.to_string(),
                reason: s.message().to_string(),
            },
            // A status the client made from a failure of its own transport
            // (it carries that error as its source; a node's answer carries
            // none): the node never answered the call. A TLS / plaintext
            // mismatch shows this way.
            Code::Unknown | Code::Internal if std::error::Error::source(s).is_some() => {
                PyClientError::Connect {
                    addr: addr.to_string(),
                    reason: format!(
                        "{} (a node with TLS wants tls_dir and tls_name; one without refuses them)",
                        s.message()
                    ),
                }
            }
            Code::DeadlineExceeded | Code::Cancelled => PyClientError::Timeout {
                what: call,
                after: Duration::ZERO,
            },
            code => PyClientError::Node {
                addr: addr.to_string(),
                call,
                code,
                message: s.message().to_string(),
            },
        }
    }

    /// An argument error.
    pub fn arg(what: &'static str, reason: impl Into<String>) -> Self {
        PyClientError::InvalidArgument {
            what,
            reason: reason.into(),
        }
    }

    /// True when the whole batch must fail rather than count one block as missed.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            PyClientError::Auth { .. } | PyClientError::InvalidArgument { .. }
        )
    }
}

impl From<PyClientError> for PyErr {
    fn from(e: PyClientError) -> PyErr {
        let msg = e.to_string();
        match e {
            PyClientError::Connect { .. } => ConnectError::new_err(msg),
            PyClientError::Auth { .. } => AuthError::new_err(msg),
            PyClientError::InvalidArgument { .. } => InvalidArgument::new_err(msg),
            PyClientError::Node { .. } => NodeError::new_err(msg),
            PyClientError::Timeout { .. } => Timeout::new_err(msg),
            PyClientError::Local { .. } => KvfabricError::new_err(msg),
        }
    }
}

// The two errors that are also builtins' (`ValueError`, `TimeoutError`)
// have two bases, which `create_exception!` cannot make: they are defined in
// `kvfabric/_errors.py` over `KvfabricError` and raised from here.
pyo3::import_exception!(kvfabric._errors, InvalidArgument);
pyo3::import_exception!(kvfabric._errors, Timeout);
