//! kvfabric-python: the native module of the `kvfabric` Python package
//! (`kvfabric._native`, built by maturin into one abi3 wheel; the package's
//! Python half is python/kvfabric/, the vLLM connector among it).
//!
//! Files:
//! - `keys.rs`: [`keys::Layout`], [`keys::KeyChain`], `model_fingerprint`,
//!   the block-key chain every engine and node shares.
//! - `client.rs`: [`client::Client`] of one node (lookup, exists, batched
//!   `get_into` / `put` on caller buffers) and [`client::Transfer`], a batch
//!   in flight.
//! - `conn.rs`: a channel to the node and what every call carries.
//! - `wire.rs`: one block between the node's gRPC messages and caller
//!   memory, copied and hashed once.
//! - `segments.rs`: caller memory (buffer protocol, torch tensors,
//!   address + size) held for as long as a batch runs.
//! - `node.rs`: [`node::EmbeddedNode`], a node inside the Python process.
//! - `error.rs`: [`error::PyClientError`] and the Python exceptions.
//!
//! See docs/PYTHON.md.

mod client;
mod conn;
mod error;
mod keys;
mod node;
mod segments;
mod wire;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<keys::Layout>()?;
    m.add_class::<keys::KeyChain>()?;
    m.add_function(wrap_pyfunction!(keys::model_fingerprint, m)?)?;
    m.add_class::<client::Client>()?;
    m.add_class::<client::Transfer>()?;
    m.add_class::<node::EmbeddedNode>()?;
    m.add("KvfabricError", py.get_type::<error::KvfabricError>())?;
    m.add("ConnectError", py.get_type::<error::ConnectError>())?;
    m.add("AuthError", py.get_type::<error::AuthError>())?;
    m.add("NodeError", py.get_type::<error::NodeError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
