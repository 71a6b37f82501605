//! Real `kvfabric` processes on loopback (feature `procs`), for the
//! workspace's multi-process tests: [`NodeProc`] (a `kvfabric node`),
//! [`EngineProc`] (a `kvfabric engine` with its embedded fabric node, started
//! from [`EngineOptions`]), a minimal blocking HTTP/1.1 client ([`http`]) and
//! the blocks and cluster RPCs the node tests check ([`node`]).
//!
//! The binary is the one `cargo test` built next to the test executable
//! ([`kvfabric_bin`]): `env!("CARGO_BIN_EXE_kvfabric")` exists only in the
//! root package's tests, and a harness here serves them without each test
//! passing the path in.

mod command;
pub mod engine;
pub mod http;
pub mod node;
mod response;

pub use command::{
    certs_init, certs_init_with, identity, kvfabric_bin, kvfabric_command, log_tail, tls_flags,
};
pub use engine::{EngineOptions, EngineProc};
pub use http::{get_json, get_ok, get_ok_as, http, http_with_key, metric, metric_as};
pub use node::NodeProc;
pub use response::parse_response;
