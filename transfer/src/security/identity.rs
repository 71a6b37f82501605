//! [`NodeIdentity`]: a node's certificate, key and cluster CA, loaded once,
//! with the rustls configurations both ends of a mutual-TLS connection use;
//! and the node id a certificate names ([`node_id_of`]).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use super::config::{SecurityConfig, SecurityMode};
use super::revocation::Revocations;
use crate::error::BadInput;
use crate::TransferError;

/// The DNS name every node certificate carries, which a client that does
/// not know which node it reaches (a tool given an address) verifies.
pub const SERVER_NAME: &str = "kvfabric-node";
/// Prefix of the URI subject alternative name that carries a node's id.
pub const NODE_URI_PREFIX: &str = "kvfabric://node/";

/// What a certificate of the cluster lets its holder be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// A node: serves and calls the internal services (directory, holder)
    /// and the transfer plane, under the id it names.
    Node,
    /// An operator's tool (`kvfabric ctl`): a client of the CacheService
    /// and the console, never a member.
    Tool,
    /// A tenant's client: the CacheService only, under its API key.
    Tenant,
}

impl Role {
    /// The URI SAN prefix naming a principal of this role.
    pub fn uri_prefix(self) -> &'static str {
        match self {
            Role::Node => NODE_URI_PREFIX,
            Role::Tool => "kvfabric://tool/",
            Role::Tenant => "kvfabric://tenant/",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Node => "node",
            Role::Tool => "tool",
            Role::Tenant => "tenant",
        }
    }
}

/// Who a certificate names: a role and a name (a node's id).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Principal {
    pub role: Role,
    pub name: String,
}

impl Principal {
    /// Node `id`.
    pub fn node(id: &str) -> Principal {
        Principal {
            role: Role::Node,
            name: id.to_string(),
        }
    }

    /// Its URI SAN, `kvfabric://<role>/<name>`.
    pub fn uri(&self) -> String {
        format!("{}{}", self.role.uri_prefix(), self.name)
    }

    /// The node id, for a node's certificate.
    pub fn node_id(&self) -> Option<&str> {
        (self.role == Role::Node).then_some(self.name.as_str())
    }
}

/// The URI SAN naming node `id`.
pub fn node_uri(id: &str) -> String {
    format!("{NODE_URI_PREFIX}{id}")
}

/// The DNS name only node `id`'s certificate carries, which a client that
/// means to reach node `id` verifies, so no other member can answer for it:
/// `<id>.node.kvfabric` when the id is a DNS label (`a-z 0-9 -`, at most
/// 63), else the first 128 bits of its blake3 hash in hex.
pub fn node_dns_name(id: &str) -> String {
    let label = id.len() <= 63
        && !id.is_empty()
        && !id.starts_with('-')
        && !id.ends_with('-')
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if label {
        format!("{id}.node.kvfabric")
    } else {
        let h = blake3::hash(id.as_bytes()).to_hex();
        format!("h{}.node.kvfabric", &h[..32])
    }
}

/// Who a DER certificate names (its first `kvfabric://<role>/` URI SAN);
/// None when it names nobody or does not parse.
pub fn principal_of(der: &[u8]) -> Option<Principal> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|n| match n {
        x509_parser::extensions::GeneralName::URI(u) => [Role::Node, Role::Tool, Role::Tenant]
            .into_iter()
            .find_map(|role| {
                let name = u.strip_prefix(role.uri_prefix())?;
                (!name.is_empty()).then(|| Principal {
                    role,
                    name: name.to_string(),
                })
            }),
        _ => None,
    })
}

/// The node id a DER certificate names; None when it is not a node's
/// (a tool's or a tenant's) or names nobody.
pub fn node_id_of(der: &[u8]) -> Option<String> {
    principal_of(der)
        .filter(|p| p.role == Role::Node)
        .map(|p| p.name)
}

/// What a node proves itself with and checks its peers against.
pub struct NodeIdentity {
    pub mode: SecurityMode,
    /// Who the certificate names: a node (its id), a tool or a tenant.
    pub principal: Principal,
    /// PEM bytes of the certificate chain, key and CA (for tonic).
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub ca_pem: Vec<u8>,
    /// Accepting end: presents our certificate, requires a client
    /// certificate chained to the CA.
    pub server: Arc<ServerConfig>,
    /// Connecting end: verifies the server against the CA, presents ours.
    pub client: Arc<ClientConfig>,
    /// The CA's revocation list in force (`[cluster.security] crl`).
    pub revocations: Revocations,
    /// Our own certificate (DER), which a new revocation list must verify with.
    own: CertificateDer<'static>,
}

impl std::fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeIdentity")
            .field("mode", &self.mode)
            .field("principal", &self.principal)
            .finish_non_exhaustive()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TransferError> {
    std::fs::read(path).map_err(|e| bad(&format!("read {}", path.display()), e))
}

fn bad(what: &str, e: impl std::fmt::Display) -> TransferError {
    TransferError::InvalidArgument(BadInput::Credentials {
        what: what.to_string(),
        reason: e.to_string(),
    })
}

/// ring's provider with AES-128-GCM first: `encrypt` mode runs every
/// payload byte through the cipher twice (seal, open), and AES-128 (10
/// rounds) beats AES-256 (14) by ~12% here (both AES-NI/VAES; the bench's
/// `bounds` measures them). AES-256 and ChaCha20 stay offered.
fn provider() -> rustls::crypto::CryptoProvider {
    let mut p = rustls::crypto::ring::default_provider();
    let aes128 = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    p.cipher_suites.retain(|s| s.suite() != aes128.suite());
    p.cipher_suites.insert(0, aes128);
    p
}

impl NodeIdentity {
    /// Load `cfg`'s files; None in mode `none`.
    pub fn load(cfg: &SecurityConfig) -> Result<Option<Arc<Self>>, TransferError> {
        cfg.validate()?;
        let mode = cfg.effective_mode();
        let (Some(cert), Some(key), Some(ca)) = (&cfg.cert, &cfg.key, &cfg.ca) else {
            return Ok(None);
        };
        if mode == SecurityMode::None {
            return Ok(None);
        }
        Self::with_revocations(mode, read(cert)?, read(key)?, read(ca)?, cfg.crl.as_deref())
            .map(|i| Some(Arc::new(i)))
    }

    /// Build from PEM bytes (the files' contents); nothing revoked.
    pub fn from_pem(
        mode: SecurityMode,
        cert_pem: Vec<u8>,
        key_pem: Vec<u8>,
        ca_pem: Vec<u8>,
    ) -> Result<Self, TransferError> {
        Self::with_revocations(mode, cert_pem, key_pem, ca_pem, None)
    }

    /// [`Self::from_pem`] with the CA's revocation list at `crl`.
    pub fn with_revocations(
        mode: SecurityMode,
        cert_pem: Vec<u8>,
        key_pem: Vec<u8>,
        ca_pem: Vec<u8>,
        crl: Option<&Path>,
    ) -> Result<Self, TransferError> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| bad("certificate", e))?;
        let leaf = certs
            .first()
            .ok_or_else(|| bad("certificate", "no PEM block"))?;
        let principal = principal_of(leaf).ok_or_else(|| {
            bad(
                "certificate",
                "names no node, tool or tenant (kvfabric://<role>/<name> URI SAN)",
            )
        })?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| bad("key", e))?;
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(&ca_pem) {
            roots
                .add(ca.map_err(|e| bad("ca", e))?)
                .map_err(|e| bad("ca", e))?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(provider());
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| bad("ca", e))?;
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("tls", e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| bad("certificate and key", e))?;
        // No session tickets: the transfer connection leaves TLS after the
        // handshake in `authenticate` mode, and a ticket would follow it.
        server.send_tls13_tickets = 0;
        let own = leaf.clone().into_owned();
        let revocations = Revocations::load(roots.clone(), provider.clone(), crl, &own)?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("tls", e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| bad("certificate and key", e))?;
        Ok(NodeIdentity {
            mode,
            principal,
            cert_pem,
            key_pem,
            ca_pem,
            server: Arc::new(server),
            client: Arc::new(client),
            revocations,
            own,
        })
    }

    /// Re-read the revocation list now; whether it changed.
    pub fn reload_revocations(&self) -> Result<bool, TransferError> {
        self.revocations.reload(&self.own)
    }

    /// Whether the peer certificate `der` is revoked now.
    pub fn is_revoked(&self, der: &[u8]) -> bool {
        self.revocations.is_revoked(&CertificateDer::from(der))
    }

    /// Re-read the revocation list every [`super::REVOCATION_RELOAD`] while
    /// this identity lives (a tokio task); a list that fails to load is
    /// logged and the one in force stays.
    pub fn watch_revocations(self: &Arc<Self>) {
        if !self.revocations.watched() {
            return;
        }
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(super::REVOCATION_RELOAD).await;
                let Some(id) = me.upgrade() else { return };
                match id.revocations.reload(&id.own) {
                    Ok(true) => tracing::info!("certificate revocation list reloaded"),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "certificate revocation list not reloaded; the one in force stays")
                    }
                }
            }
        });
    }

    /// The name a client verifies a node's certificate against: node
    /// `expected`'s own name, or any node's ([`SERVER_NAME`]) when the
    /// caller does not know which node it reaches.
    pub fn server_name(expected: Option<&str>) -> ServerName<'static> {
        let name = expected.map_or_else(|| SERVER_NAME.to_string(), node_dns_name);
        ServerName::DnsName(
            rustls::pki_types::DnsName::try_from(name).expect("node DNS names are valid"),
        )
    }

    /// This certificate's node id; None for a tool's or a tenant's.
    pub fn node_id(&self) -> Option<&str> {
        self.principal.node_id()
    }
}
