//! The planner's sample feed: keeps the miniature simulations off the
//! store's lookup and put paths.
//!
//! The hot path only hashes keys; a sampled lookup (its sampled keys, in
//! prefix order) or put becomes one [`Sample`] pushed into a bounded
//! lock-free queue (`crossbeam`'s `ArrayQueue`, [`QUEUE`] entries). A
//! background thread (the [`Feeder`], owned by the planner, stopped and
//! joined on drop) pops them and runs the mini-caches. A full queue drops
//! the sample and counts it (`kvfabric_planner_dropped_samples_total`):
//! the store never waits for the planner.
//!
//! Samples are popped only under the simulations' lock, by the thread or by
//! a report (which drains what is queued first, so a report right after a
//! burst of lookups sees all of them): the mini-caches see the samples in
//! the order they were pushed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::keys::BlockKey;

/// Queue entries: at 1% sampling, far more than a node's sampled lookups in
/// one [`IDLE`] wait; 64 B each (4 MiB), allocated only with the planner on.
pub(super) const QUEUE: usize = 1 << 16;

/// Samples applied per lock hold by the thread (a report waits for at most this many).
const BATCH: usize = 256;

/// How long the thread sleeps when the queue is empty.
const IDLE: Duration = Duration::from_millis(20);

/// One sampled access. `all_puts` is the store's put count when it was
/// pushed: the simulations size their caches by it as the inline hooks did.
#[derive(Debug)]
pub(super) enum Sample {
    /// A lookup's sampled keys, in prefix order.
    Lookup { keys: Vec<BlockKey>, all_puts: u64 },
    /// A sampled put of `len` bytes.
    Put {
        key: BlockKey,
        len: u64,
        all_puts: u64,
    },
}

/// Pops samples and applies them (implemented by the planner's shared state).
pub(super) trait Drain: Send + Sync + 'static {
    /// Apply at most `max` queued samples under the simulations' lock; how many.
    fn drain(&self, max: usize) -> usize;
}

/// The background thread feeding the simulations; stops and joins on drop.
#[derive(Debug)]
pub(super) struct Feeder {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Feeder {
    /// Start the thread draining `shared`. `None` when the OS refuses a
    /// thread: reports still drain the queue, so the curve stays right,
    /// only later.
    pub fn start<D: Drain>(shared: Arc<D>) -> Option<Feeder> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("kvfabric-planner".into())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    if shared.drain(BATCH) == 0 {
                        std::thread::park_timeout(IDLE);
                    }
                }
            });
        match spawned {
            Ok(handle) => Some(Feeder {
                stop,
                handle: Some(handle),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "capacity planner: no feeder thread; the curve updates on reports only");
                None
            }
        }
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            if h.join().is_err() {
                tracing::warn!("capacity planner feeder thread panicked");
            }
        }
    }
}
