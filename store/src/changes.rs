//! `ChangeFeed`: the store's report of changes to what it holds (a block
//! stored, its fastest tier changed, the block gone), as they happen.
//!
//! The store pushes under its own lock, so the feed's order is the order of
//! the changes; the push is a short append to a vector behind a second,
//! uncontended lock (never taken the other way round). The subscriber (the
//! cluster's directory announcer) takes everything queued in one swap and
//! re-reads the blocks' current state, so repeated changes of one key
//! coalesce into one announcement.
//!
//! The same pushes are also published, numbered, to any number of KV-event
//! subscribers ([`ChangeFeed::subscribe`], served as the node's
//! `KvEventService.KvEvents` stream): a bounded broadcast ring of
//! [`KV_EVENT_BUFFER`] events, so a slow subscriber costs the store nothing
//! and, once it is more than that far behind, is told how many it missed
//! (`RecvError::Lagged`) instead of losing them silently.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::tier::Tier;
use parking_lot::Mutex;
use tokio::sync::{broadcast, Notify};

use crate::keys::BlockKey;

/// Events a KV-event subscriber may fall behind before it is told it lagged.
pub const KV_EVENT_BUFFER: usize = 4096;

/// One published change: its number on this node (1, 2, ...; order of the
/// changes), the block, what happened and the block's fastest tier after it
/// (`Unspecified` once removed), and who the block counts to in the tiers'
/// shares (a tenant's name or `shared:<name>`; `None`: nobody, e.g.
/// single-tenant mode or a block only the VRAM tier holds). The node streams
/// a tenant only the events of its own blocks by this field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventRecord {
    pub sequence: u64,
    pub key: BlockKey,
    pub change: BlockChange,
    pub tier: Tier,
    pub owner: Option<Arc<str>>,
}

/// What happened to a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockChange {
    /// Newly stored (a committed put).
    Stored,
    /// Its fastest tier changed (promoted to RAM, or demoted to disk only).
    Tier,
    /// Gone from every tier (evicted or removed).
    Removed,
}

/// Changes queued for the subscriber, and a wake-up when the queue fills;
/// the same changes published to KV-event subscribers.
pub struct ChangeFeed {
    /// False for a feed nobody drains (events only): nothing is queued.
    queued: bool,
    queue: Mutex<Vec<(BlockKey, BlockChange)>>,
    ready: Notify,
    events: broadcast::Sender<KvEventRecord>,
    sequence: AtomicU64,
}

impl Default for ChangeFeed {
    fn default() -> Self {
        ChangeFeed::with_queue(true)
    }
}

impl ChangeFeed {
    /// An empty feed.
    pub fn new() -> Self {
        Self::default()
    }

    /// A feed that only publishes KV events (a node without the cluster's
    /// announcer, which would otherwise drain the queue).
    pub fn events_only() -> Self {
        ChangeFeed::with_queue(false)
    }

    fn with_queue(queued: bool) -> Self {
        ChangeFeed {
            queued,
            queue: Mutex::new(Vec::new()),
            ready: Notify::new(),
            events: broadcast::channel(KV_EVENT_BUFFER).0,
            sequence: AtomicU64::new(0),
        }
    }

    /// Whether any KV-event subscriber listens (what an event needs is
    /// only worked out then).
    pub(crate) fn has_subscribers(&self) -> bool {
        self.events.receiver_count() > 0
    }

    /// Queue one change (`tier`: the block's fastest tier now; `owner`: who
    /// it counts to); wakes the subscriber when the queue was empty, and
    /// publishes it as a KV event. Called under the store's lock, so
    /// sequence numbers follow the changes.
    pub(crate) fn push(
        &self,
        key: BlockKey,
        change: BlockChange,
        tier: Tier,
        owner: Option<Arc<str>>,
    ) {
        if self.has_subscribers() {
            let sequence = self.sequence.fetch_add(1, Ordering::Relaxed) + 1;
            // Err only when every subscriber left meanwhile: nothing to tell.
            let _ = self.events.send(KvEventRecord {
                sequence,
                key,
                change,
                tier,
                owner,
            });
        }
        if !self.queued {
            return;
        }
        let mut q = self.queue.lock();
        let was_empty = q.is_empty();
        q.push((key, change));
        drop(q);
        if was_empty {
            self.ready.notify_one();
        }
    }

    /// A new KV-event subscriber: every change from now on, at most
    /// [`KV_EVENT_BUFFER`] behind (then `Lagged(missed)`).
    pub fn subscribe(&self) -> broadcast::Receiver<KvEventRecord> {
        self.events.subscribe()
    }

    /// Everything queued so far, oldest first.
    pub fn take(&self) -> Vec<(BlockKey, BlockChange)> {
        std::mem::take(&mut *self.queue.lock())
    }

    /// Changes queued now.
    pub fn len(&self) -> usize {
        self.queue.lock().len()
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.lock().is_empty()
    }

    /// Wait until something was queued since the last wake-up (returns at
    /// once when a push came meanwhile).
    pub async fn ready(&self) {
        self.ready.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pushes_come_back_in_order_and_wake_the_subscriber() {
        let f = ChangeFeed::new();
        f.push(BlockKey([1; 32]), BlockChange::Stored, Tier::Ram, None);
        f.push(BlockKey([1; 32]), BlockChange::Removed, Tier::Absent, None);
        // The first push stored a wake-up: this returns at once.
        tokio::time::timeout(std::time::Duration::from_secs(1), f.ready())
            .await
            .expect("woken");
        assert_eq!(
            f.take(),
            vec![
                (BlockKey([1; 32]), BlockChange::Stored),
                (BlockKey([1; 32]), BlockChange::Removed)
            ]
        );
        assert!(f.is_empty());
    }
}
