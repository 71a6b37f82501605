//! kvfabric-testkit: what the tests of every crate share, in one dev-only
//! crate, so the libraries ship no test code.
//!
//! - [`testdata`]: a deterministic byte stream, seekable by offset, that two
//!   processes agree on without shipping it.
//! - [`free_port`] and [`EtcdProcess`]: loopback ports outside the ephemeral
//!   range and a real etcd. Both live in `kvfabric-testbed` (the `kvfabric
//!   bench` drivers start etcd and pick ports too); the kit re-exports them so
//!   a test has one place to import from.
//! - [`eventually`]: bounded polling.
//! - feature `engine`: [`engine`], the reference model's path and the model
//!   loaded once per test binary, a forward-pass driver, blocking requests to
//!   a running scheduler, and the real engine behind its HTTP API.
//! - feature `transfer`: [`transfer`], transfer engines, regions holding the
//!   stream, and a spawned peer process.
//! - feature `store`: [`blocks`], a test layout, keys and distinct bytes
//!   per key.
//! - feature `cluster`: [`cluster`], N nodes in this process on loopback
//!   and a tcp proxy a test can freeze or cut.
//! - feature `procs`: [`procs`], real `kvfabric node` and `kvfabric engine`
//!   processes (the binary cargo built beside the test) and a blocking
//!   HTTP client for them.
//! - feature `fabric`: [`fabric`], engines with embedded fabric nodes in this
//!   process on a real etcd.
//! - feature `router`: [`router`], the router on loopback in front of real
//!   engines, and a client for its JSON and SSE answers.
//! - [`metrics`]: reading Prometheus text.
//!
//! A harness that starts the `kvfabric` binary finds it beside the test
//! executable ([`procs::kvfabric_bin`]).

pub mod metrics;
pub mod testdata;

mod poll;

#[cfg(feature = "store")]
pub mod blocks;
#[cfg(feature = "cluster")]
pub mod cluster;
#[cfg(feature = "engine")]
pub mod engine;
#[cfg(feature = "fabric")]
pub mod fabric;
#[cfg(feature = "procs")]
pub mod procs;
#[cfg(feature = "router")]
pub mod router;
#[cfg(feature = "transfer")]
pub mod transfer;

pub use kvfabric_testbed::ports::free_loopback_port;
pub use kvfabric_testbed::EtcdProcess;
pub use poll::eventually;

/// A free loopback port (see [`free_loopback_port`]); panics if none is.
pub fn free_port() -> u16 {
    free_loopback_port().expect("a free loopback port")
}
