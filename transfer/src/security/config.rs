//! The `security` configuration: a mode per cluster and three PEM files.
//!
//! Secure by default once certificates are configured: with `cert`, `key`
//! and `ca` set and no `mode`, the mode is `authenticate`. Without files the
//! mode is `none` (loopback and trusted test beds only; the node warns at start).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::BadInput;
use crate::TransferError;

/// What the cluster's connections defend against (docs/SECURITY.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecurityMode {
    /// No authentication: anyone who reaches a port is served.
    None,
    /// Mutual TLS on every gRPC channel and at every transfer connection's
    /// start; data-plane payloads travel in the clear with a keyed MAC.
    Authenticate,
    /// As `authenticate`, and the transfer data plane runs inside TLS too.
    Encrypt,
}

impl SecurityMode {
    /// Parse `none`, `authenticate` or `encrypt`.
    pub fn parse(s: &str) -> Result<Self, TransferError> {
        match s {
            "none" => Ok(SecurityMode::None),
            "authenticate" => Ok(SecurityMode::Authenticate),
            "encrypt" => Ok(SecurityMode::Encrypt),
            other => Err(TransferError::InvalidArgument(BadInput::SecurityMode {
                got: other.to_string(),
            })),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SecurityMode::None => "none",
            SecurityMode::Authenticate => "authenticate",
            SecurityMode::Encrypt => "encrypt",
        }
    }
}

/// The `security` section (`[cluster.security]` of a node's config).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecurityConfig {
    /// `none`, `authenticate` or `encrypt`. Default: `authenticate` when
    /// `cert`, `key` and `ca` are set, else `none`.
    pub mode: Option<SecurityMode>,
    /// This node's certificate (PEM), made by `kvfabric certs init`. Default: none.
    pub cert: Option<PathBuf>,
    /// This node's private key (PEM, mode 0600). Default: none.
    pub key: Option<PathBuf>,
    /// The cluster CA certificate (PEM) every peer's certificate must chain to. Default: none.
    pub ca: Option<PathBuf>,
    /// The CA's revocation list (PEM, `kvfabric certs revoke`), re-read every
    /// second: a certificate on it is refused on new and open connections.
    /// Default: none (nothing revoked).
    pub crl: Option<PathBuf>,
}

impl SecurityConfig {
    /// Files of `DIR` as `kvfabric certs init DIR` lays them out for `node`,
    /// its revocation list included.
    pub fn from_dir(dir: &std::path::Path, node: &str, mode: SecurityMode) -> Self {
        SecurityConfig {
            mode: Some(mode),
            cert: Some(dir.join(format!("{node}.crt"))),
            key: Some(dir.join(format!("{node}.key"))),
            ca: Some(dir.join("ca.crt")),
            crl: Some(dir.join("ca.crl")),
        }
    }

    fn files_set(&self) -> bool {
        self.cert.is_some() && self.key.is_some() && self.ca.is_some()
    }

    /// The mode in force (see the module docs).
    pub fn effective_mode(&self) -> SecurityMode {
        self.mode.unwrap_or(if self.files_set() {
            SecurityMode::Authenticate
        } else {
            SecurityMode::None
        })
    }

    /// Refuse a secured mode without its files, or half the files.
    pub fn validate(&self) -> Result<(), TransferError> {
        let some = [&self.cert, &self.key, &self.ca]
            .iter()
            .filter(|p| p.is_some())
            .count();
        if some != 0 && some != 3 {
            return Err(TransferError::InvalidArgument(
                BadInput::SecurityFilesPartial,
            ));
        }
        if self.effective_mode() != SecurityMode::None && !self.files_set() {
            return Err(TransferError::InvalidArgument(
                BadInput::SecurityFilesMissing {
                    mode: self.effective_mode().as_str(),
                },
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_defaults_to_authenticate_once_files_are_set() {
        let none = SecurityConfig::default();
        assert_eq!(none.effective_mode(), SecurityMode::None);
        assert!(none.validate().is_ok());
        let files = SecurityConfig::from_dir("/c".as_ref(), "a", SecurityMode::None);
        let files = SecurityConfig {
            mode: None,
            ..files
        };
        assert_eq!(files.effective_mode(), SecurityMode::Authenticate);
        let bare = SecurityConfig {
            mode: Some(SecurityMode::Encrypt),
            ..SecurityConfig::default()
        };
        assert!(bare.validate().is_err(), "encrypt without files");
        let half = SecurityConfig { ca: None, ..files };
        assert!(half.validate().is_err(), "cert and key without ca");
        let c: SecurityConfig = serde_json::from_str(r#"{"mode":"encrypt"}"#).unwrap();
        assert_eq!(c.mode, Some(SecurityMode::Encrypt));
        assert!(SecurityMode::parse("tls").is_err());
    }
}
