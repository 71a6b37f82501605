//! The idle links a transport keeps to one peer between batches, shared by
//! tcp, shm and rdma: at most `idle_connections_per_peer` of them, each
//! closed once it has sat unused for `idle_timeout_ms`.
//!
//! Why both bounds: a batch checks out up to `connections_per_peer` links,
//! so `c` concurrent batches to one peer need `c` times that. Keeping only
//! `connections_per_peer` idle made every round of concurrent batches open
//! and close the rest (`bench cluster`'s batched remote get at concurrency
//! 4 loses ~10% to the churn); keeping every peak forever holds a burst's
//! sockets for the life of the process (the soak's fd rule fails). The cap
//! bounds what stays open; the timeout gives a burst's extra links back once
//! the burst is over.

use std::time::{Duration, Instant};

use crate::config::TransferConfig;

/// How many idle links a pool keeps, and for how long.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IdleLimits {
    pub cap: usize,
    pub max_age: Duration,
}

impl IdleLimits {
    pub fn of(config: &TransferConfig) -> IdleLimits {
        IdleLimits {
            cap: config.idle_connections_per_peer.max(1),
            max_age: Duration::from_millis(config.idle_timeout_ms),
        }
    }
}

/// Idle links, the most recently returned last.
#[derive(Debug)]
pub(crate) struct Idle<T> {
    links: Vec<(T, Instant)>,
}

impl<T> Default for Idle<T> {
    fn default() -> Self {
        Idle { links: Vec::new() }
    }
}

impl<T> Idle<T> {
    /// A pool holding one link, idle since `now`.
    pub fn holding(link: T, now: Instant) -> Self {
        Idle {
            links: vec![(link, now)],
        }
    }

    /// Idle links now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// Up to `want` links, the most recently used first, and the links that
    /// expired (for the caller to close outside its lock).
    pub fn take(&mut self, want: usize, limits: IdleLimits, now: Instant) -> (Vec<T>, Vec<T>) {
        let expired = self.expire(limits, now);
        let keep = self.links.len().saturating_sub(want);
        let taken = self.links.drain(keep..).rev().map(|(l, _)| l).collect();
        (taken, expired)
    }

    /// Take links back; what no longer fits (over the cap, or expired) is
    /// returned for the caller to close outside its lock.
    pub fn put_back(
        &mut self,
        links: impl IntoIterator<Item = T>,
        limits: IdleLimits,
        now: Instant,
    ) -> Vec<T> {
        self.links.extend(links.into_iter().map(|l| (l, now)));
        let mut closed = self.expire(limits, now);
        // Over the cap: the least recently used go first.
        let over = self.links.len().saturating_sub(limits.cap);
        closed.extend(self.links.drain(..over).map(|(l, _)| l));
        closed
    }

    /// Remove the links idle past the limit and those `closed` says the
    /// peer has closed (for the caller to close outside its lock).
    pub fn sweep(
        &mut self,
        limits: IdleLimits,
        now: Instant,
        mut closed: impl FnMut(&T) -> bool,
    ) -> Vec<T> {
        let mut out = self.expire(limits, now);
        let (gone, open): (Vec<_>, Vec<_>) = std::mem::take(&mut self.links)
            .into_iter()
            .partition(|(l, _)| closed(l));
        self.links = open;
        out.extend(gone.into_iter().map(|(l, _)| l));
        out
    }

    /// Every idle link (the peer may have restarted: close them all).
    pub fn clear(&mut self) -> Vec<T> {
        self.links.drain(..).map(|(l, _)| l).collect()
    }

    /// Remove the links idle for longer than the limit (the oldest are first).
    fn expire(&mut self, limits: IdleLimits, now: Instant) -> Vec<T> {
        let stale = self
            .links
            .iter()
            .take_while(|(_, at)| now.duration_since(*at) > limits.max_age)
            .count();
        self.links.drain(..stale).map(|(l, _)| l).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(cap: usize, ms: u64) -> IdleLimits {
        IdleLimits {
            cap,
            max_age: Duration::from_millis(ms),
        }
    }

    #[test]
    fn concurrent_batches_reuse_links_up_to_the_cap() {
        let (l, t0) = (limits(16, 10_000), Instant::now());
        let mut idle = Idle::default();
        // Four batches of four links each return them: all 16 stay.
        for b in 0..4 {
            assert!(idle.put_back((0..4).map(|i| b * 4 + i), l, t0).is_empty());
        }
        assert_eq!(idle.len(), 16);
        // The next round takes them again: nothing to open, nothing closed.
        for _ in 0..4 {
            let (got, expired) = idle.take(4, l, t0);
            assert_eq!((got.len(), expired.len()), (4, 0));
        }
        // A fifth concurrent batch's links do not fit once all are back.
        let closed = idle.put_back(0..20, l, t0);
        assert_eq!((idle.len(), closed.len()), (16, 4));
        // The least recently returned are the ones closed.
        assert_eq!(closed, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_burst_is_given_back_after_the_timeout() {
        let (l, t0) = (limits(16, 1_000), Instant::now());
        let mut idle = Idle::default();
        assert!(idle.put_back(0..12, l, t0).is_empty());
        // Steady state afterwards uses 2 links; the other 10 age out.
        let later = t0 + Duration::from_millis(1_500);
        let (got, expired) = idle.take(2, l, later);
        assert_eq!((got.len(), expired.len()), (0, 12));
        assert_eq!(idle.len(), 0);
        assert!(idle.put_back([100, 101], l, later).is_empty());
        // Links returned recently are taken most recent first and kept.
        let (got, expired) = idle.take(1, l, later + Duration::from_millis(10));
        assert_eq!((got, expired.len()), (vec![101], 0));
        assert_eq!(idle.clear(), vec![100]);
    }

    #[test]
    fn a_sweep_removes_closed_and_expired_links_and_keeps_the_order() {
        let (l, t0) = (limits(16, 1_000), Instant::now());
        let mut idle = Idle::default();
        assert!(idle.put_back([1, 2], l, t0).is_empty());
        let t1 = t0 + Duration::from_millis(800);
        assert!(idle.put_back([3, 4, 5, 6], l, t1).is_empty());
        // At t0 + 1.5 s links 1, 2 expired; the peer closed 4.
        let mut gone = idle.sweep(l, t0 + Duration::from_millis(1_500), |&x| x == 4);
        gone.sort();
        assert_eq!(gone, vec![1, 2, 4]);
        assert_eq!(idle.clear(), vec![3, 5, 6]);
    }
}
