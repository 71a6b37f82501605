//! `ChangeFeed`: the store's report of changes to what it holds (a block
//! stored, its fastest tier changed, the block gone), as they happen.
//!
//! The store pushes under its own lock, so the feed's order is the order of
//! the changes; the push is a short append to a vector behind a second,
//! uncontended lock (never taken the other way round). The subscriber (the
//! cluster's directory announcer) takes everything queued in one swap and
//! re-reads the blocks' current state, so repeated changes of one key
//! coalesce into one announcement.

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::keys::BlockKey;

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

/// Changes queued for the subscriber, and a wake-up when the queue fills.
#[derive(Default)]
pub struct ChangeFeed {
    queue: Mutex<Vec<(BlockKey, BlockChange)>>,
    ready: Notify,
}

impl ChangeFeed {
    /// An empty feed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queue one change; wakes the subscriber when the queue was empty.
    pub(crate) fn push(&self, key: BlockKey, change: BlockChange) {
        let mut q = self.queue.lock();
        let was_empty = q.is_empty();
        q.push((key, change));
        drop(q);
        if was_empty {
            self.ready.notify_one();
        }
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
        f.push(BlockKey([1; 32]), BlockChange::Stored);
        f.push(BlockKey([1; 32]), BlockChange::Removed);
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
