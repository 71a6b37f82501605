//! Node identity and data-plane security: the cluster's security
//! mode, the certificate files it is configured with, and what is loaded
//! from them once at start ([`NodeIdentity`]: this node's id, rustls
//! configurations for both ends of a mutual-TLS connection, the PEM bytes
//! tonic needs for the gRPC channels).
//!
//! A node's id is the one in its certificate: a URI subject alternative name
//! `kvfabric://node/<id>` (see [`node_uri`]), signed by the cluster CA that
//! `kvfabric certs init` makes. Every node certificate also names the DNS
//! name [`SERVER_NAME`], which clients verify, so any member can serve any
//! other; *which* member is on the other end is read from the URI.
//!
//! Kept in the transfer crate because it is the lowest crate that needs it
//! (the store's gRPC side reads the same identities through it).

mod capability;
pub mod certs;
mod config;
mod grants;
mod identity;
mod mac;

pub use capability::{reader_tag, Capability, CapabilityKey, CAPABILITY_BYTES};
pub use config::{SecurityConfig, SecurityMode};
pub use grants::{GrantId, WriteGrants};
pub use identity::{node_id_of, node_uri, NodeIdentity, NODE_URI_PREFIX, SERVER_NAME};
pub(crate) use mac::{ConnMac, TAG_BYTES};
