//! Node identity and data-plane security: the cluster's security
//! mode, the certificate files it is configured with, and what is loaded
//! from them once at start ([`NodeIdentity`]: this node's id, rustls
//! configurations for both ends of a mutual-TLS connection, the PEM bytes
//! tonic needs for the gRPC channels).
//!
//! Who a certificate names is a URI subject alternative name
//! `kvfabric://<role>/<name>` ([`Principal`]), signed by the cluster CA that
//! `kvfabric certs init` makes: a node (`kvfabric://node/<id>`), an
//! operator's tool or a tenant's client. Only node certificates are members:
//! the internal services and the transfer plane refuse the others. A node
//! certificate also names its own DNS name ([`node_dns_name`]), which a
//! client meaning to reach that node verifies, so no other member can answer
//! for it, and [`SERVER_NAME`], which a tool given only an address verifies.
//!
//! Kept in the transfer crate because it is the lowest crate that needs it
//! (the store's gRPC side reads the same identities through it).

mod capability;
pub mod certs;
mod config;
mod grants;
mod identity;
mod mac;
mod revocation;

pub use capability::{reader_tag, Capability, CapabilityKey, CAPABILITY_BYTES};
pub use config::{SecurityConfig, SecurityMode};
pub use grants::{GrantId, WriteGrants};
pub use identity::{
    node_dns_name, node_id_of, node_uri, principal_of, NodeIdentity, Principal, Role,
    NODE_URI_PREFIX, SERVER_NAME,
};
pub(crate) use mac::{ConnMac, TAG_BYTES};
pub use revocation::{Revocations, RELOAD as REVOCATION_RELOAD};
