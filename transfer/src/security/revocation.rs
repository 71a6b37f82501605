//! Revoked certificates: the cluster CA's certificate revocation list
//! (`kvfabric certs revoke DIR NAME`, an X.509 CRL the CA key signs), as the
//! running process knows it now.
//!
//! A process configured with `[cluster.security] crl` re-reads the file
//! every [`RELOAD`] and swaps in a changed list once it verifies against the
//! CA (a list the CA did not sign is logged and ignored; the one in force
//! stays). [`Revocations::check`] runs a peer certificate through webpki
//! with the list (end-entity revocation), which the gRPC services call on
//! every request and the transfer plane on every connection and op, so a
//! revoked certificate is refused on new and existing connections within a
//! reload period of the file changing. Without a `crl` nothing is revoked.
//! A webpki check costs a signature verification, so answers are kept per
//! certificate (by its blake3) until the list changes: a transfer op or a
//! gRPC call pays a hash and a map lookup.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

use crate::error::BadInput;
use crate::TransferError;

/// How often the list's file is re-read.
pub const RELOAD: Duration = Duration::from_secs(1);

/// The revocation list in force and where it comes from.
pub struct Revocations {
    roots: Arc<RootCertStore>,
    provider: Arc<rustls::crypto::CryptoProvider>,
    /// The `crl` file; None: nothing is ever revoked.
    path: Option<PathBuf>,
    /// The list in force.
    current: RwLock<InForce>,
    /// Answers for the list in force, by certificate hash (cleared when
    /// the list changes, or when it reaches [`MAX_ANSWERS`]).
    answers: Mutex<HashMap<[u8; 32], bool>>,
}

/// The list's bytes in force and a verifier holding it (None: no list).
#[derive(Default)]
struct InForce {
    bytes: Vec<u8>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
}

/// Certificates whose answer is kept (peers of one node: a few hundred).
const MAX_ANSWERS: usize = 4096;

fn bad(what: &str, e: impl std::fmt::Display) -> TransferError {
    TransferError::InvalidArgument(BadInput::Credentials {
        what: what.to_string(),
        reason: e.to_string(),
    })
}

impl Revocations {
    /// The list of `path` (None: none), checked against `roots` (the CA);
    /// `own` (this process's certificate) proves a list verifies.
    pub(crate) fn load(
        roots: Arc<RootCertStore>,
        provider: Arc<rustls::crypto::CryptoProvider>,
        path: Option<&Path>,
        own: &CertificateDer<'_>,
    ) -> Result<Self, TransferError> {
        let r = Revocations {
            roots,
            provider,
            path: path.map(Path::to_path_buf),
            current: RwLock::new(InForce::default()),
            answers: Mutex::new(HashMap::new()),
        };
        if r.path.is_some() {
            r.reload(own)?;
        }
        Ok(r)
    }

    /// Re-read the file; swap in a changed list that the CA signed. Whether
    /// the list changed.
    pub fn reload(&self, own: &CertificateDer<'_>) -> Result<bool, TransferError> {
        let Some(path) = &self.path else {
            return Ok(false);
        };
        let bytes = std::fs::read(path).map_err(|e| bad(&format!("crl {}", path.display()), e))?;
        if self
            .current
            .read()
            .map(|c| c.bytes == bytes)
            .unwrap_or(false)
        {
            return Ok(false);
        }
        let verifier = self.verifier(&bytes)?;
        // A list the CA did not sign fails every check: refuse it now.
        match verifier.verify_client_cert(own, &[], UnixTime::now()) {
            Ok(_) | Err(rustls::Error::InvalidCertificate(rustls::CertificateError::Revoked)) => {}
            Err(e) => return Err(bad("crl", format!("does not verify against the CA: {e}"))),
        }
        if let Ok(mut c) = self.current.write() {
            *c = InForce {
                bytes,
                verifier: Some(verifier),
            };
            // Cleared under the write lock: no answer of the old list survives.
            if let Ok(mut a) = self.answers.lock() {
                a.clear();
            }
        }
        Ok(true)
    }

    fn verifier(&self, pem: &[u8]) -> Result<Arc<dyn ClientCertVerifier>, TransferError> {
        let crls: Vec<CertificateRevocationListDer<'static>> =
            CertificateRevocationListDer::pem_slice_iter(pem)
                .collect::<Result<_, _>>()
                .map_err(|e| bad("crl", e))?;
        if crls.is_empty() {
            return Err(bad("crl", "no X509 CRL PEM block"));
        }
        WebPkiClientVerifier::builder_with_provider(self.roots.clone(), self.provider.clone())
            .with_crls(crls)
            .only_check_end_entity_revocation()
            .build()
            .map_err(|e| bad("crl", e))
    }

    /// Whether `cert` (a peer's, already chained to the CA by its
    /// handshake) is on the list in force.
    pub fn is_revoked(&self, cert: &CertificateDer<'_>) -> bool {
        let Ok(current) = self.current.read() else {
            return false;
        };
        let Some(v) = &current.verifier else {
            return false;
        };
        let id = *blake3::hash(cert.as_ref()).as_bytes();
        let known = self.answers.lock().ok().and_then(|a| a.get(&id).copied());
        if let Some(known) = known {
            return known;
        }
        let revoked = matches!(
            v.verify_client_cert(cert, &[], UnixTime::now()),
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Revoked
            ))
        );
        if let Ok(mut a) = self.answers.lock() {
            if a.len() >= MAX_ANSWERS {
                a.clear();
            }
            a.insert(id, revoked);
        }
        revoked
    }

    /// Whether a `crl` file is configured (and so reloaded).
    pub fn watched(&self) -> bool {
        self.path.is_some()
    }
}
