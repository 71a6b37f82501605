//! The tcp transport: the default, and the control plane of the others (the
//! hello, notifications, rdma's queue-pair exchange and range checks).
//!
//! - `protocol.rs`: the wire format (request and response headers), pure;
//! - `answer.rs`: what the server answers, decided without I/O;
//! - `server.rs`: the serving side's I/O (accept, hello, one handler per kind);
//! - `client.rs`: the initiating side (connect, sliced batches, notify);
//! - `pool.rs`: the idle connections to one peer, and the batch contract;
//! - `wire.rs`: the block codec on the wire (encoded READ replies) and its
//!   measured speeds; `choice.rs`: per peer, whether to ask for them.

mod answer;
mod choice;
pub(crate) mod client;
pub(crate) mod conn;
mod pool;
pub(crate) mod protocol;
mod server;
mod wire;

pub(crate) use pool::TcpPeer;
pub(crate) use server::accept_loop;
pub(crate) use wire::CodecSpeeds;
