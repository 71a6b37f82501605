//! Free loopback ports for the processes tests and benches start (etcd,
//! nodes, redis) and for listeners whose port must be known before they bind.
//! Here, beside the test bed, because the `kvfabric bench` drivers need them
//! too; tests take them through `kvfabric-testkit`.
//!
//! Asking the kernel for port 0 and releasing it is racy on a busy test
//! machine: the port comes from the ephemeral range, the same range every
//! outgoing connection draws its local port from, so a client elsewhere in
//! the run can take it before the listener binds ("Address already in use").
//! These ports come from below the ephemeral range instead
//! ([`PORT_RANGE`]), where only another explicit bind can land, and are
//! checked free by binding them once.
//!
//! A port handed out stays unbound until its user binds it, often a child
//! process that takes a while to start, so a second caller could find it
//! free too. Parallel tests in one process start their nodes concurrently
//! (CI: a node never joined, "timed out after 15s waiting for a to see
//! [a, b, c]"). So the search goes on from one cursor per process, past
//! every port already handed out; each process starts its cursor at a
//! random place, so separate processes probe from far apart.

use std::hash::{BuildHasher, Hasher, RandomState};
use std::net::TcpListener;
use std::ops::Range;
use std::sync::Mutex;

/// Below Linux's default ephemeral range (32768-60999) and above the
/// well-known and most registered service ports.
pub const PORT_RANGE: Range<u16> = 20000..32000;

/// Offset into [`PORT_RANGE`] where this process's next search starts
/// (None until the first call picks a random one).
static CURSOR: Mutex<Option<u64>> = Mutex::new(None);

/// A loopback TCP port that was free a moment ago, outside the ephemeral
/// range, and not handed out before by this process (until the range wraps).
pub fn free_loopback_port() -> std::io::Result<u16> {
    let span = u64::from(PORT_RANGE.end - PORT_RANGE.start);
    let mut cursor = CURSOR.lock().unwrap_or_else(|p| p.into_inner());
    // std's per-instance random hash keys give the random first offset.
    let start = *cursor.get_or_insert_with(|| RandomState::new().build_hasher().finish() % span);
    for i in 0..span {
        let offset = (start + i) % span;
        let port = PORT_RANGE.start + offset as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            *cursor = Some((offset + 1) % span);
            return Ok(port);
        }
    }
    // Everything below the ephemeral range is taken: fall back to the kernel's pick.
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_and_below_the_ephemeral_range() {
        let a = free_loopback_port().expect("port");
        let b = free_loopback_port().expect("port");
        assert!(
            PORT_RANGE.contains(&a) && PORT_RANGE.contains(&b),
            "{a} {b}"
        );
        let held = TcpListener::bind(("127.0.0.1", a)).expect("the port is free");
        // A held port is never handed out.
        for _ in 0..200 {
            assert_ne!(free_loopback_port().expect("port"), a);
        }
        drop(held);
    }

    #[test]
    fn a_port_is_not_handed_out_twice_before_it_is_bound() {
        // Nothing binds these: a search that restarted anywhere but past the
        // ports already given would return one of them again.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..500 {
            let p = free_loopback_port().expect("port");
            assert!(seen.insert(p), "port {p} handed out twice");
        }
    }
}
