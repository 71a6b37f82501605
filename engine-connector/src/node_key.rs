//! What a remote connector says about itself on each call to its node: the
//! API key (`authorization: Bearer`, `[connector] node_api_key`) a node
//! with a tenants file wants, and on puts the block's owner
//! (`x-kvfabric-owner`, the request's tenant; the node honours it for a
//! trusted key). A refusal of the key becomes
//! [`ConnectorError::NodeApiKey`], which names the setting to change.

use kvfabric_node::tenant_scope::OWNER_METADATA;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};

use crate::{ApiKey, ConnectorError};

/// The metadata of one connector's calls.
#[derive(Clone, Debug, Default)]
pub(crate) struct NodeKey {
    bearer: Option<AsciiMetadataValue>,
}

impl NodeKey {
    /// From the configured key (None: calls carry no key).
    pub fn new(key: Option<&ApiKey>) -> Result<Self, ConnectorError> {
        let bearer = key
            .map(|k| {
                format!("Bearer {}", k.expose())
                    .parse()
                    .map_err(|_| ConnectorError::Config(crate::ConfigProblem::NodeApiKey))
            })
            .transpose()?;
        Ok(NodeKey { bearer })
    }

    /// The metadata of a call; `owner` names the owner of a put's block.
    pub fn metadata(&self, owner: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(b) = &self.bearer {
            m.insert("authorization", b.clone());
        }
        // Owner names are ASCII (tenant names, `shared:<name>`); anything
        // else is left off (the node counts the block to the key's tenant).
        if let Some(v) = owner.and_then(|o| o.parse::<AsciiMetadataValue>().ok()) {
            m.insert(OWNER_METADATA, v);
        }
        m
    }

    /// `msg` as a request with the key.
    pub fn request<T>(&self, msg: T) -> tonic::Request<T> {
        tonic::Request::from_parts(self.metadata(None), Default::default(), msg)
    }

    /// The typed error for `status` from the node at `node`, when it is a
    /// refusal of this connector's key (UNAUTHENTICATED).
    pub fn refused(&self, node: &str, status: &tonic::Status) -> Option<ConnectorError> {
        (status.code() == tonic::Code::Unauthenticated).then(|| ConnectorError::NodeApiKey {
            node: node.to_string(),
            sent: if self.bearer.is_some() {
                "an API key the node does not know"
            } else {
                "no API key"
            },
            reason: status.message().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_setting_and_what_was_sent() {
        let none = NodeKey::new(None).unwrap();
        let status = tonic::Status::unauthenticated("missing API key");
        let e = none.refused("n0:50051", &status).unwrap().to_string();
        assert!(
            e.contains("node_api_key") && e.contains("KVFABRIC_NODE_API_KEY"),
            "{e}"
        );
        assert!(e.contains("no API key") && e.contains("n0:50051"), "{e}");
        let some = NodeKey::new(Some(&ApiKey::new("kvf-x"))).unwrap();
        let e = some.refused("n0:50051", &status).unwrap().to_string();
        assert!(e.contains("does not know"), "{e}");
        assert!(some
            .refused("n0", &tonic::Status::unavailable("down"))
            .is_none());
        let m = some.metadata(Some("acme"));
        assert_eq!(m.get("authorization").unwrap(), "Bearer kvf-x");
        assert_eq!(m.get(OWNER_METADATA).unwrap(), "acme");
        assert!(none.metadata(None).is_empty());
    }
}
