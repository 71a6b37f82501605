//! Write grants: in a secured mode a peer may WRITE into this engine's
//! memory only inside a range this engine granted to that peer for a
//! transfer (e.g. "put the prefill's KV here"), until the grant expires or
//! is revoked. Nothing else is writable remotely, so no peer can write into
//! an engine's KV pool unless that engine asked.

use std::time::{Duration, Instant};

use std::sync::Mutex;

/// One granted range.
#[derive(Debug, Clone)]
struct Grant {
    id: u64,
    segment: u64,
    offset: u64,
    len: u64,
    peer: String,
    expires: Instant,
}

/// The grants of one engine.
#[derive(Debug, Default)]
pub struct WriteGrants {
    next: std::sync::atomic::AtomicU64,
    grants: Mutex<Vec<Grant>>,
}

/// Handle of a grant, to revoke it early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantId(pub u64);

impl WriteGrants {
    /// Let `peer` write `segment[offset..offset+len]` for `ttl`.
    pub fn grant(&self, segment: u64, offset: u64, len: u64, peer: &str, ttl: Duration) -> GrantId {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = Instant::now();
        let mut g = self.lock();
        g.retain(|x| x.expires > now);
        g.push(Grant {
            id,
            segment,
            offset,
            len,
            peer: peer.to_string(),
            expires: now + ttl,
        });
        GrantId(id)
    }

    /// End a grant before its expiry.
    pub fn revoke(&self, id: GrantId) {
        self.lock().retain(|g| g.id != id.0);
    }

    /// Whether `peer` may write `segment[offset..offset+len]` now.
    pub fn allows(&self, peer: &str, segment: u64, offset: u64, len: u64) -> bool {
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        let now = Instant::now();
        self.lock().iter().any(|g| {
            g.peer == peer
                && g.segment == segment
                && g.expires > now
                && offset >= g.offset
                && end <= g.offset.saturating_add(g.len)
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Grant>> {
        self.grants.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_allowed_only_inside_a_live_grant_to_that_peer() {
        let w = WriteGrants::default();
        assert!(!w.allows("b", 1, 0, 10), "nothing granted");
        let id = w.grant(1, 4096, 4096, "b", Duration::from_secs(60));
        assert!(w.allows("b", 1, 4096, 4096));
        assert!(!w.allows("c", 1, 4096, 4096), "another peer");
        assert!(!w.allows("b", 1, 4096, 4097), "past the end");
        assert!(!w.allows("b", 2, 4096, 10), "another segment");
        assert!(!w.allows("b", 1, u64::MAX, 2), "overflow");
        w.revoke(id);
        assert!(!w.allows("b", 1, 4096, 4096), "revoked");
        w.grant(1, 0, 10, "b", Duration::ZERO);
        assert!(!w.allows("b", 1, 0, 10), "expired");
    }
}
