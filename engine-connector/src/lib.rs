//! kvfabric-connector: what the engine sees of the fabric.
//!
//! The engine's scheduler runs on its own OS thread and must never wait on
//! the network: lookups, loads and saves all run on the node's runtime and
//! report back through handles the scheduler polls between steps.
//! The [`KvConnector`] trait is that boundary, shaped after vLLM's KV
//! connector v1:
//!
//! | here                          | vLLM v1                                   |
//! |-------------------------------|-------------------------------------------|
//! | [`KvConnector::start_lookup`] | `get_num_new_matched_tokens`              |
//! | [`KvConnector::start_load`]   | `update_state_after_alloc` + `start_load_kv` |
//! | [`Pending::wait_layer`]        | `wait_for_layer_load`                     |
//! | [`KvConnector::save`]         | `save_kv_layer` (whole blocks, write-behind) |
//! | [`KvConnector::finished_saves`] | `get_finished` / `wait_for_save`        |
//!
//! The engine's KV pool lives in one shared-memory region ([`KvMemory`]),
//! registered with the node's transfer engine, so remote blocks land straight
//! in engine blocks and saves copy straight out of them. A block being loaded
//! or saved is owned by the connector until the engine hears back; the
//! scheduler keeps it out of every forward pass (loading) or unchanged
//! (saving, the block is pinned by an extra reference).
//!
//! One implementation (feature `fabric`, on by default), `Connector`, over a
//! `Backend`: `FabricConnector` reaches a `ClusterNode` embedded in the
//! engine process (`EmbeddedNode`, the default), `RemoteConnector` a
//! `kvfabric node` in another process through its gRPC CacheService. Those
//! sit on the store and the transfer engine; the engine itself takes this
//! crate without the feature, so it links only the interface above and the
//! shared vocabulary (`kvfabric-types`), and whoever builds the engine (the
//! binary, benches, tests) hands it a [`ConnectFn`] that makes one.

mod config;
#[cfg(feature = "fabric")]
mod connector;
#[cfg(feature = "fabric")]
mod embedded;
mod error;
#[cfg(feature = "fabric")]
mod fabric;
mod metrics;
#[cfg(feature = "fabric")]
mod node_key;
mod progress;
#[cfg(feature = "fabric")]
mod remote;
#[cfg(feature = "fabric")]
mod stream;
#[cfg(feature = "fabric")]
pub mod trailer;

use std::sync::Arc;
use std::time::Duration;

use kvfabric_types::{BlockKey, KvLayout, SharedRegion};

pub use config::{ApiKey, ConnectorConfig};
#[cfg(feature = "fabric")]
pub use connector::{Backend, Connector, LoadBlock, LoadOptions};
#[cfg(feature = "fabric")]
pub use embedded::EmbeddedNode;
pub use error::{ConfigProblem, ConnectorError};
#[cfg(feature = "fabric")]
pub use fabric::{EmbeddedBackend, FabricConnector};
pub use metrics::ConnectorStats;
pub use progress::LoadProgress;
#[cfg(feature = "fabric")]
pub use remote::{RemoteBackend, RemoteConnector};

/// Index of a block in the engine's KV pool.
pub type BlockId = u32;

/// The engine's KV pool as the connector sees it: `blocks` blocks of
/// `layout.block_bytes()` bytes, back to back from offset 0 of `region`.
#[derive(Clone, Debug)]
pub struct KvMemory {
    pub region: Arc<SharedRegion>,
    pub layout: KvLayout,
    pub blocks: usize,
}

impl KvMemory {
    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.layout.block_bytes()
    }

    /// Byte offset of `block` in the region.
    pub fn block_offset(&self, block: BlockId) -> u64 {
        block as u64 * self.block_bytes() as u64
    }
}

/// A computed block handed over for write-behind saving.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaveBlock {
    pub key: BlockKey,
    pub block: BlockId,
    /// Tokens in the block (a full block).
    pub tokens: u32,
    /// The engine's tag (its sequence id), echoed in [`SaveDone`].
    pub tag: u64,
    /// Who the stored block counts to in the node's tier shares: the
    /// request's tenant (its owner name, `kvfabric_tenants::Identity::owner`);
    /// None: nobody (single-tenant mode). An embedded node stores it with
    /// the block; a remote one gets it as the `x-kvfabric-owner` metadata
    /// (honoured for a trusted key).
    pub owner: Option<Arc<str>>,
}

/// A save that ended; the block is the engine's again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaveDone {
    pub key: BlockKey,
    pub block: BlockId,
    pub tag: u64,
    /// The key is in the fabric now (stored by this save, or already present).
    pub stored: bool,
}

/// An in-flight lookup or load of consecutive prefix blocks; it ends with
/// a block count (blocks the fabric holds, or blocks that arrived verified).
///
/// Until a load ends (`try_finish`/`wait` returns Some), the connector may
/// write into every block of the load: the engine must not compute into
/// them, reuse them or free them.
///
/// A load may also *stream* (see [`LoadProgress`]): once
/// [`Pending::streaming`] says `n`, the engine may plan the sequence with
/// those `n` blocks in its table and wait for each layer in the forward
/// pass ([`Pending::wait_layer`]); the blocks are still the connector's
/// until the load ends.
#[derive(Debug)]
pub struct Pending {
    done: crossbeam::channel::Receiver<usize>,
    /// Most blocks the answer can count.
    most: usize,
    /// Layer-wise progress (loads only).
    progress: Option<Arc<LoadProgress>>,
    /// Longest a forward pass waits for this load's layers.
    layer_wait: Duration,
}

/// A lookup in flight: how many leading keys the fabric holds.
pub type PendingLookup = Pending;
/// A load in flight: how many leading blocks arrived verified (the rest
/// must be recomputed).
pub type PendingLoad = Pending;

impl Pending {
    /// An operation over `most` blocks that reports on `done` (for
    /// implementations of [`KvConnector`]).
    pub fn new(done: crossbeam::channel::Receiver<usize>, most: usize) -> Pending {
        Pending {
            done,
            most,
            progress: None,
            layer_wait: Duration::ZERO,
        }
    }

    /// A load that may stream layer by layer through `progress`; the engine
    /// waits at most `layer_wait` per forward pass for its layers.
    pub fn streamed(
        done: crossbeam::channel::Receiver<usize>,
        most: usize,
        progress: Arc<LoadProgress>,
        layer_wait: Duration,
    ) -> Pending {
        Pending {
            done,
            most,
            progress: Some(progress),
            layer_wait,
        }
    }

    /// Blocks this load streams layer by layer (None: not streaming, or
    /// not yet known, or the stream failed; then wait for the end).
    pub fn streaming(&self) -> Option<usize> {
        self.progress
            .as_ref()?
            .streaming()
            .map(|n| n.min(self.most))
    }

    /// Wait until layer `layer` of every streamed block arrived verified:
    /// false when the stream failed or `deadline` passed first (the engine
    /// then discards what it computed from these blocks).
    pub fn wait_layer(&self, layer: usize, deadline: std::time::Instant) -> bool {
        self.progress
            .as_ref()
            .is_some_and(|p| p.wait_layer(layer, deadline))
    }

    /// How long one forward pass may wait for this load's layers in all.
    pub fn layer_wait(&self) -> Duration {
        self.layer_wait
    }

    /// Without waiting: Some(n) once the operation ended.
    pub fn try_finish(&self) -> Option<usize> {
        match self.done.try_recv() {
            Ok(n) => Some(n.min(self.most)),
            Err(crossbeam::channel::TryRecvError::Empty) => None,
            // The task is gone without a report: nothing usable, nothing in flight.
            Err(crossbeam::channel::TryRecvError::Disconnected) => Some(0),
        }
    }

    /// Like [`Self::try_finish`], waiting up to `timeout`.
    pub fn wait(&self, timeout: Duration) -> Option<usize> {
        match self.done.recv_timeout(timeout) {
            Ok(n) => Some(n.min(self.most)),
            Err(crossbeam::channel::RecvTimeoutError::Timeout) => None,
            Err(crossbeam::channel::RecvTimeoutError::Disconnected) => Some(0),
        }
    }
}

/// The engine's view of the fabric. Every method is called from the
/// scheduler thread and returns without waiting on the network, except
/// `flush` (for tests and benches).
pub trait KvConnector: Send + Sync + std::fmt::Debug {
    /// Start asking how many leading `keys` the fabric holds (any node); a
    /// lookup slower than the configured timeout finds 0.
    fn start_lookup(&self, keys: Vec<BlockKey>) -> PendingLookup;
    /// A request is queued behind others: start pulling the blocks of
    /// `keys` the fabric holds on other nodes into this engine's own node,
    /// so the load at admission is local; the copies count to `owner` (the
    /// request's tenant) in the node's tier shares, as its saves do.
    /// Returns at once.
    fn prefetch(&self, keys: &[BlockKey], owner: Option<Arc<str>>);
    /// Start reading `blocks` (key -> engine block, consecutive prefix
    /// blocks in order) into the engine's KV memory, checksums verified.
    fn start_load(&self, blocks: Vec<(BlockKey, BlockId)>) -> PendingLoad;
    /// Queue a computed block for saving; false = dropped under backpressure
    /// (counted; the block was not taken). When true, the block must stay
    /// unchanged until it comes back from [`Self::finished_saves`].
    fn save(&self, block: SaveBlock) -> bool;
    /// Saves that ended since the last call, waiting up to `wait` for the
    /// first one when none has (`Duration::ZERO`: no waiting).
    fn finished_saves(&self, wait: Duration) -> Vec<SaveDone>;
    /// Block until every queued save ended and is visible cluster-wide;
    /// false if `timeout` passed first.
    fn flush(&self, timeout: Duration) -> bool;
    /// The fabric node blocks are saved to (named in transfer params).
    fn holder(&self) -> String;
    /// Counters since start.
    fn stats(&self) -> ConnectorStats;
}

/// How an engine attaches its connector once its KV pool exists: given the
/// pool's memory and the engine's metrics registry, return the connector.
pub type ConnectFn = Box<
    dyn FnOnce(
            KvMemory,
            &mut prometheus_client::registry::Registry,
        ) -> Result<Arc<dyn KvConnector>, ConnectorError>
        + Send,
>;
