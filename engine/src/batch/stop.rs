//! Why a running batch stops before its last line: its owner cancelled it,
//! or it ran past its completion window (`expires_at`). Either way the
//! requests already running are dropped (their event receivers with them,
//! which is how the scheduler learns to free their sequences), not only the
//! queued ones; the runner then ends the batch `cancelled` or `expired`
//! with the results it has.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use super::objects::BatchObject;
use crate::clock::unix_now;

/// Why a batch stopped early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    Cancelled,
    Expired,
}

/// The batches cancelled in this process, and a signal each cancel sends to
/// the runner.
#[derive(Debug)]
pub(crate) struct Stops {
    cancelled: Mutex<HashSet<String>>,
    /// Bumped by every cancel: a running batch rechecks whether it is its own.
    signal: watch::Sender<u64>,
}

impl Default for Stops {
    fn default() -> Self {
        Stops {
            cancelled: Mutex::new(HashSet::new()),
            signal: watch::channel(0).0,
        }
    }
}

impl Stops {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.cancelled.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Batch `id` is cancelled: stop it now.
    pub(crate) fn cancel(&self, id: &str) {
        self.set().insert(id.to_owned());
        self.signal.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Batch `id` ended: forget it.
    pub(crate) fn forget(&self, id: &str) {
        self.set().remove(id);
    }

    /// Whether `b` must stop now (cancelled first: a cancel is the owner's word).
    pub(crate) fn check(&self, b: &BatchObject) -> Option<Stop> {
        if self.set().contains(&b.id) {
            return Some(Stop::Cancelled);
        }
        match b.expires_at {
            Some(at) if unix_now() >= at => Some(Stop::Expired),
            _ => None,
        }
    }

    /// Resolves when `b` must stop (never, for a batch without an expiry
    /// that nobody cancels).
    pub(crate) async fn wait(&self, b: &BatchObject) -> Stop {
        let mut rx = self.signal.subscribe();
        loop {
            if let Some(stop) = self.check(b) {
                return stop;
            }
            let deadline = b.expires_at.map(|at| {
                let at = UNIX_EPOCH + Duration::from_secs(at);
                let left = at
                    .duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO);
                tokio::time::Instant::now() + left
            });
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        // The sender lives as long as `self` (so not here): wait on the clock.
                        sleep_until(deadline).await;
                    }
                }
                _ = sleep_until(deadline) => {}
            }
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
