//! Node identity on the gRPC side: the identity a node loads from
//! its `[cluster.security]` files (checked against its `node_id`), tonic's
//! TLS settings built from it for the server and every peer channel (mutual
//! TLS: a peer without a certificate of the cluster CA cannot connect), and
//! the checks the internal services make: a request that claims a node id
//! must come from the node whose certificate names it. Clients of a node
//! (`kvfabric ctl`, an engine's remote connector) load theirs from the same
//! settings with [`load_client`].

use std::sync::Arc;

use kvfabric_transfer::security::{
    node_dns_name, node_id_of, NodeIdentity, SecurityConfig, SecurityMode, SERVER_NAME,
};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
use tonic::{Request, Status};

use crate::cluster::cluster_config::ClusterConfig;
use crate::{BadNodeConfig, NodeError};

/// Load `cfg`'s identity for node `node_id`; None (and a loud warning) in mode `none`.
pub fn load(cfg: &ClusterConfig, node_id: &str) -> Result<Option<Arc<NodeIdentity>>, NodeError> {
    let id = NodeIdentity::load(&cfg.security)
        .map_err(|e| NodeError::Config(BadNodeConfig::Security(e)))?;
    match &id {
        None => tracing::warn!(
            node = %node_id,
            "security mode none: any process that reaches this node's ports can read and write \
             its blocks and announce under any node id; use it on loopback or a trusted test bed \
             only (docs/SECURITY.md)"
        ),
        Some(i) if i.node_id() != Some(node_id) => {
            return Err(NodeError::Config(BadNodeConfig::CertificateNode {
                cert: i.principal.uri(),
                node_id: node_id.to_string(),
            }))
        }
        Some(i) => {
            tracing::info!(node = %node_id, mode = i.mode.as_str(), "mutual TLS between nodes")
        }
    }
    Ok(id)
}

/// A client's identity from the `[cluster.security]` settings a node reads
/// (file, `KVFABRIC_TLS_*`, `--tls-*`): None without certificates (mode
/// `none`). Any certificate of the cluster CA will do: a tool's or a
/// tenant's (`kvfabric certs init --tools`, `--tenants`), or a node's.
pub fn load_client(cfg: &SecurityConfig) -> Result<Option<Arc<NodeIdentity>>, NodeError> {
    let id = NodeIdentity::load(cfg).map_err(|e| NodeError::Config(BadNodeConfig::Security(e)))?;
    if let Some(i) = &id {
        tracing::debug!(cert = %i.principal.uri(), mode = i.mode.as_str(), "client over mutual TLS");
    }
    Ok(id)
}

/// The gRPC server's TLS: our certificate, client certificates required
/// (chained to the cluster CA).
pub fn server_tls(id: &NodeIdentity) -> ServerTlsConfig {
    ServerTlsConfig::new()
        .identity(Identity::from_pem(&id.cert_pem, &id.key_pem))
        .client_ca_root(Certificate::from_pem(&id.ca_pem))
}

/// A channel's TLS: our certificate presented, the server verified against
/// the cluster CA as node `expected` ([`node_dns_name`]: only that node's
/// certificate passes), or as any node ([`SERVER_NAME`]) for a client that
/// knows only an address.
pub fn client_tls(id: &NodeIdentity, expected: Option<&str>) -> ClientTlsConfig {
    ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&id.ca_pem))
        .identity(Identity::from_pem(&id.cert_pem, &id.key_pem))
        .domain_name(expected.map_or_else(|| SERVER_NAME.to_string(), node_dns_name))
}

/// Refuse a caller whose certificate is on the revocation list in force
/// (checked on every request, so an open connection is cut off too).
pub fn refuse_revoked<T>(identity: Option<&NodeIdentity>, req: &Request<T>) -> Result<(), Status> {
    let revoked = identity.is_some_and(|i| {
        req.peer_certs()
            .and_then(|c| c.first().map(|c| i.is_revoked(c)))
            .unwrap_or(false)
    });
    if revoked {
        return Err(Status::unauthenticated(
            "the caller's certificate is revoked",
        ));
    }
    Ok(())
}

/// The node id in the certificate the caller of `req` presented.
pub fn caller<T>(req: &Request<T>) -> Option<String> {
    let certs = req.peer_certs()?;
    node_id_of(certs.first()?)
}

/// Secured: the caller's node id, refusing a caller without one
/// (UNAUTHENTICATED) or one claiming another id (PERMISSION_DENIED).
/// `claimed` empty claims nothing. Mode none: `claimed` as given.
pub fn authorize<T>(
    identity: Option<&NodeIdentity>,
    req: &Request<T>,
    claimed: &str,
) -> Result<String, Status> {
    match identity {
        Some(i) if i.mode != SecurityMode::None => {}
        _ => return Ok(claimed.to_string()),
    }
    refuse_revoked(identity, req)?;
    let Some(id) = caller(req) else {
        return Err(Status::unauthenticated(
            "no node certificate on this connection",
        ));
    };
    if !claimed.is_empty() && claimed != id {
        return Err(Status::permission_denied(format!(
            "the caller's certificate names node {id:?}, the request claims {claimed:?}"
        )));
    }
    Ok(id)
}
