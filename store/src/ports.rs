//! Free loopback ports for the processes tests and benches start (etcd,
//! nodes, redis) and for listeners whose port must be known before they bind.
//!
//! Asking the kernel for port 0 and releasing it is racy on a busy test
//! machine: the port comes from the ephemeral range, the same range every
//! outgoing connection draws its local port from, so a client elsewhere in
//! the run can take it before the listener binds ("Address already in use").
//! These ports come from below the ephemeral range instead
//! ([`PORT_RANGE`]), where only another explicit bind can land, from a
//! per-call random start, and are checked free by binding them once.

use std::hash::{BuildHasher, Hasher, RandomState};
use std::net::TcpListener;
use std::ops::Range;

/// Below Linux's default ephemeral range (32768-60999) and above the
/// well-known and most registered service ports.
pub const PORT_RANGE: Range<u16> = 20000..32000;

/// A loopback TCP port that was free a moment ago, outside the ephemeral range.
pub fn free_loopback_port() -> std::io::Result<u16> {
    // A random start (std's per-instance random hash keys), so callers racing
    // in parallel probe from far apart.
    let z = RandomState::new().build_hasher().finish();
    let span = u64::from(PORT_RANGE.end - PORT_RANGE.start);
    for i in 0..span {
        let port = PORT_RANGE.start + ((z.wrapping_add(i)) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
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
}
