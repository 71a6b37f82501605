//! `SlotPool`: a fixed set of reusable GPU-side resources (pinned staging
//! slices, hash slots) shared by concurrent copies. A copy takes what it
//! needs, waiting while none is free, and gives it back when done.

use std::sync::{Condvar, Mutex};

pub(crate) struct SlotPool<T> {
    free: Mutex<Vec<T>>,
    returned: Condvar,
}

impl<T> SlotPool<T> {
    pub(crate) fn new(items: Vec<T>) -> Self {
        SlotPool {
            free: Mutex::new(items),
            returned: Condvar::new(),
        }
    }

    /// Up to `want` items (at least 1), waiting until one is free.
    pub(crate) fn take(&self, want: usize) -> Vec<T> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while free.is_empty() {
            free = self.returned.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        let at = free.len().saturating_sub(want.max(1));
        free.split_off(at)
    }

    /// Return items taken by [`SlotPool::take`].
    pub(crate) fn give_back(&self, mut items: Vec<T>) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        free.append(&mut items);
        drop(free);
        self.returned.notify_all();
    }
}
