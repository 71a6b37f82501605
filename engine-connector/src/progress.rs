//! [`LoadProgress`]: how far a layer-wise load has come, shared between the
//! load task (which publishes) and the engine's forward pass (which waits
//! for layer `i` before its attention reads the loaded blocks at layer `i`).
//!
//! A load first leases its blocks. If every leased block carries per-layer
//! checksums (see [`crate::trailer`]) the load *streams*: it announces how
//! many blocks it streams, then reads them layer by layer (layer 0 of every
//! block, then layer 1, ...) and publishes each layer once all its bytes
//! are verified. The engine may then plan the sequence into a forward pass
//! at once and only waits per layer, so computing overlaps the transfer.
//!
//! The promise is "these `n` blocks, layer by layer". If a layer of one of
//! them fails (or its holder is late), the promise is broken: the stream is
//! marked failed, the engine discards that step of the sequence and treats
//! the load like a whole-block load whose final count (`done`) is the blocks
//! that did arrive verified in every layer.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

#[derive(Debug, Default)]
struct State {
    /// Blocks being streamed layer by layer (None: not streaming).
    streaming: Option<usize>,
    /// Leading layers verified in every streamed block.
    layers: usize,
    /// The stream broke its promise (a layer failed or arrived too late).
    failed: bool,
    /// Threads in `wait_layer` now.
    waiters: usize,
}

/// Progress of one load, see the module docs.
#[derive(Debug, Default)]
pub struct LoadProgress {
    state: Mutex<State>,
    changed: Condvar,
}

impl LoadProgress {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The load streams `blocks` blocks layer by layer from now on.
    pub fn start_streaming(&self, blocks: usize) {
        self.lock().streaming = Some(blocks);
        self.changed.notify_all();
    }

    /// Layers `0..layers` are verified in every streamed block.
    pub fn layers_ready(&self, layers: usize) {
        let mut s = self.lock();
        s.layers = s.layers.max(layers);
        drop(s);
        self.changed.notify_all();
    }

    /// The stream cannot deliver all its blocks in every layer.
    pub fn fail(&self) {
        self.lock().failed = true;
        self.changed.notify_all();
    }

    /// Whether the load started streaming (even if the stream failed later).
    #[cfg(feature = "fabric")]
    pub(crate) fn started_streaming(&self) -> bool {
        self.lock().streaming.is_some()
    }

    /// Blocks streamed layer by layer, once the load knows (None while it
    /// is leasing, for whole-block loads, and once a stream failed).
    pub fn streaming(&self) -> Option<usize> {
        let s = self.lock();
        if s.failed {
            None
        } else {
            s.streaming
        }
    }

    /// Wait until layer `layer` of every streamed block is verified: true
    /// once it is, false when the stream failed or `deadline` passed first.
    pub fn wait_layer(&self, layer: usize, deadline: Instant) -> bool {
        let mut s = self.lock();
        s.waiters += 1;
        let ready = loop {
            if s.failed || s.streaming.is_none() {
                break false;
            }
            if s.layers > layer {
                break true;
            }
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        };
        s.waiters -= 1;
        ready
    }

    /// Threads waiting in [`Self::wait_layer`] now (a forward pass blocked
    /// on this load; tests use it to see the overlap).
    pub fn waiters(&self) -> usize {
        self.lock().waiters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_waiter_wakes_when_its_layer_is_published() {
        let p = Arc::new(LoadProgress::default());
        assert_eq!(p.streaming(), None);
        p.start_streaming(3);
        assert_eq!(p.streaming(), Some(3));
        let q = p.clone();
        let t =
            std::thread::spawn(move || q.wait_layer(1, Instant::now() + Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        p.layers_ready(1);
        std::thread::sleep(Duration::from_millis(20));
        p.layers_ready(2);
        assert!(t.join().unwrap_or(false));
        assert!(p.wait_layer(0, Instant::now()));
    }

    #[test]
    fn a_failed_or_late_stream_releases_its_waiter_with_false() {
        let p = Arc::new(LoadProgress::default());
        p.start_streaming(2);
        let start = Instant::now();
        assert!(!p.wait_layer(0, start + Duration::from_millis(30)));
        assert!(start.elapsed() >= Duration::from_millis(30));
        let q = p.clone();
        let t =
            std::thread::spawn(move || q.wait_layer(5, Instant::now() + Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        p.fail();
        assert!(!t.join().unwrap_or(true));
        assert_eq!(p.streaming(), None);
    }
}
