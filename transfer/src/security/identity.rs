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
use crate::error::BadInput;
use crate::TransferError;

/// The DNS name every node certificate carries and every client verifies.
pub const SERVER_NAME: &str = "kvfabric-node";
/// Prefix of the URI subject alternative name that carries a node's id.
pub const NODE_URI_PREFIX: &str = "kvfabric://node/";

/// The URI SAN naming node `id`.
pub fn node_uri(id: &str) -> String {
    format!("{NODE_URI_PREFIX}{id}")
}

/// The node id a DER certificate names (its first `kvfabric://node/` URI
/// SAN); None when it names none or does not parse.
pub fn node_id_of(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|n| match n {
        x509_parser::extensions::GeneralName::URI(u) => u
            .strip_prefix(NODE_URI_PREFIX)
            .filter(|id| !id.is_empty())
            .map(str::to_string),
        _ => None,
    })
}

/// What a node proves itself with and checks its peers against.
pub struct NodeIdentity {
    pub mode: SecurityMode,
    /// The id this node's certificate names.
    pub node_id: String,
    /// PEM bytes of the certificate chain, key and CA (for tonic).
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub ca_pem: Vec<u8>,
    /// Accepting end: presents our certificate, requires a client
    /// certificate chained to the CA.
    pub server: Arc<ServerConfig>,
    /// Connecting end: verifies the server against the CA, presents ours.
    pub client: Arc<ClientConfig>,
}

impl std::fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeIdentity")
            .field("mode", &self.mode)
            .field("node_id", &self.node_id)
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
        Self::from_pem(mode, read(cert)?, read(key)?, read(ca)?).map(|i| Some(Arc::new(i)))
    }

    /// Build from PEM bytes (the files' contents).
    pub fn from_pem(
        mode: SecurityMode,
        cert_pem: Vec<u8>,
        key_pem: Vec<u8>,
        ca_pem: Vec<u8>,
    ) -> Result<Self, TransferError> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| bad("certificate", e))?;
        let leaf = certs
            .first()
            .ok_or_else(|| bad("certificate", "no PEM block"))?;
        let node_id = node_id_of(leaf).ok_or_else(|| {
            bad(
                "certificate",
                format!("names no node ({NODE_URI_PREFIX}<id> URI SAN)"),
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
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("tls", e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| bad("certificate and key", e))?;
        Ok(NodeIdentity {
            mode,
            node_id,
            cert_pem,
            key_pem,
            ca_pem,
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }

    /// The name a client verifies a node's certificate against.
    pub fn server_name() -> ServerName<'static> {
        ServerName::DnsName(
            rustls::pki_types::DnsName::try_from(SERVER_NAME).expect("static DNS name is valid"),
        )
    }
}
