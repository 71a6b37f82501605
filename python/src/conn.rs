//! [`Conn`]: a channel to one node and what every call on it carries (the
//! tenant's API key, a put's owner), and how a failed call reads as a
//! [`PyClientError`].

use std::time::Duration;

use kvfabric_node::cluster::client::CacheClient;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};

use crate::error::PyClientError;

/// A connection to a node and what every call carries.
#[derive(Clone)]
pub(crate) struct Conn {
    pub(crate) client: CacheClient,
    pub(crate) addr: String,
    pub(crate) bearer: Option<AsciiMetadataValue>,
    /// Each call's deadline (a whole block's get included).
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
}
