//! kvfabric-testbed: many hosts on one machine.
//!
//! Every cross-node figure measured on one host goes through shared memory:
//! two processes on one kernel pick the shm transport. Users run kvfabric
//! across hosts, over links slower than memory. This crate makes such hosts
//! out of Linux network namespaces, so tests and benches can run the fabric
//! over real TCP on links of a chosen rate:
//!
//! - [`Testbed::up`] makes N namespaces (`<name>-h0`, `<name>-h1`, ...), each
//!   with one veth link (`eth0`, 10.203.0.(i+2)/24) to a bridge that lives in
//!   a namespace of its own (`<name>-br`). Nothing is added to the caller's
//!   namespace: the addresses exist only inside the test bed.
//! - [`Host::shape`] puts a tbf on both ends of a host's link (`--link-gbit`);
//!   [`Host::link_down`] / [`Host::link_up`] partition it.
//! - Work runs inside a host in three ways: [`Host::command`] (`ip netns
//!   exec`: etcd, `kvfabric engine`, ...), [`Host::runtime`] (a tokio runtime
//!   whose every thread has entered the namespace: in-process nodes and
//!   engines) and [`Host::spawn`] (one thread).
//! - Dropping the [`Testbed`] kills what still runs inside its namespaces
//!   and deletes them; [`Testbed::up`] first removes the namespaces of test
//!   beds whose process died without that (a kill -9, a panic in a test
//!   harness that aborts).
//!
//! Abstract Unix sockets are per network namespace, so the shm transport's
//! handshake fails between two hosts and the transfer engine falls back to
//! TCP: tests prove it with the per-transport transfer metrics.
//!
//! Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2;
//! [`TestbedError::Unavailable`] says so where they are missing, and tests
//! skip with that message. netem is not in every kernel, so no latency is
//! added: links have a rate, not a delay.

mod enter;
mod etcd;
mod ip;
mod net;
pub mod ports;
mod procs;
mod sockets;

pub use enter::enter_namespace;
pub use etcd::EtcdProcess;
pub use net::{Host, Testbed, ADDR_PREFIX, NAME_PREFIX};
pub use procs::{fd_kinds, HostProc, ProcStats};
pub use sockets::{tcp_sockets, tcp_summary, TcpSocket};

/// What can go wrong making or driving a test bed.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// Namespaces cannot be made here (not root, no iproute2): skip.
    #[error("network namespaces unavailable: {reason}")]
    Unavailable { reason: String },
    /// An `ip` or `tc` command failed.
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    /// Entering a namespace failed.
    #[error("entering namespace {ns}: {source}")]
    Enter {
        ns: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid test bed argument: {0}")]
    Invalid(String),
}

impl TestbedError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        TestbedError::Io {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, TestbedError>;
