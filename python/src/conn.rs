//! [`Conn`]: a channel to one node and what every call on it carries (the
//! tenant's API key, a put's owner), and how a failed call reads as a
//! [`PyClientError`].

use std::time::Duration;

use kvfabric_node::cluster::client::{check_tls, CacheClient};
use tonic::metadata::{AsciiMetadataValue, MetadataMap};

use crate::error::PyClientError;

/// A connection to a node and what every call carries.
#[derive(Clone)]
pub(crate) struct Conn {
    pub(crate) client: CacheClient,
    pub(crate) addr: String,
    pub(crate) bearer: Option<AsciiMetadataValue>,
    /// This client has a certificate.
    pub(crate) tls: bool,
    pub(crate) timeout: Duration,
}

impl Conn {
    /// The metadata of a call: the API key; `owner` names a put's owner.
    pub(crate) fn metadata(&self, owner: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(b) = &self.bearer {
            m.insert("authorization", b.clone());
        }
        if let Some(v) = owner.and_then(|o| o.parse::<AsciiMetadataValue>().ok()) {
            m.insert(kvfabric_node::tenant_scope::OWNER_METADATA, v);
        }
        m
    }

    pub(crate) fn request<T>(&self, msg: T) -> tonic::Request<T> {
        tonic::Request::from_parts(self.metadata(None), Default::default(), msg)
    }

    /// The error of `call` failing with `s`.
    pub(crate) fn error(&self, call: &'static str, s: &tonic::Status) -> PyClientError {
        PyClientError::from_status(&self.addr, call, self.bearer.is_some(), s)
    }

    /// [`Conn::error`], said plainly when the cause is a TLS mismatch (a
    /// plaintext client of a secured node, or the reverse), which tonic
    /// reports only as a transport or HTTP/2 error.
    pub(crate) async fn diagnosed(&self, call: &'static str, s: &tonic::Status) -> PyClientError {
        use tonic::Code;
        if matches!(s.code(), Code::Unavailable | Code::Internal | Code::Unknown) {
            if let Err(e) = check_tls(&self.addr, self.timeout, self.tls).await {
                return PyClientError::Connect {
                    addr: self.addr.clone(),
                    reason: e.to_string(),
                };
            }
        }
        self.error(call, s)
    }
}
