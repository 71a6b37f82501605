//! The shm transport (peers on the same host): the owner checks every range of
//! a batch over a Unix socket and hands out segment memfds with SCM_RIGHTS; the
//! initiator maps them once and then each op is one memcpy.
//!
//! The range check is one round trip per batch and is done by the segment's
//! owner, so a segment unregistered there is refused even if it is still mapped
//! here.
//!
//! Each batch checks out its own link (one socket) from the peer's pool, so
//! concurrent batches to one peer run in parallel; the links to one peer
//! process share its mapped segments (a segment id is never reused by its
//! owner, and a restarted owner gets a new socket name, hence a new pool).
//!
//! - `wire.rs`: message kinds and status bytes;
//! - `fds.rs`: passing memfds over the socket;
//! - `server.rs`: the owner's side;
//! - `link.rs`: the initiator's links and the copy;
//! - `pool.rs`: the links to one peer, and the batch contract.

mod fds;
mod link;
mod pool;
mod server;
mod wire;

pub(crate) use pool::ShmPeer;
pub(crate) use server::{accept_loop, bind, socket_name};
